// Dropout's masks on the CPU: dropout_mask_math.h's function over a whole (K, B, H)
// mask, member rows in parallel (a pure function of its indices: the threads do not
// change a bit). PackedMLP::dropout_noise calls it; the CUDA kernel is
// dropout_mask_cuda.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace packtrain::ensemble::detail {

// noise: contiguous (K, B, H) CPU tensor of a floating dtype, overwritten. keep[k]:
// member k's keep rate. Member k is member first_member + k of the ensemble, row b
// row row_offset + b of the global batch; `draw` counts the draws since `seed`.
void fill_dropout_mask_cpu(const at::Tensor& noise, const std::vector<double>& keep, uint64_t seed, int64_t draw,
                           int64_t first_member, int64_t row_offset);

}  // namespace packtrain::ensemble::detail
