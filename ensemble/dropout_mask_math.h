// Dropout's masks as a pure function, shared by the CPU pass (dropout_mask.cpp) and
// the CUDA kernel (dropout_mask_cuda.cu): whether member m keeps unit j of row r in
// draw d of a run seeded s depends on (s, d, m, r, j) alone — not on the pack the
// member trains in, the rows a data-parallel rank holds, the threads, or the device.
// Counter-based (SplitMix64 keys per row, a 32-bit hash per unit), so no generator
// state is carried and a CUDA graph's replays advance the draw count like any
// other device tensor.
#pragma once

#include "packtrain/base/host_device.h"
#include "packtrain/ensemble/member_seed.h"

#include <cstdint>

namespace packtrain::ensemble::detail {

// The key of one row of one member's mask in one draw: SplitMix64 keyed by the
// seed, then the draw, the member's index in the whole ensemble, the row's index in
// the whole batch.
PACKTRAIN_HOST_DEVICE inline uint64_t dropout_row_key(uint64_t seed, int64_t draw, int64_t member, int64_t row) {
  return member_seed(member_seed(member_seed(seed, draw), member), row);
}

// lowbias32 (C. Wellons' hash prospector): a well-mixed 32-bit bijection made of
// 32-bit multiplies, so a CPU loop over units vectorizes (AVX2 has no 64-bit one).
PACKTRAIN_HOST_DEVICE inline uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// Unit j's 32 random bits in the row keyed `key`: the low half of the key walks a
// Weyl sequence through the bijection (distinct units, distinct inputs), the high
// half salts the result.
PACKTRAIN_HOST_DEVICE inline uint32_t dropout_unit_bits(uint64_t key, int64_t unit) {
  return lowbias32(static_cast<uint32_t>(key) + static_cast<uint32_t>(unit) * 0x9E3779B9u) ^
         static_cast<uint32_t>(key >> 32);
}

// A unit stays when its bits are at most this: keep * 2^32 (exact in double, so the
// host and the device agree to the bit) minus one; probability keep to within 2^-32.
PACKTRAIN_HOST_DEVICE inline uint32_t dropout_keep_limit(double keep) {
  const auto threshold = static_cast<uint64_t>(keep * 4294967296.0);
  return static_cast<uint32_t>(threshold == 0 ? 0 : threshold - 1);
}

// Unit j's mask value in the row keyed `key`: `scale` (1 / keep) where it stays, 0
// where it drops.
template <typename T>
PACKTRAIN_HOST_DEVICE inline T dropout_mask_unit(uint64_t key, uint32_t limit, T scale, int64_t unit) {
  return dropout_unit_bits(key, unit) <= limit ? scale : T(0);
}

// One row of `width` mask values from its key (the CPU's loop; the CUDA kernel
// computes one unit per thread, so neighbouring threads write neighbouring values).
template <typename T>
PACKTRAIN_HOST_DEVICE inline void dropout_mask_row(uint64_t key, uint32_t limit, T scale, int64_t width, T* out) {
  for (int64_t j = 0; j < width; ++j) out[j] = dropout_mask_unit(key, limit, scale, j);
}

}  // namespace packtrain::ensemble::detail
