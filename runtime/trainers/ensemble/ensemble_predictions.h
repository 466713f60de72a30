// What an ensemble predicts and how well: each member's predictions, their uniform
// mixture (mean, variance, spread; class probabilities) and per-member and ensemble
// metrics. EnsembleTrainer::predict fills these; a member-parallel run combines the
// members gathered from its shards with the same functions.
#pragma once

#include "packtrain/runtime/trainers/ensemble/ensemble_trainer_options.h"
#include "packtrain/runtime/trainers/uncertainty/calibration.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

namespace packtrain::runtime {

struct Metrics {
  double rmse = std::numeric_limits<double>::quiet_NaN();      // regression, original units
  double nll = std::numeric_limits<double>::quiet_NaN();       // per point, original units
  double accuracy = std::numeric_limits<double>::quiet_NaN();  // classification
};

struct EnsembleMetrics {
  std::vector<Metrics> members;
  Metrics ensemble;  // the uniform mixture of the usable members (nll: the moment-matched Gaussian's)
  // The mixture's scores and calibration, by head (the other one stays empty).
  RegressionCalibration regression;
  ClassificationCalibration classification;
};

struct EnsemblePrediction {
  std::vector<int64_t> included;  // members the ensemble statistics use
  // Regression, original units.
  at::Tensor member_mean;      // (K, N)
  at::Tensor member_variance;  // (K, N); Gaussian head only
  at::Tensor mean;             // (N) mixture mean
  at::Tensor variance;         // (N) mixture variance (Gaussian: within + between members; mean head: between)
  at::Tensor spread;           // (N) standard deviation of the member means: disagreement
  // Classification.
  at::Tensor member_probabilities;  // (K, N, C)
  at::Tensor probabilities;         // (N, C) mixture
  at::Tensor predicted;             // (N) original label values (float64)
};

// The mixture statistics of members' predictions (`included` members only):
// regression (member_mean, member_variance when Gaussian) -> mean, spread, variance;
// classification (member_probabilities over `classes`) -> probabilities, predicted.
// How predict() combines its members, and how a member-parallel run combines the
// members gathered from all its shards.
EnsemblePrediction combine_members(EnsemblePrediction members, Head head, const std::vector<double>& classes = {});
// Per-member and ensemble metrics of a combined prediction against y (N), original
// units: RMSE and Gaussian NLL, or accuracy and NLL (labels must be in `classes`),
// and the ensemble's calibration (runtime/trainers/uncertainty/calibration.h) at `levels`.
EnsembleMetrics ensemble_metrics(const EnsemblePrediction& prediction, const at::Tensor& y, Head head,
                                 const std::vector<double>& classes = {},
                                 const std::vector<double>& levels = kDefaultIntervalLevels);
// The prediction of members [first, first + count) alone, as their own ensemble
// (their included members, re-indexed; mixture statistics recombined): a sweep's
// configuration, an active-learning run.
EnsemblePrediction member_range(const EnsemblePrediction& p, int64_t first, int64_t count, Head head,
                                const std::vector<double>& classes = {});
// Copies a shard's per-member predictions into rows first_member.. of `all` (made,
// zero-filled, for `members` members at the first call) and its included members.
void place_members(EnsemblePrediction& all, const EnsemblePrediction& shard, int64_t first_member, int64_t members);
// The first row (0-based) whose ensemble prediction is not finite (regression: its
// mean or variance; classification: a class probability); nullopt when all are.
std::optional<int64_t> first_non_finite_row(const EnsemblePrediction& p);

// What one chunk of rows may take while it is predicted: a table of any length is
// predicted (and an acquisition pool scored) chunk by chunk, so memory follows the
// table's own size rather than members x rows x hidden.
inline constexpr double kPredictionChunkBytes = 64.0 * 1024 * 1024;
// Rows per chunk for K members of hidden width H with O outputs: per row, about three
// (K, H) float32 activations at a time and eight (K, O) float64 prediction entries
// (raw outputs, member means and variances, their copies while combined) within
// `budget` bytes; at least 1.
int64_t prediction_chunk_rows(int64_t members, int64_t hidden, int64_t outputs, double budget = kPredictionChunkBytes);
// Predicts x's rows `chunk_rows` at a time with `predict` and hands each chunk's
// prediction to `visit` with the chunk's first row; x (N, I).
void predict_in_chunks(const std::function<EnsemblePrediction(const at::Tensor&)>& predict, const at::Tensor& x,
                       int64_t chunk_rows, const std::function<void(int64_t first_row, EnsemblePrediction)>& visit);
// Chunks' predictions of consecutive rows as one prediction of all of them (as a
// single predict() of every row gives).
EnsemblePrediction concatenate_rows(const std::vector<EnsemblePrediction>& chunks);

// Class indices (N) of labels y in the sorted `classes`; DataError naming the row
// of a label not among them ("<what> data: label 7 (row 3) is not one of ...").
at::Tensor class_indices(const at::Tensor& y, const std::vector<double>& classes, const char* what);

}  // namespace packtrain::runtime
