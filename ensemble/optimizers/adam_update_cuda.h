// Packed Adam on CUDA in two kernels per step instead of ~70 tensor ops: one thread
// per member computes the coefficients (adam_math.h) into a (5, K) table and
// advances the step counts; then one kernel per parameter block applies the update
// in a single pass (frozen members untouched). Launched on the given stream, so a
// captured step records them like any other kernel. No ATen here: nvcc compiles the
// kernels without Torch's headers; adam.cpp passes raw device pointers.
#pragma once

#include <cstdint>

namespace packtrain::ensemble::detail {

// All pointers on the device; `stream` is a cudaStream_t. Return a cudaError_t
// value (0: success) for the caller to check.
int launch_adam_coefficients(int64_t K, const bool* mask, double* step, const double* lr,
                             const double* weight_decay, double beta1, double beta2, bool decay, bool decoupled,
                             double* table, void* stream);

// p, g, m, v: contiguous (K, n) blocks of float (is_double false) or double.
int launch_adam_update(bool is_double, void* p, const void* g, void* m, void* v, int64_t K, int64_t n,
                       const double* table, double beta1, double beta2, double eps, bool decay, bool decoupled,
                       void* stream);

}  // namespace packtrain::ensemble::detail
