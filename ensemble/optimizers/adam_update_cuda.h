// Packed Adam on CUDA in two kernel launches per step instead of ~70 tensor ops:
// one thread per member computes its learning rate (schedule applied, from its
// count of earlier updates) and coefficients (adam_math.h) into a (5, K) table and
// advances its step count; then one kernel over the whole flat buffer applies the
// update in a single pass (frozen members untouched). Launched on the given stream,
// so a captured step records them like any other kernel. No ATen here: nvcc compiles
// the kernels without Torch's headers; adam.cpp passes raw device pointers.
#pragma once

#include "packtrain/ensemble/optimizers/lr_schedule_math.h"

#include <cstdint>

namespace packtrain::ensemble::detail {

// All pointers on the device; `stream` is a cudaStream_t. Return a cudaError_t
// value (0: success) for the caller to check. `base_lr`: each member's base rate;
// `current_lr` receives the scheduled rate of this update.
int launch_adam_coefficients(int64_t K, const bool* mask, double* step, const double* base_lr,
                             const LrScheduleParams& schedule, double* current_lr, const double* weight_decay,
                             double beta1, double beta2, bool decay, bool decoupled, double* table, void* stream);

// The flat layout of a pack (PackedParameters): block b holds K * n[b] scalars,
// member-major, from offset sum_{j<b} K * n[j]. Up to kMaxFlatBlocks blocks go in one
// launch (the kernel's arguments); more take one launch per block.
inline constexpr int kMaxFlatBlocks = 48;

// p, g, m, v: contiguous flat (N) buffers of float (is_double false) or double in
// that layout; `numels`: n[b] for each of `blocks` blocks.
int launch_adam_update_flat(bool is_double, void* p, const void* g, void* m, void* v, int64_t K, const int64_t* numels,
                            int blocks, const double* table, double beta1, double beta2, double eps, bool decay,
                            bool decoupled, void* stream);

}  // namespace packtrain::ensemble::detail
