// The packed ensemble's training and evaluation steps as plain functions over
// tensors: what graphs/ captures (runtime/ composes the two). Every tensor they
// write exists before the call (gradients are zeroed in place, never reset), so
// they are safe to capture.
#pragma once

#include "packtrain/ensemble/optimizers/packed_optimizer.h"
#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/ensemble/packed_model.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <string_view>

namespace packtrain::ensemble {

// One training step: gradients zeroed in place, forward, packed loss, backward of
// the sum (so each member's gradient is its own), one optimizer update (mask,
// per-member learning rates and schedule included). Returns the (K) losses, detached.
// Where the model offers fused gradients for the batch (PackedModel::fused_gradients:
// the MLP's CPU step, ensemble/cpu_fused_step.h) they replace autograd's forward and
// backward: the same gradients, one call.
// `after_backward`, when set, runs between the gradients and the update (a
// data-parallel run averages the flat gradient buffer across ranks there).
using GradientHook = std::function<void()>;

// The gradients of `loss` (a scalar) with respect to every parameter, written into
// the flat gradient buffer by one concatenation: backward() into defined gradients
// costs a zeroing pass and an accumulating add per parameter (1 + P graph nodes);
// this is one kernel, and a pass less over the gradients. Parameters the loss does
// not reach get zeros. The steps below use it.
void backward_into_flat_grad(PackedParameters& parameters, const at::Tensor& loss);
at::Tensor packed_train_step(PackedModel& model, PackedOptimizer& optimizer, const at::Tensor& x, const at::Tensor& y,
                             LossKind kind, double min_variance = 1e-6, const GradientHook& after_backward = {});

// Forward without gradients: the (K) per-member mean losses over the batch.
at::Tensor packed_eval_losses(const PackedModel& model, const at::Tensor& x, const at::Tensor& y, LossKind kind,
                              double min_variance = 1e-6);

}  // namespace packtrain::ensemble
