// The regression ensemble's predictive mixture (runtime/trainers/uncertainty/predictive_distribution.h).
#include "packtrain/runtime/trainers/uncertainty/predictive_distribution.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_predictions.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <numbers>
#include <string>

namespace packtrain::runtime {

namespace {

// The included members' means and standard deviations (K, N), float64; a mean
// head's are zero (point masses).
struct Components {
  at::Tensor mean, sd;
  bool points = false;
};

Components components(const EnsemblePrediction& p) {
  TORCH_CHECK(p.member_mean.defined() && p.member_mean.dim() == 2,
              "the predictive distribution needs a regression prediction: member means (K, N)");
  TORCH_CHECK(!p.included.empty(), "every member diverged: no usable member to predict with");
  const at::Tensor inc = at::tensor(p.included, at::kLong);
  Components c;
  c.mean = p.member_mean.to(at::kDouble).index_select(0, inc);
  c.points = !p.member_variance.defined();
  c.sd = c.points ? at::zeros_like(c.mean) : p.member_variance.to(at::kDouble).index_select(0, inc).clamp_min(0).sqrt();
  return c;
}

at::Tensor as_rows(const at::Tensor& y, int64_t n) {
  const at::Tensor r = y.reshape({-1}).to(at::kDouble);
  TORCH_CHECK(r.size(0) == n, "expected ", n, " targets (one per predicted row), got ", r.size(0));
  return r;
}

// Standard normal CDF of (x - mean) / sd per component, a step where sd is 0.
at::Tensor component_cdf(const Components& c, const at::Tensor& x) {
  const at::Tensor z = x - c.mean;  // x broadcasts over members
  const at::Tensor gauss = 0.5 * at::erfc(-z / (c.sd.clamp_min(1e-300) * std::numbers::sqrt2));
  return at::where(c.sd > 0, gauss, (z >= 0).to(at::kDouble));
}

// E|X| for X ~ N(m, s^2): 2 s phi(m / s) + m (2 Phi(m / s) - 1); |m| when s is 0.
at::Tensor abs_moment(const at::Tensor& m, const at::Tensor& s) {
  const at::Tensor safe = s.clamp_min(1e-300);
  const at::Tensor u = m / safe;
  const double inv_sqrt_2pi = 1.0 / std::sqrt(2 * std::numbers::pi);
  const at::Tensor value = 2 * safe * inv_sqrt_2pi * at::exp(-0.5 * u.square()) + m * at::erf(u / std::numbers::sqrt2);
  return at::where(s > 0, value, m.abs());
}

}  // namespace

UncertaintyDecomposition decompose_uncertainty(const EnsemblePrediction& p) {
  const Components c = components(p);
  UncertaintyDecomposition d;
  d.mean = c.mean.mean(0);
  const at::Tensor aleatoric = c.sd.square().mean(0);
  const at::Tensor epistemic = (c.mean - d.mean).square().mean(0);
  d.aleatoric_std = aleatoric.sqrt();
  d.epistemic_std = epistemic.sqrt();
  d.total_std = (aleatoric + epistemic).sqrt();
  return d;
}

at::Tensor mixture_cdf(const EnsemblePrediction& p, const at::Tensor& y) {
  const Components c = components(p);
  return component_cdf(c, as_rows(y, c.mean.size(1))).mean(0);
}

at::Tensor mixture_log_density(const EnsemblePrediction& p, const at::Tensor& y) {
  const Components c = components(p);
  if (c.points) {
    throw UserError(
        "a mean head predicts no variance: its mixture of point masses has no density "
        "(train with --head gaussian for a likelihood)");
  }
  const at::Tensor target = as_rows(y, c.mean.size(1));
  const at::Tensor var = c.sd.square().clamp_min(1e-300);
  const at::Tensor log_pdf = -0.5 * ((target - c.mean).square() / var + var.log() + std::log(2 * std::numbers::pi));
  return at::logsumexp(log_pdf, {0}) - std::log(static_cast<double>(c.mean.size(0)));
}

at::Tensor mixture_quantiles(const EnsemblePrediction& p, const std::vector<double>& probabilities) {
  const Components c = components(p);
  for (double q : probabilities) {
    if (!(q > 0 && q < 1)) {
      throw UserError("quantile probabilities must lie strictly between 0 and 1, got " + std::to_string(q));
    }
  }
  const int64_t N = c.mean.size(1);
  at::Tensor out = at::empty({N, static_cast<int64_t>(probabilities.size())}, at::kDouble);
  // A bracket holding every quantile in (0, 1): 40 sd past every member (the
  // normal CDF underflows to 0 there in float64).
  const at::Tensor lo0 = std::get<0>((c.mean - 40 * c.sd).min(0)), hi0 = std::get<0>((c.mean + 40 * c.sd).max(0));
  for (size_t j = 0; j < probabilities.size(); ++j) {
    at::Tensor lo = lo0.clone(), hi = hi0.clone();
    // Invariant: CDF(hi) >= q (or hi is the top of the bracket); CDF(lo) < q or lo
    // is the bottom. 1100 halvings reach adjacent doubles from any finite bracket;
    // the loop ends as soon as no row's bracket can shrink further.
    for (int it = 0; it < 1100; ++it) {
      const at::Tensor mid = lo + (hi - lo) * 0.5;
      const at::Tensor below = component_cdf(c, mid).mean(0) < probabilities[j];
      const at::Tensor new_lo = at::where(below, mid, lo), new_hi = at::where(below, hi, mid);
      if (new_lo.equal(lo) && new_hi.equal(hi)) break;
      lo = new_lo;
      hi = new_hi;
    }
    out.select(1, static_cast<int64_t>(j)).copy_(hi);
  }
  return out;
}

std::vector<PredictionInterval> central_intervals(const EnsemblePrediction& p, const std::vector<double>& levels) {
  std::vector<double> probabilities;
  for (double level : levels) {
    if (!(level > 0 && level < 1)) {
      throw UserError("interval levels must lie strictly between 0 and 1 (0.9 for a 90% interval), got " +
                      std::to_string(level));
    }
    probabilities.push_back((1 - level) / 2);
    probabilities.push_back((1 + level) / 2);
  }
  const at::Tensor q = mixture_quantiles(p, probabilities);
  std::vector<PredictionInterval> out;
  for (size_t i = 0; i < levels.size(); ++i) {
    out.push_back({levels[i], q.select(1, static_cast<int64_t>(2 * i)), q.select(1, static_cast<int64_t>(2 * i + 1))});
  }
  return out;
}

at::Tensor mixture_crps(const EnsemblePrediction& p, const at::Tensor& y) {
  const Components c = components(p);
  const at::Tensor target = as_rows(y, c.mean.size(1));
  const int64_t K = c.mean.size(0);
  const at::Tensor to_target = abs_moment(target - c.mean, c.sd).mean(0);  // E|X - y|
  const at::Tensor var = c.sd.square();
  at::Tensor between = at::zeros_like(to_target);  // E|X - X'|, one member against all at a time
  for (int64_t k = 0; k < K; ++k) {
    between += abs_moment(c.mean[k] - c.mean, (var[k] + var).sqrt()).sum(0);
  }
  return to_target - 0.5 * between / static_cast<double>(K * K);
}

namespace {
// -sum p log p over the last dimension, 0 log 0 = 0.
at::Tensor entropy(const at::Tensor& probabilities) { return -at::special_xlogy(probabilities, probabilities).sum(-1); }
}  // namespace

ClassUncertaintyDecomposition decompose_class_uncertainty(const EnsemblePrediction& p) {
  TORCH_CHECK(p.member_probabilities.defined() && p.member_probabilities.dim() == 3,
              "the class uncertainty needs a classification prediction: member probabilities (K, N, C)");
  TORCH_CHECK(!p.included.empty(), "every member diverged: no usable member to predict with");
  const at::Tensor members =
      p.member_probabilities.to(at::kDouble).index_select(0, at::tensor(p.included, at::kLong));  // (K, N, C)
  ClassUncertaintyDecomposition d;
  d.entropy = entropy(members.mean(0));
  d.aleatoric = entropy(members).mean(0);
  d.mutual_information = (d.entropy - d.aleatoric).clamp_min(0);  // >= 0 by Jensen; rounding aside
  return d;
}

}  // namespace packtrain::runtime
