// Packed Adam and AdamW: torch::optim::Adam / AdamW's update rules applied to
// all members at once on the (K, P) flat buffers, with per-member learning rate,
// weight decay, mask and step count (bias correction) as device tensors.
#pragma once

#include "packtrain/ensemble/optimizers/packed_optimizer.h"

#include <torch/arg.h>

namespace packtrain::ensemble {

struct AdamOptions {
  /// Example: PackedAdam(model.parameters(), AdamOptions().lr(1e-3).beta2(0.99))
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.999;
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0.0;
  // false: L2 added to the gradient (Adam); true: decoupled, p *= 1 - lr*wd (AdamW).
  TORCH_ARG(bool, decoupled_weight_decay) = false;

 public:
  // Throws naming the offending field and value.
  void validate() const;
};

// AdamW's defaults (decoupled weight decay 1e-2), as torch::optim::AdamWOptions.
/// Example: PackedAdam(model.parameters(), adamw_options().lr(3e-4))
inline AdamOptions adamw_options() { return AdamOptions().weight_decay(1e-2).decoupled_weight_decay(true); }

class PackedAdam : public PackedOptimizer {
 public:
  PackedAdam(PackedParameters& parameters, AdamOptions options);

  void step() override;
  void reset_state(const at::Tensor& which = {}) override;
  std::vector<std::pair<std::string, at::Tensor>> state() const override;

  const AdamOptions& options() const { return options_; }
  // Flat (N) moments in the parameters' layout (PackedParameters::blocks).
  const at::Tensor& exp_avg() const { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const { return exp_avg_sq_; }

 private:
  AdamOptions options_;
  at::Tensor exp_avg_;                         // (N)
  at::Tensor exp_avg_sq_;                      // (N)
  std::vector<at::Tensor> exp_avg_blocks_;     // (K, n_i) views
  std::vector<at::Tensor> exp_avg_sq_blocks_;  // (K, n_i) views
  at::Tensor coefficients_;                    // (5, K) float64: this update's per-member coefficients (adam_math.h)
  std::vector<int64_t> block_numels_;          // n_i per parameter block: the flat CUDA kernel's layout
};

}  // namespace packtrain::ensemble
