// The packed ensemble's training and evaluation steps as plain functions over
// tensors: what graphs/ captures (runtime/ composes the two). Every tensor they
// write exists before the call (gradients are zeroed in place, never reset), so
// they are safe to capture.
#pragma once

#include "packtrain/base/enum_names.h"

#include "packtrain/ensemble/optimizers/packed_optimizer.h"
#include "packtrain/ensemble/packed_mlp.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <string_view>

namespace packtrain::ensemble {

enum class LossKind {
  kMSE,            // pred (K, B, O) against target (B, O) or (K, B, O)
  kGaussianNLL,    // pred (K, B, 2*O): mean and raw variance per output (gaussian_head)
  kCrossEntropy,   // logits (K, B, C) against class indices (B) or (K, B), int64
};

inline constexpr EnumNames<LossKind, 3> kLossKindNames{
    "loss", {{{LossKind::kMSE, "mse"}, {LossKind::kGaussianNLL, "gaussian-nll"}, {LossKind::kCrossEntropy, "cross-entropy"}}}};
inline std::string_view to_string(LossKind kind) { return kLossKindNames.name(kind); }
// Throws naming the value and the accepted names.
inline LossKind parse_loss_kind(std::string_view name) { return kLossKindNames.parse(name); }

// (K) per-member mean losses of `kind`.
at::Tensor packed_loss(LossKind kind, const at::Tensor& pred, const at::Tensor& target, double min_variance = 1e-6);

// One training step: gradients zeroed in place, forward, packed loss, backward of
// the sum (so each member's gradient is its own), one optimizer update (mask,
// per-member learning rates and schedule included). Returns the (K) losses, detached.
// On CPU the forward and backward run member by member without autograd where
// cpu_fused_step_applies (ensemble/cpu_fused_step.h): the same gradients, one call.
// `after_backward`, when set, runs between the gradients and the update (a
// data-parallel run averages the flat gradient buffer across ranks there).
using GradientHook = std::function<void()>;

// The gradients of `loss` (a scalar) with respect to every parameter, written into
// the flat gradient buffer by one concatenation: backward() into defined gradients
// costs a zeroing pass and an accumulating add per parameter (1 + P graph nodes);
// this is one kernel, and a pass less over the gradients. Parameters the loss does
// not reach get zeros. The steps below use it.
void backward_into_flat_grad(PackedParameters& parameters, const at::Tensor& loss);
at::Tensor packed_train_step(PackedMLP& model, PackedOptimizer& optimizer, const at::Tensor& x,
                             const at::Tensor& y, LossKind kind, double min_variance = 1e-6,
                             const GradientHook& after_backward = {});

// Forward without gradients: the (K) per-member mean losses over the batch.
at::Tensor packed_eval_losses(const PackedMLP& model, const at::Tensor& x, const at::Tensor& y, LossKind kind,
                              double min_variance = 1e-6);

}  // namespace packtrain::ensemble
