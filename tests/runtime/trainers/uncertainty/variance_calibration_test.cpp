// Recalibration of a regression ensemble's spread (runtime/trainers/
// variance_calibration.h): the fitted scale is the moment-matched Gaussian NLL's
// minimum, applying it stretches the whole mixture about its mean, and a trainer
// fits it on its validation rows, keeps it through a checkpoint, and refits it to
// the members a sweep keeps. (The scale is also checked against uncertainty-toolbox's
// Gaussian NLL minimized by scipy in python/tests/test_calibration.py.)
#include "packtrain/runtime/trainers/uncertainty/variance_calibration.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "packtrain/runtime/trainers/ensemble/hyperparameter_sweep.h"
#include "packtrain/runtime/trainers/uncertainty/calibration.h"
#include "packtrain/runtime/trainers/uncertainty/predictive_distribution.h"
#include "tests/runtime/trainers/trainer_test_data.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <limits>

namespace packtrain::runtime {
namespace {

using packtrain::testing::all_close;
using packtrain::testing::DeviceTest;
using trainer_testing::Data;
using trainer_testing::make_data;
using trainer_testing::small_options;
namespace fs = std::filesystem;

// K members' Gaussians over N rows, far from calibrated for y.
EnsemblePrediction random_prediction(int64_t K, int64_t N, bool gaussian, at::Tensor* y) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  EnsemblePrediction p;
  p.member_mean = at::randn({K, N}, gen, f64) * 0.5 + 3;
  if (gaussian) p.member_variance = at::rand({K, N}, gen, f64) * 0.4 + 0.05;
  for (int64_t k = 0; k < K; ++k) p.included.push_back(k);
  *y = 3 + 2.5 * at::randn({N}, gen, f64);
  return combine_members(std::move(p), gaussian ? Head::kGaussian : Head::kMean);
}

double gaussian_nll(const EnsemblePrediction& p, const at::Tensor& y) {
  return regression_calibration(p, y).gaussian_nll;
}

TEST(VarianceCalibration, TheFittedScaleMinimizesTheMomentMatchedNll) {
  for (const bool gaussian : {true, false}) {
    at::Tensor y;
    const EnsemblePrediction p = random_prediction(5, 400, gaussian, &y);
    const double s = fit_variance_scale(p, y);
    ASSERT_TRUE(std::isfinite(s) && s > 1) << "the members are too sure of y: " << s;
    const double best = gaussian_nll(scale_variance(p, s), y);
    EXPECT_LT(best, gaussian_nll(p, y));
    for (const double factor : {1.02, 1 / 1.02, 1.5, 1 / 1.5}) {
      EXPECT_LT(best, gaussian_nll(scale_variance(p, s * factor), y)) << "s x " << factor;
    }
    EXPECT_NEAR(fit_variance_scale(scale_variance(p, s), y), 1.0, 1e-12) << "fitted again after scaling";
  }
}

TEST(VarianceCalibration, ScalingStretchesTheMixtureAboutItsMean) {
  at::Tensor y;
  const EnsemblePrediction p = random_prediction(4, 200, true, &y);
  const double s = 2.25, stretch = 1.5;
  const EnsemblePrediction q = scale_variance(p, s);
  EXPECT_TRUE(all_close(q.mean, p.mean, 1e-12));
  EXPECT_TRUE(all_close(q.variance, s * p.variance, 1e-12));
  EXPECT_TRUE(all_close(q.spread, stretch * p.spread, 1e-12));
  // Y' = mean + stretch (Y - mean): CDF, density and quantiles move with it.
  const at::Tensor moved = p.mean + stretch * (y - p.mean);
  EXPECT_TRUE(all_close(mixture_cdf(q, moved), mixture_cdf(p, y), 1e-12));
  EXPECT_TRUE(all_close(mixture_log_density(q, moved), mixture_log_density(p, y) - std::log(stretch), 1e-10));
  const at::Tensor before = mixture_quantiles(p, {0.05, 0.5, 0.9}), after = mixture_quantiles(q, {0.05, 0.5, 0.9});
  EXPECT_TRUE(all_close(after, p.mean.unsqueeze(1) + stretch * (before - p.mean.unsqueeze(1)), 1e-9));
  const UncertaintyDecomposition d = decompose_uncertainty(q), e = decompose_uncertainty(p);
  EXPECT_TRUE(all_close(d.aleatoric_std, stretch * e.aleatoric_std, 1e-12));
  EXPECT_TRUE(all_close(d.epistemic_std, stretch * e.epistemic_std, 1e-12));
  EXPECT_THROW(scale_variance(p, 0.0), c10::Error);
  EXPECT_THROW(scale_variance(p, std::numeric_limits<double>::infinity()), c10::Error);
}

TEST(VarianceCalibration, NoScaleWithoutRowsOrWithAZeroVarianceRowInError) {
  at::Tensor y;
  const EnsemblePrediction p = random_prediction(3, 10, false, &y);
  EnsemblePrediction none;  // no rows
  none.member_mean = at::zeros({3, 0}, at::kDouble);
  none.mean = none.variance = at::zeros({0}, at::kDouble);
  none.included = {0, 1, 2};
  EXPECT_TRUE(std::isnan(fit_variance_scale(none, at::zeros({0}, at::kDouble))));
  EnsemblePrediction same;  // every member predicts the same: zero variance
  same.member_mean = at::ones({3, 4}, at::kDouble);
  same.included = {0, 1, 2};
  same = combine_members(std::move(same), Head::kMean);
  EXPECT_TRUE(std::isnan(fit_variance_scale(same, at::zeros({4}, at::kDouble))));
  EXPECT_THROW(fit_variance_scale(p, y.narrow(0, 0, 5)), c10::Error) << "5 targets for 10 rows";
}

class VarianceRecalibrationTest : public DeviceTest {};

TEST_P(VarianceRecalibrationTest, ATrainerFitsItsScaleOnTheValidationRowsAndKeepsItThroughACheckpoint) {
  const Data d = make_data(160, 60);
  EnsembleTrainer trainer(small_options(device()));
  ASSERT_EQ(trainer.options().recalibration(), Recalibration::kVariance) << "the default";
  trainer.fit(d.x, d.y, d.val_x, d.val_y);
  const double s = trainer.variance_scale();
  EXPECT_NE(s, 1.0);
  EXPECT_NEAR(s, fit_variance_scale(trainer.predict_uncalibrated(d.val_x), d.val_y), 1e-9 * s);
  const EnsemblePrediction calibrated = trainer.predict(d.x), raw = trainer.predict_uncalibrated(d.x);
  EXPECT_TRUE(all_close(calibrated.mean, raw.mean, 1e-12));
  EXPECT_TRUE(all_close(calibrated.variance, s * raw.variance, 1e-9));
  EXPECT_LT(trainer.evaluate(d.val_x, d.val_y).ensemble.nll,
            ensemble_metrics(trainer.predict_uncalibrated(d.val_x), d.val_y, Head::kGaussian).ensemble.nll)
      << "the validation rows' moment-matched NLL at its minimum";

  // Through a checkpoint, to a model restored on the CPU.
  const fs::path path = fs::temp_directory_path() / ("packtrain_recalibration_" + std::to_string(getpid()) + ".ckpt");
  trainer.save(path);
  const auto checkpoint = EnsembleTrainer::read_checkpoint(path);
  EnsembleTrainer loaded(EnsembleTrainer::checkpoint_options(*checkpoint).device(c10::Device(c10::kCPU)));
  loaded.restore(*checkpoint);
  EXPECT_DOUBLE_EQ(loaded.variance_scale(), s);
  EXPECT_TRUE(all_close(loaded.predict(d.x).variance, calibrated.variance, device().is_cuda() ? 1e-5 : 1e-12));
  fs::remove(path);

  // Off, without validation rows, or interrupted: predicts as trained.
  EnsembleTrainer off(small_options(device()).recalibration(Recalibration::kNone));
  off.fit(d.x, d.y, d.val_x, d.val_y);
  EXPECT_EQ(off.variance_scale(), 1.0);
  EXPECT_TRUE(all_close(off.predict(d.x).variance, raw.variance, device().is_cuda() ? 1e-5 : 0.0));
  EnsembleTrainer blind(small_options(device()));
  blind.fit(d.x, d.y);
  EXPECT_EQ(blind.variance_scale(), 1.0);
  EnsembleTrainer cut(small_options(device()));
  cut.prepare(d.x, d.y, d.val_x, d.val_y);
  EXPECT_FALSE(cut.train([](const EpochReport& r) { return r.epoch < 3; }));
  EXPECT_EQ(cut.variance_scale(), 1.0) << "an interrupted run's scale would be fitted to weights it has not finished";
  EXPECT_TRUE(cut.train());
  EXPECT_NEAR(cut.variance_scale(), s, 1e-9 * s) << "resumed to the end: the uninterrupted run's scale";
}

TEST_P(VarianceRecalibrationTest, ASweepsScaleIsFittedToTheConfigurationItKeeps) {
  const Data d = make_data(160, 60);
  EnsembleTrainer sweep(
      sweep_options(small_options(device()).members(2).epochs(6), SweepGrid{{1e-2, 3e-3}, {0.0}, 2, {}, {}, {}}));
  sweep.fit(d.x, d.y, d.val_x, d.val_y);
  const EnsemblePrediction all = sweep.predict_uncalibrated(d.val_x);
  EXPECT_NEAR(sweep.variance_scale(), fit_variance_scale(all, d.val_y), 1e-9) << "the whole pack, before choosing";
  sweep.keep_members(2, 2);
  const double kept = fit_variance_scale(member_range(all, 2, 2, Head::kGaussian), d.val_y);
  EXPECT_NEAR(sweep.variance_scale(), kept, 1e-9 * kept);
  EXPECT_TRUE(
      all_close(sweep.predict(d.val_x).variance, kept * member_range(all, 2, 2, Head::kGaussian).variance, 1e-9));
}

TEST_P(VarianceRecalibrationTest, AClassifierIsNotRecalibrated) {
  const Data d = make_data(160, 60);
  EnsembleTrainer trainer(small_options(device()).head(Head::kClassification).epochs(3));
  trainer.fit(d.x, (d.y > 10.5).to(at::kDouble), d.val_x, (d.val_y > 10.5).to(at::kDouble));
  EXPECT_EQ(trainer.variance_scale(), 1.0);
}

TEST(VarianceRecalibrationOptions, CheckpointsFromBeforeItPredictAsTrained) {
  std::string json = to_json(EnsembleTrainerOptions());
  const std::string key = "\"recalibration\":\"variance\",";
  ASSERT_NE(json.find(key), std::string::npos) << json;
  EXPECT_EQ(options_from_json(json).recalibration(), Recalibration::kVariance);
  // A checkpoint from before it: format version 1 (no format_version key).
  json.erase(json.find(key), key.size());
  const std::string version = "\"format_version\":" + std::to_string(kTrainerOptionsFormat) + ",";
  ASSERT_NE(json.find(version), std::string::npos) << json;
  json.erase(json.find(version), version.size());
  EXPECT_EQ(options_from_json(json).recalibration(), Recalibration::kNone);
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(VarianceRecalibrationTest);

}  // namespace
}  // namespace packtrain::runtime
