// Proper scores and calibration of an ensemble's predictions (runtime/trainers/uncertainty/calibration.h).
#include "packtrain/runtime/trainers/uncertainty/calibration.h"

#include "packtrain/runtime/trainers/ensemble/ensemble_predictions.h"
#include "packtrain/runtime/trainers/uncertainty/predictive_distribution.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <numbers>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace packtrain::runtime {

namespace {

// The area between a piecewise-linear curve (x, observed) and the diagonal
// (x, x), exact per segment also where the two cross (uncertainty-toolbox's
// miscalibration_area_from_proportions traces the same polygons).
double area_from_diagonal(const std::vector<double>& x, const std::vector<double>& observed) {
  double area = 0;
  for (size_t i = 0; i + 1 < x.size(); ++i) {
    const double dl = observed[i] - x[i], dr = observed[i + 1] - x[i + 1], w = x[i + 1] - x[i];
    if (dl * dr < 0) {
      area += w * (dl * dl + dr * dr) / (2 * (std::abs(dl) + std::abs(dr)));  // two triangles meeting at the crossing
    } else {
      area += w * std::abs(dl + dr) / 2;
    }
  }
  return area;
}

// How far an observed rate may sit from the expected one and still be called
// calibrated: two binomial standard errors over `rows`, at least 2 points.
double tolerance(double p, int64_t rows) {
  return std::max(0.02, 2 * std::sqrt(std::max(p * (1 - p), 0.0) / static_cast<double>(std::max<int64_t>(rows, 1))));
}

std::string verdict(double observed, double expected, int64_t rows, const char* over, const char* under) {
  const double diff = observed - expected, tol = tolerance(expected, rows);
  if (std::abs(diff) <= tol) return fmt::format("calibrated (within ±{:.1f} points, sampling noise)", 100 * tol);
  const char* degree = std::abs(diff) <= 3 * tol ? "slightly " : "";
  return fmt::format("{}{}", degree, diff < 0 ? over : under);
}

// The names of the scores that are not finite.
std::vector<std::string> not_finite(std::initializer_list<std::pair<const char*, double>> scores) {
  std::vector<std::string> out;
  for (const auto& [name, value] : scores) {
    if (!std::isfinite(value)) out.push_back(fmt::format("{} {}", name, value));
  }
  return out;
}

std::string no_verdict(const std::vector<std::string>& non_finite, int64_t rows, const std::string& rows_name) {
  return fmt::format(
      "no calibration verdict: scores on {} {} are not finite ({}): a prediction or a target is NaN "
      "or infinite\n",
      rows, rows_name, fmt::join(non_finite, ", "));
}

}  // namespace

RegressionCalibration regression_calibration(const EnsemblePrediction& p, const at::Tensor& y,
                                             const std::vector<double>& levels, int64_t curve_points) {
  if (curve_points < 2) throw std::invalid_argument("the calibration curve needs at least 2 points");
  const at::Tensor target = y.reshape({-1}).to(at::kDouble);
  const UncertaintyDecomposition d = decompose_uncertainty(p);
  TORCH_CHECK(target.size(0) == d.mean.size(0), "expected ", d.mean.size(0), " targets, got ", target.size(0));
  RegressionCalibration c;
  c.rows = target.size(0);
  c.rmse = (d.mean - target).square().mean().sqrt().item<double>();
  const at::Tensor var = d.total_std.square().clamp_min(1e-300);
  c.gaussian_nll =
      (0.5 * (var.log() + (target - d.mean).square() / var + std::log(2 * std::numbers::pi))).mean().item<double>();
  if (p.member_variance.defined()) c.mixture_nll = -mixture_log_density(p, target).mean().item<double>();
  c.crps = mixture_crps(p, target).mean().item<double>();
  for (const PredictionInterval& i : central_intervals(p, levels)) {
    const at::Tensor inside = (target >= i.lower).logical_and(target <= i.upper);
    c.intervals.push_back(
        {i.level, inside.to(at::kDouble).mean().item<double>(), (i.upper - i.lower).mean().item<double>()});
  }
  // y lies in the mixture's central interval of level l exactly when its PIT value
  // F(y) is within l / 2 of 1/2: one CDF per row gives the whole curve.
  const at::Tensor distance = (mixture_cdf(p, target) - 0.5).abs();
  const at::Tensor expected = at::linspace(0, 1, curve_points, at::kDouble);
  const at::Tensor observed = distance.unsqueeze(0).le((expected / 2).unsqueeze(1)).to(at::kDouble).mean(1);
  c.expected.assign(expected.data_ptr<double>(), expected.data_ptr<double>() + curve_points);
  const at::Tensor obs = observed.contiguous();
  c.observed.assign(obs.data_ptr<double>(), obs.data_ptr<double>() + curve_points);
  c.miscalibration_area = area_from_diagonal(c.expected, c.observed);
  return c;
}

