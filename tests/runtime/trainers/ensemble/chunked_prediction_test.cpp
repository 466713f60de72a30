// Large tables are predicted and scored a chunk of rows at a time: the chunk size
// keeps one chunk's activations and predictions within a fixed budget, the chunks
// together equal one prediction of every row, acquisition scores keep only a score
// per row, and a prediction that is not finite is found by row. Also: no
// calibration verdict over scores that are not finite, and a sweep too large for
// the memory is refused by the estimate before its per-member values are built.
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_predictions.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "packtrain/runtime/trainers/ensemble/hyperparameter_sweep.h"
#include "packtrain/runtime/trainers/uncertainty/acquisition.h"
#include "packtrain/runtime/trainers/uncertainty/calibration.h"
#include "tests/runtime/trainers/trainer_test_data.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include <cmath>
#include <limits>

namespace packtrain::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using trainer_testing::make_data;
using trainer_testing::small_options;

TEST(ChunkedPrediction, ChunkRowsKeepAChunkWithinTheBudget) {
  // 16 members of hidden 50, 2 outputs: 16 * (3 * 50 * 4 + 8 * 2 * 8) = 11,648 bytes a row.
  EXPECT_EQ(prediction_chunk_rows(16, 50, 2, 11648.0 * 1000), 1000);
  EXPECT_EQ(prediction_chunk_rows(16, 50, 2), static_cast<int64_t>(kPredictionChunkBytes / 11648));
  // Twice the members, half the rows; never fewer than one.
  EXPECT_EQ(prediction_chunk_rows(32, 50, 2, 11648.0 * 1000), 500);
  EXPECT_EQ(prediction_chunk_rows(1000000, 100000, 2), 1);
}

TEST(ChunkedPrediction, ChunksTogetherEqualOnePredictionAndScoresEqualTheWholePools) {
  const auto d = make_data(96, 0);
  EnsembleTrainer trainer(small_options(c10::kCPU).epochs(2));
  trainer.fit(d.x, d.y);
  const at::Tensor pool = at::randn({37, 3}, at::kDouble);
  const EnsemblePrediction whole = trainer.predict(pool);
  const auto predict = [&](const at::Tensor& rows) { return trainer.predict(rows); };
  std::vector<int64_t> firsts;
  std::vector<EnsemblePrediction> chunks;
  predict_in_chunks(predict, pool, 10, [&](int64_t first, EnsemblePrediction p) {
    firsts.push_back(first);
    chunks.push_back(std::move(p));
  });
  EXPECT_THAT(firsts, ::testing::ElementsAre(0, 10, 20, 30));
  const EnsemblePrediction joined = concatenate_rows(chunks);
  for (const auto& [a, b] : {std::pair{joined.mean, whole.mean},
                             {joined.variance, whole.variance},
                             {joined.spread, whole.spread},
                             {joined.member_mean, whole.member_mean},
                             {joined.member_variance, whole.member_variance}}) {
    EXPECT_TRUE(at::allclose(a, b, 1e-6, 1e-9));
  }
  for (const AcquisitionStrategy s : {AcquisitionStrategy::kEpistemic, AcquisitionStrategy::kTotalVariance,
                                      AcquisitionStrategy::kUcb, AcquisitionStrategy::kRandom}) {
    AcquisitionOptions o;
    o.strategy = s;
    o.seed = 7;
    EXPECT_TRUE(
        at::allclose(acquisition_scores_in_chunks(predict, pool, o, 10), acquisition_scores(whole, o), 1e-6, 1e-9))
        << kAcquisitionStrategyNames.name(s);
  }
}

TEST(ChunkedPrediction, TheFirstRowWithANonFinitePredictionIsFound) {
  EnsemblePrediction p;
  p.mean = at::tensor({1.0, 2.0, 3.0, 4.0}, at::kDouble);
  p.variance = at::tensor({1.0, 1.0, 1.0, 1.0}, at::kDouble);
  EXPECT_FALSE(first_non_finite_row(p).has_value());
  p.variance[3] = std::numeric_limits<double>::infinity();
  p.mean[2] = std::nan("");
  EXPECT_EQ(first_non_finite_row(p), 2);
  EnsemblePrediction c;
  c.probabilities = at::tensor({0.5, 0.5, std::nan(""), 0.5}, at::kDouble).reshape({2, 2});
  EXPECT_EQ(first_non_finite_row(c), 1);
}

TEST(ChunkedPrediction, PredictRefusesAnInputThatStandardizesBeyondFloat32NamingItsRowAndColumn) {
  const auto d = make_data(96, 0);
  EnsembleTrainer trainer(small_options(c10::kCPU).epochs(1));
  trainer.fit(d.x, d.y);
  at::Tensor pool = at::zeros({3, 3}, at::kDouble);
  pool[1][2] = 1e300;
  try {
    trainer.predict(pool);
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr("prediction input row 2, column 3: value 1e+300 beyond float32's range"));
  }
}

TEST(ChunkedPrediction, NoCalibrationVerdictOverScoresThatAreNotFinite) {
  RegressionCalibration r;
  r.rows = 10;
  r.rmse = std::nan("");
  r.gaussian_nll = 1.0;
  r.crps = 1.0;
  r.intervals.push_back({0.9, 0.5, std::numeric_limits<double>::infinity()});
  const std::string regression = calibration_summary(r);
  EXPECT_THAT(regression, HasSubstr("no calibration verdict"));
  EXPECT_THAT(regression, HasSubstr("RMSE nan"));
  EXPECT_THAT(regression, HasSubstr("90% interval width"));
  EXPECT_THAT(regression, Not(HasSubstr("confident")));
  EXPECT_THAT(regression, Not(HasSubstr("calibrated (")));
  ClassificationCalibration c;
  c.rows = 10;
  c.accuracy = 0.5;
  c.nll = std::nan("");
  c.brier = 0.1;
  c.mean_confidence = 0.9;  // would read as "over-confident"
  const std::string classification = calibration_summary(c);
  EXPECT_THAT(classification, HasSubstr("no calibration verdict"));
  EXPECT_THAT(classification, Not(HasSubstr("confident")));
}

TEST(ChunkedPrediction, ASweepTooLargeForTheMemoryIsRefusedBeforeItsPerMemberValuesAreBuilt) {
  // 2 x 1e12 members: building their per-member values would need 48 TB; the
  // estimate refuses first (DataError naming the estimate), in no time.
  SweepGrid grid;
  grid.lr = {1e-3, 2e-3};
  grid.weight_decay = {0};
  grid.seeds = 1000000000000;
  try {
    sweep_options(EnsembleTrainerOptions(), grid);
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr("this run needs about"));
    EXPECT_THAT(e.what(), HasSubstr("2000000000000 members"));
    EXPECT_THAT(e.what(), HasSubstr("sweep fewer values"));
  }
  grid.seeds = 3;
  EXPECT_EQ(sweep_options(EnsembleTrainerOptions(), grid).members(), 6);
}

}  // namespace
}  // namespace packtrain::runtime
