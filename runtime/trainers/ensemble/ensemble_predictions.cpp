// EnsembleTrainer::predict and the mixture statistics and metrics of members'
// predictions (runtime/trainers/ensemble/ensemble_predictions.h).
#include "packtrain/runtime/trainers/ensemble/ensemble_predictions.h"

#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "packtrain/runtime/trainers/uncertainty/variance_calibration.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace packtrain::runtime {

namespace {
double gaussian_nll(const at::Tensor& mean, const at::Tensor& variance, const at::Tensor& y) {
  const double half_log_2pi = 0.5 * std::log(2 * std::numbers::pi);
  const at::Tensor var = variance.clamp_min(1e-12);
  return (0.5 * (var.log() + (y - mean).square() / var) + half_log_2pi).mean().item<double>();
}

double rmse(const at::Tensor& mean, const at::Tensor& y) { return (mean - y).square().mean().sqrt().item<double>(); }
}  // namespace

at::Tensor class_indices(const at::Tensor& y, const std::vector<double>& classes, const char* what) {
  const at::Tensor values = y.reshape({-1}).to(at::kDouble).contiguous();
  at::Tensor index = at::empty({values.size(0)}, at::kLong);
  const auto v = values.accessor<double, 1>();
  auto out = index.accessor<int64_t, 1>();
  for (int64_t r = 0; r < values.size(0); ++r) {
    const auto it = std::lower_bound(classes.begin(), classes.end(), v[r]);
    if (it == classes.end() || *it != v[r]) {
      throw DataError(std::string(what) + " data: label " + std::to_string(v[r]) + " (row " + std::to_string(r + 1) +
                      ") is not one of the " + std::to_string(classes.size()) + " classes seen in training");
    }
    out[r] = it - classes.begin();
  }
  return index;
}

EnsemblePrediction EnsembleTrainer::predict(const at::Tensor& x) const {
  EnsemblePrediction p = predict_uncalibrated(x);
  if (variance_scale_ != 1 && options_.head() != Head::kClassification)
    p = scale_variance(std::move(p), variance_scale_);
  return p;
}

EnsemblePrediction EnsembleTrainer::predict_uncalibrated(const at::Tensor& x) const {
  TORCH_CHECK(model_, "predict: the ensemble has not been trained or loaded");
  if (x.dim() != 2 || x.size(1) != in_features_) {
    throw DataError("the model expects " + std::to_string(in_features_) + " features per row, got data shaped " +
                    c10::str(x.sizes()));
  }
  x_scale_.check_representable(x, "prediction input");
  // Differentiable in x when x requires grad (Bayesian optimization's acquisition
  // gradients, through the Python package); otherwise no autograd graph at all.
  const at::AutoGradMode grad_mode(x.requires_grad());
  return predict_standardized(
      x_scale_.transform(x).to(at::TensorOptions().dtype(at::kFloat).device(options_.device())));
}

EnsemblePrediction EnsembleTrainer::predict_standardized(const at::Tensor& xs) const {
  EnsemblePrediction out;
  for (int64_t k = 0; k < options_.members(); ++k) {
    if (members_[k].usable) out.included.push_back(k);
  }
  if (out.included.empty()) {
    throw UserError(
        "every member diverged (a non-finite loss before any good weights): no usable member to predict with; "
        "train again with a lower learning rate");
  }
  const at::Tensor raw = model_->forward(xs).to(at::kDouble).cpu();  // (K, N, O)
  if (options_.head() == Head::kClassification) {
    out.member_probabilities = raw.softmax(-1);
    return combine_members(std::move(out), options_.head(), classes_);
  }
  const double y_mean = y_scale_.mean.item<double>(), y_std = y_scale_.std.item<double>();
  if (options_.head() == Head::kGaussian) {
    const auto head = ensemble::gaussian_head(raw, options_.min_variance());
    out.member_mean = head.mean.squeeze(2) * y_std + y_mean;  // (K, N)
    out.member_variance = head.variance.squeeze(2) * (y_std * y_std);
  } else {
    out.member_mean = raw.squeeze(2) * y_std + y_mean;
  }
  return combine_members(std::move(out), options_.head());
}

EnsemblePrediction combine_members(EnsemblePrediction p, Head head, const std::vector<double>& classes) {
  TORCH_CHECK(!p.included.empty(), "every member diverged: no usable member to predict with");
  const at::Tensor inc = at::tensor(p.included, at::kLong);
  if (head == Head::kClassification) {
    TORCH_CHECK(
        p.member_probabilities.defined() && p.member_probabilities.size(-1) == static_cast<int64_t>(classes.size()),
        "combine_members: expected member probabilities over ", classes.size(), " classes");
    p.probabilities = p.member_probabilities.index_select(0, inc).mean(0);
    p.predicted = at::tensor(classes, at::kDouble).index_select(0, p.probabilities.argmax(1));
    return p;
  }
  const at::Tensor means = p.member_mean.index_select(0, inc);
  p.mean = means.mean(0);
  p.spread = means.std(0, /*unbiased=*/false);
  const at::Tensor second = p.member_variance.defined()
                                ? (p.member_variance.index_select(0, inc) + means.square()).mean(0)
                                : means.square().mean(0);
  p.variance = (second - p.mean.square()).clamp_min(0);
  return p;
}

