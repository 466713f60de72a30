// Packed SGD with momentum, dampening, Nesterov and weight decay:
// torch::optim::SGD's update rule applied to all members at once.
#pragma once

#include "packtrain/ensemble/optimizers/packed_optimizer.h"

#include <torch/arg.h>

namespace packtrain::ensemble {

struct SGDOptions {
  /// Example: PackedSGD(model.parameters(), SGDOptions(0.1).momentum(0.9).nesterov(true))
  explicit SGDOptions(double lr) : lr_(lr) {}
  TORCH_ARG(double, lr);
  TORCH_ARG(double, momentum) = 0.0;
  TORCH_ARG(double, dampening) = 0.0;
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(bool, nesterov) = false;

 public:
  // Throws naming the offending field and value.
  void validate() const;
};

class PackedSGD : public PackedOptimizer {
 public:
  PackedSGD(PackedParameters& parameters, SGDOptions options);

  void step() override;
  void reset_state(const at::Tensor& which = {}) override;
  std::vector<std::pair<std::string, at::Tensor>> state() const override;

  const SGDOptions& options() const { return options_; }
  // Flat (N) buffer in the parameters' layout; undefined when momentum == 0.
  const at::Tensor& momentum_buffer() const { return momentum_buffer_; }

 private:
  SGDOptions options_;
  at::Tensor momentum_buffer_;               // (N)
  std::vector<at::Tensor> momentum_blocks_;  // (K, n_i) views
};

}  // namespace packtrain::ensemble
