// A float32 rounded to the nearest bfloat16 (ties to even), kept in a float32: what
// c10::BFloat16's conversion computes, branch-free so loops over it vectorize. The
// fused CPU step rounds its operands and results with it where torch.autocast's
// bfloat16 tensors would be rounded (ensemble/precision.h).
#pragma once

#include <bit>
#include <cstdint>

namespace packtrain::ensemble {

[[gnu::always_inline]] inline float round_to_bfloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  return value != value ? value : std::bit_cast<float>(rounded);  // NaN stays NaN
}

}  // namespace packtrain::ensemble
