#include "packtrain/ensemble/optimizers/sgd.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

namespace packtrain::ensemble {

void SGDOptions::validate() const {
  TORCH_CHECK(lr() >= 0, "SGD: lr must be >= 0, got ", lr());
  TORCH_CHECK(momentum() >= 0, "SGD: momentum must be >= 0, got ", momentum());
  TORCH_CHECK(weight_decay() >= 0, "SGD: weight_decay must be >= 0, got ", weight_decay());
  TORCH_CHECK(!nesterov() || (momentum() > 0 && dampening() == 0),
              "SGD: Nesterov momentum requires momentum > 0 and dampening = 0, got momentum=", momentum(),
              " dampening=", dampening());
}

PackedSGD::PackedSGD(PackedParameters& parameters, SGDOptions options)
    : PackedOptimizer(parameters, (options.validate(), options.lr()), options.weight_decay()), options_(options) {
  if (options_.momentum() != 0) {
    momentum_buffer_ = at::zeros_like(parameters.flat());
    momentum_blocks_ = parameters.blocks(momentum_buffer_);
  }
}

void PackedSGD::reset_state(const at::Tensor& which) {
  at::NoGradGuard no_grad;
  const at::Tensor selection = which.defined() ? checked_selection(which) : at::Tensor();
  if (momentum_buffer_.defined()) clear_members(momentum_buffer_, selection);
  clear_members(step_, selection);
}

void PackedSGD::step() {
  at::NoGradGuard no_grad;
  drop_masked_gradients();
  const at::Tensor active = mask_.to(at::kDouble);
  const at::Tensor neg_lr = column(-scheduled_lr(step_) * active);
  const at::Tensor l2 = options_.weight_decay() != 0 ? column(weight_decay_) : at::Tensor();
  at::Tensor keep, take;
  if (momentum_buffer_.defined()) {
    // torch::optim::SGD starts the buffer as a copy of the first gradient: keep 0 and
    // take 1 on a member's first step, momentum and 1 - dampening after, 1 and 0 frozen.
    const at::Tensor first = step_.eq(0);
    // (float64 operands throughout: where() of two scalars would be float32.)
    const at::Tensor momentum = at::full_like(step_, options_.momentum());
    keep = column(at::where(mask_, at::where(first, 0.0, momentum), 1.0));
    take = column(at::where(first, at::ones_like(step_), 1 - options_.dampening()) * active);
  }
  for (size_t i = 0; i < param_blocks_.size(); ++i) {
    const at::Tensor& p = param_blocks_[i];  // (K, n_i)
    at::Tensor d = grad_blocks_[i];
    if (l2.defined()) d = d.addcmul(p, l2);
    if (momentum_buffer_.defined()) {
      const at::Tensor& buf = momentum_blocks_[i];
      buf.mul_(keep).addcmul_(d, take);
      d = options_.nesterov() ? d.add(buf, options_.momentum()) : buf;
    }
    p.addcmul_(d, neg_lr);
  }
  step_.add_(active);
}

std::vector<std::pair<std::string, at::Tensor>> PackedSGD::state() const {
  auto out = PackedOptimizer::state();
  if (momentum_buffer_.defined()) out.emplace_back("momentum_buffer", momentum_buffer_);
  return out;
}

}  // namespace packtrain::ensemble
