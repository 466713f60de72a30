#include "packtrain/ensemble/packed_loss.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <numbers>

namespace packtrain::ensemble {

namespace {
// Checks a regression target against pred (K, B, O_target) and returns it as
// (1, B, O) or (K, B, O) for broadcasting.
at::Tensor regression_target(const char* loss, const at::Tensor& pred, const at::Tensor& target, int64_t outputs) {
  TORCH_CHECK(pred.dim() == 3, loss, ": prediction must be (K, B, O), got ", pred.sizes());
  TORCH_CHECK(target.defined(), loss, ": target is undefined");
  TORCH_CHECK(pred.device() == target.device(), loss, ": prediction is on ", pred.device(), " but the target is on ",
              target.device());
  TORCH_CHECK(pred.scalar_type() == target.scalar_type(), loss, ": prediction dtype ", pred.scalar_type(),
              " differs from the target's ", target.scalar_type());
  const int64_t K = pred.size(0), B = pred.size(1);
  if (target.dim() == 2) {
    TORCH_CHECK(target.size(0) == B && target.size(1) == outputs, loss, ": shared target must be [", B, ", ", outputs,
                "] for prediction ", pred.sizes(), ", got ", target.sizes());
    return target.unsqueeze(0);
  }
  TORCH_CHECK(target.dim() == 3 && target.size(0) == K && target.size(1) == B && target.size(2) == outputs, loss,
              ": target must be [", B, ", ", outputs, "] shared or [", K, ", ", B, ", ", outputs,
              "] per member for prediction ", pred.sizes(), ", got ", target.sizes());
  return target;
}
}  // namespace

at::Tensor packed_mse_loss(const at::Tensor& pred, const at::Tensor& target) {
  const at::Tensor t = regression_target("packed_mse_loss", pred, target, pred.size(-1));
  return (pred - t).square().mean({1, 2});
}

GaussianPrediction gaussian_head(const at::Tensor& pred, double min_variance) {
  TORCH_CHECK(pred.dim() == 3 && pred.size(2) % 2 == 0,
              "gaussian head: prediction must be (K, B, 2*O) (mean and raw variance), got ", pred.sizes());
  TORCH_CHECK(min_variance >= 0, "gaussian head: min_variance must be >= 0, got ", min_variance);
  const int64_t O = pred.size(2) / 2;
  return {pred.narrow(2, 0, O), at::softplus(pred.narrow(2, O, O)) + min_variance};
}

at::Tensor packed_gaussian_nll_loss(const at::Tensor& pred, const at::Tensor& target, double min_variance) {
  const auto [mean, variance] = gaussian_head(pred, min_variance);
  const at::Tensor t = regression_target("packed_gaussian_nll_loss", mean, target, mean.size(-1));
  const double half_log_2pi = 0.5 * std::log(2 * std::numbers::pi);
  const at::Tensor nll = 0.5 * (variance.log() + (t - mean).square() / variance) + half_log_2pi;
  return nll.mean({1, 2});
}

at::Tensor packed_cross_entropy_loss(const at::Tensor& logits, const at::Tensor& target,
                                     const at::Tensor& class_weights) {
  TORCH_CHECK(logits.dim() == 3, "packed_cross_entropy_loss: logits must be (K, B, C), got ", logits.sizes());
  TORCH_CHECK(target.defined() && target.scalar_type() == at::kLong,
              "packed_cross_entropy_loss: target must be int64 class indices, got ",
              target.defined() ? c10::toString(target.scalar_type()) : "undefined");
  TORCH_CHECK(logits.device() == target.device(), "packed_cross_entropy_loss: logits are on ", logits.device(),
              " but the target is on ", target.device());
  const int64_t K = logits.size(0), B = logits.size(1);
  at::Tensor t;
  if (target.dim() == 1) {
    TORCH_CHECK(target.size(0) == B, "packed_cross_entropy_loss: shared target must be [", B, "] for logits ",
                logits.sizes(), ", got ", target.sizes());
    t = target.unsqueeze(0).expand({K, B});
  } else {
    TORCH_CHECK(target.dim() == 2 && target.size(0) == K && target.size(1) == B,
                "packed_cross_entropy_loss: target must be [", B, "] shared or [", K, ", ", B,
                "] per member for logits ", logits.sizes(), ", got ", target.sizes());
    t = target;
  }
  const at::Tensor log_probs = at::log_softmax(logits, 2);
  const at::Tensor picked = log_probs.gather(2, t.unsqueeze(2)).squeeze(2);  // (K, B)
  if (!class_weights.defined()) return -picked.mean(1);
  TORCH_CHECK(class_weights.dim() == 1 && class_weights.size(0) == logits.size(2),
              "packed_cross_entropy_loss: class_weights must be [", logits.size(2), "], got ", class_weights.sizes());
  return -(picked * class_weights.index_select(0, t.reshape({-1})).view({K, B})).mean(1);
}

at::Tensor packed_loss(LossKind kind, const at::Tensor& pred, const at::Tensor& target, double min_variance) {
  switch (kind) {
    case LossKind::kMSE: return packed_mse_loss(pred, target);
    case LossKind::kGaussianNLL: return packed_gaussian_nll_loss(pred, target, min_variance);
    case LossKind::kCrossEntropy: return packed_cross_entropy_loss(pred, target);
  }
  TORCH_CHECK(false, "unknown loss kind");
}

}  // namespace packtrain::ensemble
