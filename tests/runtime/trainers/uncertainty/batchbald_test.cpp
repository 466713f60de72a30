// BatchBALD's greedy batch (runtime/trainers/uncertainty/batchbald.h): its first pick
// is BALD's argmax; each pick's joint mutual information is the count over every
// label configuration of the chosen rows (and near it once estimated from samples);
// a copy of a chosen row is not picked, though BALD ranks it as high as the row; a
// sampled run repeats for its seed. The acquisition options take batchbald
// for classifiers only, with the top selection. (python/tests/test_batchbald.py
// checks the batches against baal's BatchBALD.)
#include "packtrain/runtime/trainers/uncertainty/batchbald.h"
#include "packtrain/base/user_error.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_predictions.h"
#include "packtrain/runtime/trainers/uncertainty/acquisition.h"
#include "packtrain/runtime/trainers/uncertainty/active_learning.h"
#include "packtrain/runtime/trainers/uncertainty/predictive_distribution.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace packtrain::runtime {
namespace {

// (K, N, C) class probabilities of K members that disagree: softmax of scaled normals.
at::Tensor member_probabilities(int64_t K, int64_t N, int64_t C, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return (at::randn({K, N, C}, gen, at::TensorOptions().dtype(at::kDouble)) * 2.0).softmax(2);
}

std::vector<double> bald(const at::Tensor& p) {
  EnsemblePrediction e;
  e.member_probabilities = p;
  for (int64_t k = 0; k < p.size(0); ++k) e.included.push_back(k);
  const at::Tensor mi = decompose_class_uncertainty(e).mutual_information.contiguous();
  return {mi.data_ptr<double>(), mi.data_ptr<double>() + mi.numel()};
}

// I(y_rows; member) by brute force: every one of the C^t label configurations,
// its probability under each member a product over the rows.
double joint_mutual_information(const at::Tensor& p, const std::vector<int64_t>& rows) {
  const at::Tensor q = p.contiguous();
  const int64_t K = q.size(0), N = q.size(1), C = q.size(2);
  const double* v = q.data_ptr<double>();
  const auto at_ = [&](int64_t k, int64_t n, int64_t c) { return v[(k * N + n) * C + c]; };
  int64_t configurations = 1;
  for (size_t i = 0; i < rows.size(); ++i) configurations *= C;
  double joint = 0;
  for (int64_t e = 0; e < configurations; ++e) {
    double mixture = 0;
    for (int64_t k = 0; k < K; ++k) {
      double product = 1;
      int64_t rest = e;
      for (const int64_t row : rows) product *= at_(k, row, rest % C), rest /= C;
      mixture += product / static_cast<double>(K);
    }
    if (mixture > 0) joint -= mixture * std::log(mixture);
  }
  double conditional = 0;
  for (const int64_t row : rows) {
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t c = 0; c < C; ++c) {
        const double x = at_(k, row, c);
        if (x > 0) conditional -= x * std::log(x) / static_cast<double>(K);
      }
    }
  }
  return joint - conditional;
}

TEST(BatchBald, FirstPickIsBaldsArgmax) {
  for (const uint64_t seed : {1, 2, 3}) {
    const at::Tensor p = member_probabilities(8, 40, 3, seed);
    const std::vector<double> scores = bald(p);
    const auto top = std::max_element(scores.begin(), scores.end());
    const BatchBaldSelection s = batchbald_select(p, 5);
    ASSERT_EQ(s.rows.size(), 5u);
    EXPECT_EQ(s.rows[0], top - scores.begin()) << "seed " << seed;
    EXPECT_NEAR(s.joint_mutual_information[0], *top, 1e-12);
  }
}

TEST(BatchBald, JointMutualInformationIsTheCountOverEveryConfiguration) {
  const at::Tensor p = member_probabilities(6, 30, 3, 4);
  const BatchBaldSelection s = batchbald_select(p, 5);  // 3^4 configurations: exact
  std::vector<int64_t> chosen;
  for (size_t t = 0; t < s.rows.size(); ++t) {
    chosen.push_back(s.rows[t]);
    EXPECT_NEAR(s.joint_mutual_information[t], joint_mutual_information(p, chosen), 1e-10) << "pick " << t;
    if (t > 0) {
      EXPECT_GE(s.joint_mutual_information[t], s.joint_mutual_information[t - 1] - 1e-12);
    }
  }
  // Each pick is the best: no other row raises the joint information more.
  std::vector<int64_t> before(s.rows.begin(), s.rows.begin() + 2);
  for (int64_t n = 0; n < p.size(1); ++n) {
    if (std::find(before.begin(), before.end(), n) != before.end()) continue;
    std::vector<int64_t> with = before;
    with.push_back(n);
    EXPECT_LE(joint_mutual_information(p, with), s.joint_mutual_information[2] + 1e-10) << "row " << n;
  }
}

TEST(BatchBald, NeverPicksACopyOfAChosenRow) {
  const at::Tensor base = member_probabilities(8, 30, 3, 5);
  const std::vector<double> base_scores = bald(base);
  const int64_t top = std::max_element(base_scores.begin(), base_scores.end()) - base_scores.begin();
  const at::Tensor p = at::cat({base, base.narrow(1, top, 1)}, 1);  // row 30 repeats row `top`
  const int64_t copy = 30;
  // BALD ranks the copy with the row itself: its top 2 are both.
  const std::vector<double> scores = bald(p);
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  ASSERT_EQ(std::vector<int64_t>(order.begin(), order.begin() + 2), (std::vector<int64_t>{top, copy}));
  const BatchBaldSelection s = batchbald_select(p, 4);
  EXPECT_EQ(s.rows[0], top);
  EXPECT_EQ(std::find(s.rows.begin(), s.rows.end(), copy), s.rows.end());
  // The copy is a second label of the same row, independent given the member: it
  // adds only what that label's noise leaves, less than the second pick adds.
  EXPECT_LT(joint_mutual_information(p, {top, copy}), s.joint_mutual_information[1] - 1e-3);
  // Members that are certain of their labels: a copy adds nothing at all.
  const at::Tensor certain = at::one_hot(p.argmax(2), 3).to(at::kDouble);
  EXPECT_NEAR(joint_mutual_information(certain, {top, copy}), joint_mutual_information(certain, {top}), 1e-12);
}

