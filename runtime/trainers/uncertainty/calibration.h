// How well an ensemble's uncertainty matches what happens: proper scores and
// calibration of its predictive distribution on labelled rows, and a verdict in
// plain words. Regression: RMSE, the Gaussian-mixture NLL, the moment-matched
// Gaussian NLL (what deep-ensemble papers report), CRPS, central-interval coverage
// and width, and the miscalibration area. Classification: accuracy, NLL, Brier
// score, expected calibration error over equal-width confidence bins.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace packtrain::runtime {

struct EnsemblePrediction;  // runtime/trainers/ensemble/ensemble_predictions.h

inline const std::vector<double> kDefaultIntervalLevels{0.5, 0.9, 0.95};
inline constexpr int64_t kDefaultCalibrationPoints = 100;  // the miscalibration area's grid, as uncertainty-toolbox
inline constexpr int64_t kDefaultConfidenceBins = 15;      // ECE's bins, as torchmetrics and Guo et al. (2017)

struct IntervalCoverage {
  double level = 0;       // 0.9: the mixture's central 90% interval
  double coverage = 0;    // fraction of rows whose target lies inside it
  double mean_width = 0;  // original units
};

struct RegressionCalibration {
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  int64_t rows = 0;
  double rmse = kNaN;
  double mixture_nll = kNaN;   // -log of the mixture's density at y, per row (NaN for a mean head)
  double gaussian_nll = kNaN;  // the moment-matched Gaussian's, per row: N(mean, total variance)
  double crps = kNaN;          // of the mixture, per row, original units
  std::vector<IntervalCoverage> intervals;
  // Observed against expected coverage of central intervals at levels 0..1
  // (`expected`, evenly spaced), and the area between that curve and the diagonal.
  std::vector<double> expected, observed;
  double miscalibration_area = kNaN;
};

// `y` (N) against the ensemble's mixture `p` (a regression prediction).
RegressionCalibration regression_calibration(const EnsemblePrediction& p, const at::Tensor& y,
                                             const std::vector<double>& levels = kDefaultIntervalLevels,
                                             int64_t curve_points = kDefaultCalibrationPoints);

struct ConfidenceBin {
  double lower = 0, upper = 0;  // [lower, upper); the last bin also holds confidence 1
  int64_t count = 0;
  double confidence = 0, accuracy = 0;  // means over the bin's rows (0 when empty)
};

struct ClassificationCalibration {
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  int64_t rows = 0;
  double accuracy = kNaN;
  double nll = kNaN;    // -log p(true class), per row
  double brier = kNaN;  // sum over classes of (p_c - [c = y])², per row (0..2)
  double ece = kNaN;    // sum over bins of (count / N) |accuracy - confidence|
  double mean_confidence = kNaN;
  std::vector<ConfidenceBin> bins;  // equal-width bins of the top-class probability
};

// Class probabilities (N, C) against class indices `target` (N, int64).
ClassificationCalibration classification_calibration(const at::Tensor& probabilities, const at::Tensor& target,
                                                     int64_t bins = kDefaultConfidenceBins);

// A few lines a user can act on: "90% intervals cover 86% of 206 test rows:
// over-confident (intervals too narrow)". Differences within two standard errors
// of the coverage (binomial, over `rows`) or 2 points are called calibrated.
std::string calibration_summary(const RegressionCalibration& c, const std::string& rows_name = "rows");
std::string calibration_summary(const ClassificationCalibration& c, const std::string& rows_name = "rows");

}  // namespace packtrain::runtime
