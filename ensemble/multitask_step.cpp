#include "packtrain/ensemble/multitask_step.h"

#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/profiling/nvtx.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace packtrain::ensemble {

namespace {
// (B, T) float mask: true where position t's next token is a real token (never at T-1).
at::Tensor target_mask(const TextBatch& batch, c10::ScalarType dtype) {
  const int64_t T = batch.tokens.size(1);
  const at::Tensor positions = at::arange(T, batch.lengths.options()).view({1, -1});
  return (positions < (batch.lengths - 1).view({-1, 1})).to(dtype);
}
}  // namespace

at::Tensor lm_target_count(const TextBatch& batch) { return (batch.lengths - 1).clamp_min(0).sum(); }

at::Tensor packed_lm_loss(const at::Tensor& logits, const TextBatch& batch) {
  TORCH_CHECK(logits.dim() == 4, "packed_lm_loss: logits must be (K, B, T, V), got ", logits.sizes());
  const int64_t K = logits.size(0), B = logits.size(1), T = logits.size(2);
  TORCH_CHECK(batch.tokens.size(0) == B && batch.tokens.size(1) == T, "packed_lm_loss: tokens ", batch.tokens.sizes(),
              " do not match logits ", logits.sizes());
  TORCH_CHECK(T >= 2, "packed_lm_loss: rows need at least 2 positions, got ", T);
  // Every position's log-probabilities, the last one's masked out: a slice of the
  // logits would make its backward zero-fill and copy a full-size gradient.
  const at::Tensor log_probs = at::log_softmax(logits, 3);
  const at::Tensor next = at::cat({batch.tokens.narrow(1, 1, T - 1), batch.tokens.narrow(1, 0, 1)}, 1);  // (B, T)
  const at::Tensor targets = next.view({1, B, T, 1}).expand({K, B, T, 1});
  const at::Tensor nll = -log_probs.gather(3, targets).squeeze(3);  // (K, B, T)
  const at::Tensor mask = target_mask(batch, logits.scalar_type());
  return (nll * mask).sum({1, 2}) / mask.sum().clamp_min(1);
}

MultiTaskLosses multitask_losses(const PackedTransformer& model, const TextBatch& classification,
                                 const at::Tensor& labels, const TextBatch& language_model,
                                 const at::Tensor& class_weights) {
  PACKTRAIN_NVTX_RANGE("forward");
  const at::Tensor hidden = model.trunk(classification.tokens);
  const bool shared = classification.tokens.is_same(language_model.tokens);
  const at::Tensor lm_hidden = shared ? hidden : model.trunk(language_model.tokens);
  MultiTaskLosses losses;
  losses.classification =
      packed_cross_entropy_loss(model.classify(hidden, classification.lengths), labels, class_weights);
  losses.language_model = packed_lm_loss(model.lm_logits(lm_hidden), language_model);
  return losses;
}

MultiTaskLosses multitask_train_step(PackedTransformer& model, PackedOptimizer& optimizer,
                                     const TextBatch& classification, const at::Tensor& labels,
                                     const TextBatch& language_model, const TaskWeights& weights,
                                     const GradientHook& after_backward) {
  TORCH_CHECK(&optimizer.parameters() == &model.parameters(),
              "multitask_train_step: the optimizer does not hold this model's parameters");
  const MultiTaskLosses losses = multitask_losses(model, classification, labels, language_model, weights.class_weights);
  {
    PACKTRAIN_NVTX_RANGE("backward");
    const at::Tensor total =
        losses.classification * weights.classification + losses.language_model * weights.language_model;
    backward_into_flat_grad(model.parameters(), total.sum());
  }
  if (after_backward) after_backward();
  {
    PACKTRAIN_NVTX_RANGE("optimizer");
    optimizer.step();
  }
  return {losses.classification.detach(), losses.language_model.detach()};
}

}  // namespace packtrain::ensemble
