// SyntheticWorkload: the regression workload that `packtrain profile` and the
// captured-step benchmarks measure — K MLP regressors (8 inputs, 1 output, ReLU,
// MSE, AdamW lr 1e-3, float32) on a synthetic data set resident on the device,
// trained through EnsembleSteps (captured on a GPU, eager on CPU).
#pragma once

#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/graphs/graph_log.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_steps.h"

#include <torch/arg.h>

#include <memory>
#include <string>

namespace packtrain::runtime {

struct WorkloadOptions {
  /// Example: WorkloadOptions().members(64).hidden(64).batch(128).device(c10::Device("cuda"))
  TORCH_ARG(int64_t, members) = 64;
  TORCH_ARG(int64_t, hidden) = 64;
  TORCH_ARG(int64_t, depth) = 1;
  TORCH_ARG(int64_t, batch) = 128;
  TORCH_ARG(int64_t, inputs) = 8;
  TORCH_ARG(int64_t, rows) = 0;  // training rows; 0: 16 batches
  TORCH_ARG(c10::Device, device) = c10::Device(c10::DeviceType::CPU);
  TORCH_ARG(bool, capture) = true;
  TORCH_ARG(int64_t, unroll) = 1;
  TORCH_ARG(graphs::BatchOrder, order) = graphs::BatchOrder::kShared;
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(ensemble::Precision, precision) = ensemble::Precision::kFP32;  // the pack's arithmetic
  TORCH_ARG(graphs::GraphLog, log) = graphs::log_to_stderr;

 public:
  std::string describe() const;  // "members 64, hidden 64, depth 1, batch 128, 8 inputs, shared order"
};

class SyntheticWorkload {
 public:
  explicit SyntheticWorkload(WorkloadOptions options);
  ~SyntheticWorkload();

  const WorkloadOptions& options() const { return options_; }
  ensemble::PackedMLP& model() { return *model_; }
  ensemble::PackedAdam& optimizer() { return *optimizer_; }
  EnsembleSteps& steps() { return *steps_; }

 private:
  WorkloadOptions options_;
  std::unique_ptr<ensemble::PackedMLP> model_;
  std::unique_ptr<ensemble::PackedAdam> optimizer_;
  std::unique_ptr<EnsembleSteps> steps_;
};

}  // namespace packtrain::runtime
