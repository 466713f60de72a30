// Per-member seeds: member i of a pack built with seed s draws its initial weights
// from its own generator seeded member_seed(s, i), so it does not depend on K.
// The same function keys dropout's counter-based masks (dropout_mask_math.h), on
// the host and in CUDA kernels alike.
#pragma once

#include "packtrain/base/host_device.h"

#include <cstdint>

namespace packtrain::ensemble {

// splitmix64 of (seed, member): the (member + 1)-th output of SplitMix64 started at
// `seed` — distinct, well-mixed 64-bit seeds per member.
PACKTRAIN_HOST_DEVICE constexpr uint64_t member_seed(uint64_t seed, int64_t member) noexcept {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(member) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace packtrain::ensemble
