#include "packtrain/runtime/trainers/ensemble/ensemble_validation.h"

#include "packtrain/ensemble/packed_loss.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <numbers>

namespace packtrain::runtime {

double ensemble_validation_loss(const at::Tensor& raw, const at::Tensor& y, Head head, double min_variance,
                                const std::vector<int64_t>& members) {
  TORCH_CHECK(!members.empty(), "ensemble_validation_loss: no members");
  const at::Tensor out =
      raw.index_select(0, at::tensor(members, at::TensorOptions().dtype(at::kLong).device(raw.device())))
          .to(at::kDouble);  // (M, N, O)
  const double count = static_cast<double>(members.size());
  if (head == Head::kClassification) {
    const at::Tensor label = y.to(raw.device()).reshape({1, -1, 1}).to(at::kLong).expand({out.size(0), -1, 1});
    // log of the mean probability of the true class, by log-sum-exp over members.
    const at::Tensor log_p = out.log_softmax(-1).gather(-1, label).squeeze(-1);  // (M, N)
    return -(log_p.logsumexp(0) - std::log(count)).mean().item<double>();
  }
  const at::Tensor target = y.to(raw.device(), at::kDouble).reshape({1, -1});  // (1, N)
  if (head == Head::kMean) return (out.squeeze(-1).mean(0) - target.squeeze(0)).square().mean().item<double>();
  const auto g = ensemble::gaussian_head(out, min_variance);
  const at::Tensor mean = g.mean.squeeze(-1), variance = g.variance.squeeze(-1);  // (M, N)
  const at::Tensor log_density =
      -0.5 * (variance.log() + std::log(2 * std::numbers::pi) + (target - mean).square() / variance);
  return -(log_density.logsumexp(0) - std::log(count)).mean().item<double>();
}

}  // namespace packtrain::runtime
