// Fitting and applying a regression ensemble's variance scale
// (runtime/trainers/uncertainty/variance_calibration.h).
#include "packtrain/runtime/trainers/uncertainty/variance_calibration.h"

#include "packtrain/runtime/trainers/ensemble/ensemble_predictions.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <utility>

namespace packtrain::runtime {

double fit_variance_scale(const EnsemblePrediction& p, const at::Tensor& y) {
  TORCH_CHECK(p.mean.defined() && p.variance.defined(), "fit_variance_scale: needs a combined regression prediction");
  const at::Tensor target = y.reshape({-1}).to(at::kDouble);
  TORCH_CHECK(target.size(0) == p.mean.size(0), "fit_variance_scale: ", target.size(0), " targets for ", p.mean.size(0),
              " predicted rows");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (target.size(0) == 0) return nan;
  // d/ds of mean(log(s v) + r²/(s v)) / 2 is zero at s = mean(r²/v).
  const double s = ((target - p.mean).square() / p.variance).mean().item<double>();
  return std::isfinite(s) && s > 0 ? s : nan;
}

EnsemblePrediction scale_variance(EnsemblePrediction p, double scale) {
  TORCH_CHECK(std::isfinite(scale) && scale > 0, "variance scale must be positive and finite, got ", scale);
  TORCH_CHECK(p.mean.defined() && p.member_mean.defined(), "scale_variance: needs a combined regression prediction");
  if (scale == 1) return p;
  const double stretch = std::sqrt(scale);
  p.member_mean = p.mean + stretch * (p.member_mean - p.mean);  // (K, N): the mean broadcasts over members
  // The mean of the stretched members, as combine_members and the mixture functions
  // compute it (equal to the old mean up to rounding), so every statistic agrees.
  p.mean = p.member_mean.index_select(0, at::tensor(p.included, at::kLong)).mean(0);
  if (p.member_variance.defined()) p.member_variance = scale * p.member_variance;
  p.variance = scale * p.variance;
  p.spread = stretch * p.spread;
  return p;
}

}  // namespace packtrain::runtime
