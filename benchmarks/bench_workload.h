// The regression workload of packtrain_bench's NaiveLoop and PackedEager, shared
// with the peers harness (benchmarks/peers/): K MLPs of 8 inputs, 1 output and
// `depth` hidden layers of width H, ReLU, MSE, AdamW lr 1e-3, float32, seeded
// weights (PackedMLPOptions seed 1) and one fixed batch (seed 7) already on the
// device; the shape grid the benchmarks and the peers table cover; a step's FLOPs.
#pragma once

#include "packtrain/ensemble/packed_mlp.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace packtrain::benchmarks {

inline constexpr int64_t kWorkloadInputs = 8;
inline constexpr int64_t kWorkloadOutputs = 1;
inline constexpr double kWorkloadLr = 1e-3;  // AdamW; the other hyperparameters are ensemble::adamw_options()'s

inline ensemble::PackedMLPOptions workload_options(int64_t members, int64_t hidden, int64_t depth, c10::Device device) {
  return ensemble::PackedMLPOptions(kWorkloadInputs, kWorkloadOutputs)
      .members(members)
      .hidden(hidden)
      .depth(depth)
      .seed(1)
      .device(device);
}

struct FixedBatch {
  at::Tensor x;  // (B, 8)
  at::Tensor y;  // (B, 1)
};

inline FixedBatch fixed_batch(int64_t batch, c10::Device device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor x = at::randn({batch, kWorkloadInputs}, gen);
  at::Tensor y = at::randn({batch, kWorkloadOutputs}, gen);
  return {x.to(device), y.to(device)};
}

// The shapes users train (issue 20): depth x hidden x members at batch 128, less the
// packs whose training state (weights, gradients, two AdamW moments: 16 bytes per
// parameter) exceeds kStateLimitBytes. `packtrain train`'s default shape is depth 2,
// hidden 64.
inline constexpr int64_t kGridDepths[] = {1, 2, 3};
inline constexpr int64_t kGridHiddens[] = {32, 64, 256, 512};
inline constexpr int64_t kGridMembers[] = {1, 8, 64, 512, 4096};
inline constexpr int64_t kGridBatch = 128;
inline constexpr double kStateLimitBytes = 1024.0 * 1024.0 * 1024.0;

// Parameters of one member: weights and biases of every layer.
inline int64_t member_parameters(int64_t hidden, int64_t depth) {
  int64_t total = 0, in = kWorkloadInputs;
  for (int64_t l = 0; l <= depth; ++l) {
    const int64_t out = l < depth ? hidden : kWorkloadOutputs;
    total += in * out + out;
    in = out;
  }
  return total;
}

// Bytes of a pack's training state: weights, gradients and AdamW's two moments, float32.
inline double state_bytes(int64_t members, int64_t hidden, int64_t depth) {
  return 16.0 * static_cast<double>(members) * static_cast<double>(member_parameters(hidden, depth));
}

inline bool within_state_limit(int64_t members, int64_t hidden, int64_t depth) {
  return state_bytes(members, hidden, depth) <= kStateLimitBytes;
}

// FLOPs of one member's step: forward and weight gradients for every layer, input
// gradients for every layer above the first (the inputs need none).
inline double step_flops(int64_t hidden, int64_t depth, int64_t batch) {
  double macs = 0, above_first = 0;
  int64_t in = kWorkloadInputs;
  for (int64_t l = 0; l <= depth; ++l) {
    const int64_t out = l < depth ? hidden : kWorkloadOutputs;
    macs += static_cast<double>(in * out);
    if (l > 0) above_first += static_cast<double>(in * out);
    in = out;
  }
  return 2.0 * static_cast<double>(batch) * (2 * macs + above_first);
}

}  // namespace packtrain::benchmarks