TEST(BatchBald, SampledEstimateIsNearTheExactCount) {
  // Two classes, 4000 samples: exact up to 12 rows (2^12 configurations with the
  // candidate), estimated from 4000 drawn configurations for the 13th and 14th —
  // within 0.08 nats of the count (about 2 nats here; numpy runs of the same
  // estimator were off by at most 0.04).
  const at::Tensor p = member_probabilities(8, 40, 2, 6);
  const BatchBaldSelection s = batchbald_select(p, 14, /*samples=*/4000, /*seed=*/3);
  for (size_t t = 12; t < 14; ++t) {
    const double exact = joint_mutual_information(p, std::vector<int64_t>(s.rows.begin(), s.rows.begin() + t + 1));
    EXPECT_NEAR(s.joint_mutual_information[t], exact, 0.08) << "pick " << t;
    EXPECT_NE(s.joint_mutual_information[t], exact) << "pick " << t << " was not sampled";
  }
  EXPECT_NEAR(s.joint_mutual_information[11],
              joint_mutual_information(p, std::vector<int64_t>(s.rows.begin(), s.rows.begin() + 12)), 1e-10);
}

TEST(BatchBald, SampledRunRepeatsForItsSeed) {
  const at::Tensor p = member_probabilities(8, 30, 4, 7);
  // 4^2 = 16 <= 50 < 4^3: the 4th pick onwards from 56 drawn configurations.
  const BatchBaldSelection a = batchbald_select(p, 6, 50, 11), b = batchbald_select(p, 6, 50, 11);
  const BatchBaldSelection other = batchbald_select(p, 6, 50, 12);
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.joint_mutual_information, b.joint_mutual_information);
  EXPECT_EQ(std::vector<int64_t>(a.rows.begin(), a.rows.begin() + 3),
            std::vector<int64_t>(other.rows.begin(), other.rows.begin() + 3));  // the exact picks
  EXPECT_NE(a.joint_mutual_information[3], other.joint_mutual_information[3]);  // other draws
}

TEST(BatchBald, RefusesWhatItCannotUse) {
  const at::Tensor p = member_probabilities(4, 10, 3, 8);
  EXPECT_THROW(batchbald_select(p, 0), UserError);
  EXPECT_THROW(batchbald_select(p, 11), UserError);
  EXPECT_THROW(batchbald_select(p, 2, 0), UserError);
  EXPECT_THROW(batchbald_select(p.select(0, 0), 2), UserError);
  at::Tensor bad = p.clone();
  bad[0][1][2] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(batchbald_select(bad, 2), UserError);
  bad[0][1][2] = -0.5;
  EXPECT_THROW(batchbald_select(bad, 2), UserError);
}

TEST(BatchBald, AcquisitionTakesItForClassifiersWithTheTopSelection) {
  AcquisitionOptions o;
  o.strategy = kAcquisitionStrategyNames.parse("batchbald");
  EXPECT_EQ(o.strategy, AcquisitionStrategy::kBatchBald);
  EXPECT_NO_THROW(check_acquisition_options(o, /*classification=*/true));
  try {
    check_acquisition_options(o, /*classification=*/false);
    FAIL() << "batchbald accepted for a regressor";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("scores classification predictions"), std::string::npos) << e.what();
  }
  o.selection = BatchSelection::kSoftmax;
  try {
    check_acquisition_options(o, /*classification=*/true);
    FAIL() << "batchbald accepted with softmax sampling";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("selection top"), std::string::npos) << e.what();
  }
  // A row's score is BALD's.
  EnsemblePrediction e;
  e.member_probabilities = member_probabilities(5, 12, 3, 9);
  for (int64_t k = 0; k < 5; ++k) e.included.push_back(k);
  o.selection = BatchSelection::kTop;
  const at::Tensor scores = acquisition_scores(e, o);
  EXPECT_TRUE(at::allclose(scores, decompose_class_uncertainty(e).mutual_information));
}

// Active learning's acquire step: BatchBALD over the unlabelled rows only, moved in
// the order chosen.
TEST(BatchBald, PoolPartitionLabelsTheBatchOfItsUnlabelledRows) {
  const at::Tensor p = member_probabilities(6, 20, 3, 10);
  PoolPartition run(20, {0, 3, 5});
  AcquisitionOptions o;
  o.strategy = AcquisitionStrategy::kBatchBald;
  o.seed = 4;
  const std::vector<int64_t> unlabelled = run.unlabelled();
  const BatchBaldSelection s =
      batchbald_select(p.index_select(1, at::tensor(unlabelled, at::kLong)), 4, kDefaultBatchBaldSamples, 4);
  run.acquire_batchbald(p, 4, o);
  ASSERT_EQ(run.labelled().size(), 7u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(run.labelled()[3 + i], unlabelled[static_cast<size_t>(s.rows[i])]);
  EXPECT_EQ(run.unlabelled().size(), 13u);
}

}  // namespace
}  // namespace packtrain::runtime
