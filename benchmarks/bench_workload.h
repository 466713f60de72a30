// The regression workload of packtrain_bench's NaiveLoop and PackedEager, shared
// with the peers harness (benchmarks/peers/): K MLPs of 8 inputs, 1 output and
// hidden layers of width H, ReLU, MSE, AdamW lr 1e-3, float32, seeded weights
// (PackedMLPOptions seed 1) and one fixed batch (seed 7) already on the device.
#pragma once

#include "packtrain/ensemble/packed_mlp.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace packtrain::benchmarks {

inline constexpr int64_t kWorkloadInputs = 8;
inline constexpr int64_t kWorkloadOutputs = 1;
inline constexpr double kWorkloadLr = 1e-3;  // AdamW; the other hyperparameters are ensemble::adamw_options()'s

inline ensemble::PackedMLPOptions workload_options(int64_t members, int64_t hidden, int64_t depth,
                                                   c10::Device device) {
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

}  // namespace packtrain::benchmarks
