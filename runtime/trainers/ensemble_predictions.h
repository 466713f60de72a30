// What an ensemble predicts and how well: each member's predictions, their uniform
// mixture (mean, variance, spread; class probabilities) and per-member and ensemble
// metrics. EnsembleTrainer::predict fills these; a member-parallel run combines the
// members gathered from its shards with the same functions.
#pragma once

#include "packtrain/runtime/trainers/calibration.h"
#include "packtrain/runtime/trainers/ensemble_trainer_options.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
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
// and the ensemble's calibration (runtime/trainers/calibration.h) at `levels`.
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
// Class indices (N) of labels y in the sorted `classes`; DataError naming the row
// of a label not among them ("<what> data: label 7 (row 3) is not one of ...").
at::Tensor class_indices(const at::Tensor& y, const std::vector<double>& classes, const char* what);

}  // namespace packtrain::runtime