namespace {
EnsembleMetrics regression_metrics(const EnsemblePrediction& p, const at::Tensor& y,
                                   const std::vector<double>& levels) {
  EnsembleMetrics m;
  const at::Tensor target = y.reshape({-1}).to(at::kDouble);
  for (int64_t k = 0; k < p.member_mean.size(0); ++k) {
    Metrics r;
    r.rmse = rmse(p.member_mean[k], target);
    if (p.member_variance.defined()) r.nll = gaussian_nll(p.member_mean[k], p.member_variance[k], target);
    m.members.push_back(r);
  }
  m.ensemble.rmse = rmse(p.mean, target);
  m.regression = regression_calibration(p, target, levels);
  m.ensemble.nll = m.regression.gaussian_nll;  // the moment-matched Gaussian's: one computation
  return m;
}
}  // namespace

EnsembleMetrics ensemble_metrics(const EnsemblePrediction& p, const at::Tensor& y, Head head,
                                 const std::vector<double>& classes, const std::vector<double>& levels) {
  if (head != Head::kClassification) return regression_metrics(p, y, levels);
  const at::Tensor target = class_indices(y, classes, "evaluation");
  const auto metrics = [&](const at::Tensor& probs) {
    Metrics r;
    r.accuracy = probs.argmax(1).eq(target).to(at::kDouble).mean().item<double>();
    r.nll = -probs.gather(1, target.unsqueeze(1)).clamp_min(1e-12).log().mean().item<double>();
    return r;
  };
  EnsembleMetrics m;
  for (int64_t k = 0; k < p.member_probabilities.size(0); ++k) m.members.push_back(metrics(p.member_probabilities[k]));
  m.ensemble = metrics(p.probabilities);
  m.classification = classification_calibration(p.probabilities, target);
  return m;
}

EnsemblePrediction member_range(const EnsemblePrediction& p, int64_t first, int64_t count, Head head,
                                const std::vector<double>& classes) {
  EnsemblePrediction out;
  const auto slice = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, first, count) : at::Tensor(); };
  out.member_mean = slice(p.member_mean);
  out.member_variance = slice(p.member_variance);
  out.member_probabilities = slice(p.member_probabilities);
  for (const int64_t k : p.included) {
    if (k >= first && k < first + count) out.included.push_back(k - first);
  }
  if (out.included.empty()) {
    throw std::runtime_error("every member of [" + std::to_string(first) + ", " + std::to_string(first + count) +
                             ") diverged: no usable member to predict with");
  }
  return combine_members(std::move(out), head, classes);
}

void place_members(EnsemblePrediction& all, const EnsemblePrediction& shard, int64_t first_member, int64_t members) {
  const auto place = [&](at::Tensor& into, const at::Tensor& from) {
    if (!from.defined()) return;
    if (!into.defined()) {
      std::vector<int64_t> shape = from.sizes().vec();
      shape[0] = members;
      into = at::zeros(shape, from.options());
    }
    into.narrow(0, first_member, from.size(0)).copy_(from);
  };
  place(all.member_mean, shard.member_mean);
  place(all.member_variance, shard.member_variance);
  place(all.member_probabilities, shard.member_probabilities);
  for (int64_t k : shard.included) all.included.push_back(first_member + k);
  std::sort(all.included.begin(), all.included.end());
}

std::optional<int64_t> first_non_finite_row(const EnsemblePrediction& p) {
  const at::Tensor bad = p.probabilities.defined()
                             ? at::isfinite(p.probabilities).all(1).logical_not()
                             : at::isfinite(p.mean).logical_and(at::isfinite(p.variance)).logical_not();
  if (!bad.any().item<bool>()) return std::nullopt;
  return bad.to(at::kByte).argmax().item<int64_t>();  // the first such row
}

int64_t prediction_chunk_rows(int64_t members, int64_t hidden, int64_t outputs, double budget) {
  const double K = static_cast<double>(std::max<int64_t>(members, 1));
  const double per_row = K * (3.0 * static_cast<double>(hidden) * 4 + 8.0 * static_cast<double>(outputs) * 8);
  return static_cast<int64_t>(std::clamp(std::floor(budget / per_row), 1.0, 1e15));
}

void predict_in_chunks(const std::function<EnsemblePrediction(const at::Tensor&)>& predict, const at::Tensor& x,
                       int64_t chunk_rows, const std::function<void(int64_t, EnsemblePrediction)>& visit) {
  TORCH_CHECK(chunk_rows >= 1, "predict_in_chunks: chunk_rows must be >= 1, got ", chunk_rows);
  for (int64_t first = 0; first < x.size(0); first += chunk_rows) {
    visit(first, predict(x.narrow(0, first, std::min(chunk_rows, x.size(0) - first))));
  }
}

EnsemblePrediction concatenate_rows(const std::vector<EnsemblePrediction>& chunks) {
  TORCH_CHECK(!chunks.empty(), "concatenate_rows: no chunks");
  if (chunks.size() == 1) return chunks.front();
  const auto join = [&](at::Tensor EnsemblePrediction::*field, int64_t dim) {
    if (!(chunks.front().*field).defined()) return at::Tensor();
    std::vector<at::Tensor> parts;
    for (const EnsemblePrediction& c : chunks) parts.push_back(c.*field);
    return at::cat(parts, dim);
  };
  EnsemblePrediction out;
  out.included = chunks.front().included;
  out.member_mean = join(&EnsemblePrediction::member_mean, 1);
  out.member_variance = join(&EnsemblePrediction::member_variance, 1);
  out.mean = join(&EnsemblePrediction::mean, 0);
  out.variance = join(&EnsemblePrediction::variance, 0);
  out.spread = join(&EnsemblePrediction::spread, 0);
  out.member_probabilities = join(&EnsemblePrediction::member_probabilities, 1);
  out.probabilities = join(&EnsemblePrediction::probabilities, 0);
  out.predicted = join(&EnsemblePrediction::predicted, 0);
  return out;
}

}  // namespace packtrain::runtime
