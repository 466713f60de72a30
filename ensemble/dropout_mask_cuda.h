// Dropout's masks on CUDA (dropout_mask_math.h's function, one thread per member
// row): one kernel writes a (K, B, H) mask, a second advances the pack's draw count
// on the device, so a captured step's replays draw fresh masks without the host.
// No ATen here: nvcc compiles the kernels without Torch's headers.
#pragma once

#include <cstdint>

namespace packtrain::ensemble::detail {

// out: contiguous (K, B, H) float (is_double false) or double, on the device.
// keep: K per-member keep rates (double, device). state: {seed, draw} (int64,
// device); the draw count is read, then advanced by one. Member k is member
// first_member + k of the ensemble, row b row row_offset + b of the global batch.
// Returns a cudaError_t value (0: success); `stream` is a cudaStream_t.
int launch_dropout_mask(bool is_double, void* out, int64_t K, int64_t B, int64_t H, const double* keep,
                        int64_t first_member, int64_t row_offset, int64_t* state, void* stream);

}  // namespace packtrain::ensemble::detail
