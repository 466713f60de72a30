#include "ensemble/optimizers/adam.h"

#include "ensemble/optimizers/adam_cpu_kernel.h"

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

  // torch::optim::Adam(W)'s update with per-member coefficients: (K) in float64,
  // then (K, 1) columns in the parameters' dtype (where() of two scalars would be
  // float32: one operand is always a float64 tensor). A frozen member gets the
  // identity: moments and weights scaled by 1 plus 0.
  const at::Tensor active = mask_.to(at::kDouble);
  step_.add_(active);
  const at::Tensor steps = step_.clamp_min(1);  // a never-stepped frozen member: no 0/0
  const at::Tensor bias_correction1 = 1 - at::pow(beta1, steps);
  const at::Tensor bias_correction2 = 1 - at::pow(beta2, steps);
  const bool decay = options_.weight_decay() != 0;
  const bool decoupled = decay && options_.decoupled_weight_decay();

  if (parameters_->flat().is_cpu()) {
    // One pass per block (adam_cpu_kernel.h); frozen rows are skipped there.
    detail::AdamCoefficients c;
    c.active = active;
    c.neg_step_size = -(lr_ / bias_correction1) * active;
    c.sqrt_bias_correction2 = bias_correction2.sqrt();
    if (decoupled) c.decay_factor = 1 - lr_ * weight_decay_ * active;
    if (decay && !decoupled) c.l2 = weight_decay_;
    for (size_t i = 0; i < param_blocks_.size(); ++i) {
      detail::adam_update_cpu(param_blocks_[i], grad_blocks_[i], exp_avg_blocks_[i], exp_avg_sq_blocks_[i], c,
                              beta1, beta2, options_.eps());
    }
    return;
  }

  drop_masked_gradients();
  const at::Tensor keep1 = column(at::where(mask_, at::full_like(step_, beta1), 1.0));
  const at::Tensor keep2 = column(at::where(mask_, at::full_like(step_, beta2), 1.0));
  const at::Tensor take1 = column(active * (1 - beta1));
  const at::Tensor take2 = column(active * (1 - beta2));
  const at::Tensor neg_step_size = column(-(lr_ / bias_correction1) * active);
  const at::Tensor sqrt_bias_correction2 = column(bias_correction2.sqrt());
  const at::Tensor decay_factor = decoupled
                                      ? column(1 - lr_ * weight_decay_ * active)
                                      : at::Tensor();
  const at::Tensor l2 = decay && !decoupled ? column(weight_decay_) : at::Tensor();

  for (size_t i = 0; i < param_blocks_.size(); ++i) {
    const at::Tensor& p = param_blocks_[i];  // (K, n_i)
    at::Tensor grad = grad_blocks_[i];
    if (decay_factor.defined()) p.mul_(decay_factor);  // AdamW: decay the weights
    if (l2.defined()) grad = grad.addcmul(p, l2);       // Adam: L2 in the gradient
    exp_avg_blocks_[i].mul_(keep1).addcmul_(grad, take1);
    exp_avg_sq_blocks_[i].mul_(keep2).addcmul_(grad * take2, grad);
    const at::Tensor denom = (exp_avg_sq_blocks_[i].sqrt() / sqrt_bias_correction2).add_(options_.eps());
    p.addcmul_(exp_avg_blocks_[i] / denom, neg_step_size);
  }
}

}  // namespace packtrain::ensemble
