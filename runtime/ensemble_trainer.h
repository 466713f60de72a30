// EnsembleTrainer: trains a packed deep ensemble of Gaussian regressors (mean and
// variance heads) on standardized data and reports per-member and ensemble metrics
// in the target's original units. Training runs through EnsembleSteps: captured
// CUDA graphs on a GPU, the same steps eagerly on CPU.
#pragma once

#include "ensemble/packed_mlp.h"
#include "graphs/graph_log.h"
#include "runtime/standardizer.h"

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <functional>
#include <memory>
#include <vector>

namespace packtrain::ensemble {
class PackedAdam;
}
namespace packtrain::runtime {
class EnsembleSteps;
}

namespace packtrain::runtime {

struct EnsembleTrainerOptions {
  /// Example: EnsembleTrainerOptions().members(16).epochs(200).batch_size(64)
  TORCH_ARG(int64_t, members) = 16;
  TORCH_ARG(int64_t, hidden) = 64;
  TORCH_ARG(int64_t, depth) = 2;
  TORCH_ARG(ensemble::Activation, activation) = ensemble::Activation::kReLU;
  TORCH_ARG(int64_t, epochs) = 200;
  TORCH_ARG(int64_t, batch_size) = 64;
  TORCH_ARG(double, lr) = 3e-3;
  TORCH_ARG(double, weight_decay) = 1e-4;
  TORCH_ARG(double, min_variance) = 1e-6;  // floor of the variance head (standardized units)
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(c10::Device, device) = c10::Device(c10::DeviceType::CPU);
  TORCH_ARG(bool, capture) = true;  // CUDA graphs on a GPU (CPU always runs eagerly)
  TORCH_ARG(int64_t, unroll) = 8;   // training steps per graph replay
  TORCH_ARG(graphs::GraphLog, log) = graphs::log_to_stderr;  // capture decisions, fallbacks

 public:
  // Throws naming the offending field and value.
  void validate() const;
};

struct MemberMetrics {
  double rmse = 0;  // original target units
  double nll = 0;   // Gaussian negative log-likelihood per point, original units
};

struct EnsembleMetrics {
  std::vector<MemberMetrics> members;
  MemberMetrics ensemble;  // the uniform mixture, summarized by its mean and variance
};

struct EnsemblePrediction {
  at::Tensor member_mean;      // (K, N) original units
  at::Tensor member_variance;  // (K, N)
  at::Tensor mean;             // (N) mixture mean
  at::Tensor variance;         // (N) mixture variance (spread across and within members)
};

// Called once per epoch with (epoch, mean training loss over members).
using EpochCallback = std::function<void(int64_t epoch, double train_loss)>;

class EnsembleTrainer {
 public:
  explicit EnsembleTrainer(EnsembleTrainerOptions options);
  ~EnsembleTrainer();

  // x (N, I), y (N, 1), CPU float64, original units. Fits the standardizers on
  // them and trains every member for options.epochs() on shuffled mini-batches.
  void fit(const at::Tensor& x, const at::Tensor& y, const EpochCallback& on_epoch = {});
  EnsemblePrediction predict(const at::Tensor& x) const;
  EnsembleMetrics evaluate(const at::Tensor& x, const at::Tensor& y) const;

  const EnsembleTrainerOptions& options() const { return options_; }
  const ensemble::PackedMLP& model() const { return *model_; }
  int64_t steps_taken() const { return steps_taken_; }

 private:
  EnsembleTrainerOptions options_;
  std::unique_ptr<ensemble::PackedMLP> model_;
  std::unique_ptr<ensemble::PackedAdam> optimizer_;
  std::unique_ptr<EnsembleSteps> steps_;
  Standardizer x_scale_, y_scale_;
  int64_t steps_taken_ = 0;
};

}  // namespace packtrain::runtime