ClassificationCalibration classification_calibration(const at::Tensor& probabilities, const at::Tensor& target,
                                                     int64_t bins) {
  if (bins < 1) throw std::invalid_argument("the calibration error needs at least one bin");
  TORCH_CHECK(probabilities.dim() == 2, "expected class probabilities (N, C), got ", probabilities.sizes());
  const at::Tensor probs = probabilities.to(at::kDouble).cpu();
  const at::Tensor t = target.reshape({-1}).to(at::kLong).cpu();
  TORCH_CHECK(t.size(0) == probs.size(0), "expected ", probs.size(0), " labels, got ", t.size(0));
  ClassificationCalibration c;
  c.rows = t.size(0);
  const auto [confidence, predicted] = probs.max(1);
  const at::Tensor correct = predicted.eq(t).to(at::kDouble);
  c.accuracy = correct.mean().item<double>();
  c.mean_confidence = confidence.mean().item<double>();
  c.nll = -probs.gather(1, t.unsqueeze(1)).clamp_min(1e-300).log().mean().item<double>();
  const at::Tensor onehot = at::zeros_like(probs).scatter_(1, t.unsqueeze(1), 1.0);
  c.brier = (probs - onehot).square().sum(1).mean().item<double>();
  const at::Tensor bin = (confidence * static_cast<double>(bins)).floor().to(at::kLong).clamp(0, bins - 1);
  const at::Tensor count = at::zeros({bins}, at::kDouble).index_add_(0, bin, at::ones_like(confidence));
  const at::Tensor conf_sum = at::zeros({bins}, at::kDouble).index_add_(0, bin, confidence);
  const at::Tensor acc_sum = at::zeros({bins}, at::kDouble).index_add_(0, bin, correct);
  c.ece = 0;
  for (int64_t b = 0; b < bins; ++b) {
    ConfidenceBin cb;
    cb.lower = static_cast<double>(b) / static_cast<double>(bins);
    cb.upper = static_cast<double>(b + 1) / static_cast<double>(bins);
    const double n = count[b].item<double>();
    cb.count = static_cast<int64_t>(n);
    if (n > 0) {
      cb.confidence = conf_sum[b].item<double>() / n;
      cb.accuracy = acc_sum[b].item<double>() / n;
      c.ece += n / static_cast<double>(c.rows) * std::abs(cb.accuracy - cb.confidence);
    }
    c.bins.push_back(cb);
  }
  return c;
}

std::string calibration_summary(const RegressionCalibration& c, const std::string& rows_name) {
  // A verdict over NaN or infinite scores would be a guess: say what is not finite.
  std::vector<std::string> non_finite = not_finite({{"RMSE", c.rmse}, {"NLL", c.gaussian_nll}, {"CRPS", c.crps}});
  for (const IntervalCoverage& i : c.intervals) {
    if (!std::isfinite(i.mean_width)) non_finite.push_back(fmt::format("{:.0f}% interval width", 100 * i.level));
  }
  if (!non_finite.empty()) return no_verdict(non_finite, c.rows, rows_name);
  std::string out;
  for (const IntervalCoverage& i : c.intervals) {
    out += fmt::format("{:.0f}% intervals cover {:.1f}% of {} {} (mean width {:.4g}): {}\n", 100 * i.level,
                       100 * i.coverage, c.rows, rows_name, i.mean_width,
                       verdict(i.coverage, i.level, c.rows, "over-confident: intervals too narrow",
                               "under-confident: intervals too wide"));
  }
  out += fmt::format("miscalibration area {:.4f} (0 = every central interval covers exactly its level; 0.5 at most)\n",
                     c.miscalibration_area);
  return out;
}

std::string calibration_summary(const ClassificationCalibration& c, const std::string& rows_name) {
  const std::vector<std::string> non_finite = not_finite(
      {{"accuracy", c.accuracy}, {"NLL", c.nll}, {"Brier score", c.brier}, {"confidence", c.mean_confidence}});
  if (!non_finite.empty()) return no_verdict(non_finite, c.rows, rows_name);
  return fmt::format(
      "mean confidence {:.1f}%, accuracy {:.1f}% on {} {}: {}\n"
      "expected calibration error {:.4f} over {} equal-width confidence bins\n",
      100 * c.mean_confidence, 100 * c.accuracy, c.rows, rows_name,
      verdict(c.accuracy, c.mean_confidence, c.rows, "over-confident: right less often than it claims",
              "under-confident: right more often than it claims"),
      c.ece, c.bins.size());
}

}  // namespace packtrain::runtime
