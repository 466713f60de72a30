#include "ensemble/optimizers/adam.h"

#include "ensemble/optimizers/adam_update.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace packtrain::ensemble {

void AdamOptions::validate() const {
  TORCH_CHECK(lr() >= 0, "Adam: lr must be >= 0, got ", lr());
  TORCH_CHECK(beta1() >= 0 && beta1() < 1, "Adam: beta1 must be in [0, 1), got ", beta1());
  TORCH_CHECK(beta2() >= 0 && beta2() < 1, "Adam: beta2 must be in [0, 1), got ", beta2());
  TORCH_CHECK(eps() >= 0, "Adam: eps must be >= 0, got ", eps());
  TORCH_CHECK(weight_decay() >= 0, "Adam: weight_decay must be >= 0, got ", weight_decay());
}

PackedAdam::PackedAdam(PackedParameters& parameters, AdamOptions options)
    : PackedOptimizer(parameters, (options.validate(), options.lr()), options.weight_decay()),
      options_(options),
      exp_avg_(at::zeros_like(parameters.flat())),
      exp_avg_sq_(at::zeros_like(parameters.flat())),
      exp_avg_blocks_(parameters.blocks(exp_avg_)),
      exp_avg_sq_blocks_(parameters.blocks(exp_avg_sq_)) {}

void PackedAdam::reset_state(const at::Tensor& which) {
  at::NoGradGuard no_grad;
  const at::Tensor selection = which.defined() ? checked_selection(which) : at::Tensor();
  clear_members(exp_avg_, selection);
  clear_members(exp_avg_sq_, selection);
  clear_members(step_, selection);
}

void PackedAdam::step() {
  at::NoGradGuard no_grad;
  const double beta1 = options_.beta1(), beta2 = options_.beta2();

  // torch::optim::Adam(W)'s update with per-member coefficients, (K) in float64;
  // a frozen member's are the identity and its step count does not advance.
  const at::Tensor active = mask_.to(at::kDouble);
  step_.add_(active);
  const at::Tensor steps = step_.clamp_min(1);  // a never-stepped frozen member: no 0/0
  const bool decay = options_.weight_decay() != 0;
  const bool decoupled = decay && options_.decoupled_weight_decay();
  detail::AdamCoefficients c;
  c.active = active;
  const at::Tensor lr = scheduled_lr(step_ - active);
  c.neg_step_size = -(lr / (1 - at::pow(beta1, steps))) * active;
  c.sqrt_bias_correction2 = (1 - at::pow(beta2, steps)).sqrt();
  if (decoupled) c.decay_factor = 1 - lr * weight_decay_ * active;
  if (decay && !decoupled) c.l2 = weight_decay_;

  const bool cpu = parameters_->flat().is_cpu();
  for (size_t i = 0; i < param_blocks_.size(); ++i) {
    const auto update = cpu ? detail::adam_update_cpu : detail::adam_update_tensor_ops;
    update(param_blocks_[i], grad_blocks_[i], exp_avg_blocks_[i], exp_avg_sq_blocks_[i], c, beta1, beta2,
           options_.eps());
  }
}

std::vector<std::pair<std::string, at::Tensor>> PackedAdam::state() const {
  auto out = PackedOptimizer::state();
  out.emplace_back("exp_avg", exp_avg_);
  out.emplace_back("exp_avg_sq", exp_avg_sq_);
  return out;
}

}  // namespace packtrain::ensemble
