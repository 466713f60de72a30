#include "packtrain/ensemble/optimizers/packed_optimizer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace packtrain::ensemble {

namespace {
void check_per_member(const char* what, const at::Tensor& t, int64_t K) {
  TORCH_CHECK(t.defined() && t.dim() == 1 && t.size(0) == K, what, " must have one value per member: expected [", K,
              "], got ", t.defined() ? c10::str(t.sizes()) : std::string("undefined"));
}
}  // namespace

PackedOptimizer::PackedOptimizer(PackedParameters& parameters, double lr, double weight_decay)
    : parameters_(&parameters),
      param_blocks_(parameters.blocks(parameters.flat())),
      grad_blocks_(parameters.blocks(parameters.flat_grad())) {
  TORCH_CHECK(parameters.members() > 0, "optimizer: the pack has no members");
  TORCH_CHECK(lr >= 0, "optimizer: learning rate must be >= 0, got ", lr);
  TORCH_CHECK(weight_decay >= 0, "optimizer: weight_decay must be >= 0, got ", weight_decay);
  const auto opts = at::TensorOptions().device(parameters.flat().device());
  const int64_t K = parameters.members();
  lr_ = at::full({K}, lr, opts.dtype(at::kDouble));
  weight_decay_ = at::full({K}, weight_decay, opts.dtype(at::kDouble));
  mask_ = at::ones({K}, opts.dtype(at::kBool));
  step_ = at::zeros({K}, opts.dtype(at::kDouble));
  current_lr_ = lr_.clone();
}

void PackedOptimizer::set_schedule(LrSchedule schedule) {
  schedule.validate();
  schedule_ = schedule;
}

at::Tensor PackedOptimizer::scheduled_lr(const at::Tensor& update_number) {
  if (schedule_.is_constant()) return lr_;
  current_lr_.copy_(lr_ * schedule_.factor(update_number));
  return current_lr_;
}

void PackedOptimizer::set_lr(const at::Tensor& lr) {
  check_per_member("learning rate", lr, members());
  TORCH_CHECK(lr.ge(0).all().item<bool>(), "learning rates must be >= 0, got ", lr);
  lr_.copy_(lr);
}

void PackedOptimizer::set_weight_decay(const at::Tensor& weight_decay) {
  check_per_member("weight decay", weight_decay, members());
  TORCH_CHECK(weight_decay.ge(0).all().item<bool>(), "weight decays must be >= 0, got ", weight_decay);
  weight_decay_.copy_(weight_decay);
}

void PackedOptimizer::set_mask(const at::Tensor& mask) {
  check_per_member("mask", mask, members());
  // From pinned host memory the copy is queued, not waited for (steps that read the
  // mask run after it on the stream).
  mask_.copy_(mask.to(at::kBool), /*non_blocking=*/mask.is_pinned());
}

at::Tensor PackedOptimizer::column(const at::Tensor& per_member) const {
  return per_member.to(parameters_->flat().scalar_type()).view({members(), 1});
}

at::Tensor PackedOptimizer::mask_column() const { return mask_.view({members(), 1}); }

at::Tensor PackedOptimizer::checked_selection(const at::Tensor& which) const {
  check_per_member("member selection", which, members());
  TORCH_CHECK(which.scalar_type() == at::kBool, "member selection must be bool, got ", which.scalar_type());
  return which.to(mask_.device());
}

void PackedOptimizer::clear_members(const at::Tensor& state, const at::Tensor& which) const {
  if (!which.defined()) {
    state.zero_();
    return;
  }
  if (state.dim() == 1 && state.size(0) == members()) {
    state.masked_fill_(which, 0);
    return;
  }
  const at::Tensor selected = which.view({members(), 1});
  for (const at::Tensor& block : parameters_->blocks(state)) block.masked_fill_(selected, 0);
}

void PackedOptimizer::drop_masked_gradients() const {
  const at::Tensor frozen = mask_column().logical_not();
  for (const at::Tensor& g : grad_blocks_) g.masked_fill_(frozen, 0);
}

std::vector<std::pair<std::string, at::Tensor>> PackedOptimizer::state() const {
  return {{"lr", lr_}, {"weight_decay", weight_decay_}, {"mask", mask_}, {"step", step_}};
}

}  // namespace packtrain::ensemble
