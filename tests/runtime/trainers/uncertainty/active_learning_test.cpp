// Active learning in one pack: the labelled sets grow by b per round and never
// overlap the pool; re-initializing between rounds keeps the same steps and graphs;
// bad options fail with one-line errors; classifiers acquire by BALD or sampled
// entropy; and acquisition by ensemble spread beats
// random acquisition on a bundled data set, measured here, over the same seeds.
#include "packtrain/runtime/trainers/uncertainty/active_learning.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/uci_dataset.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gmock/gmock.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <set>
#include <sstream>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using packtrain::testing::DeviceTest;
using ::testing::HasSubstr;

fs::path data_dir() {
  const char* env = std::getenv("PACKTRAIN_DATA_DIR");
  return env ? fs::path(env) : fs::path(PACKTRAIN_SOURCE_DATA_DIR);
}

struct PoolAndTest {
  at::Tensor pool_x, pool_y, test_x, test_y;
};

PoolAndTest load(const std::string& name, int split) {
  const fs::path dir = data_dir() / name;
  const RegressionData data = load_uci(dir);
  const SplitIndices s = load_uci_split(dir, split, data.features.size(0));
  const at::Tensor train = at::tensor(s.train, at::kLong), test = at::tensor(s.test, at::kLong);
  return {data.features.index_select(0, train), data.targets.index_select(0, train),
          data.features.index_select(0, test), data.targets.index_select(0, test)};
}

graphs::GraphLog quiet() {
  return [](const std::string&) {};
}

// A small, quick configuration for the bookkeeping tests.
EnsembleTrainerOptions small_trainer(c10::Device device) {
  EnsembleTrainerOptions options;  // built in place: copying the chain's result trips GCC 12's -Wmaybe-uninitialized
  options.members(2)
      .hidden(16)
      .depth(1)
      .epochs(6)
      .batch_size(8)
      .lr(1e-2)
      .order(graphs::BatchOrder::kPerMember)
      .unroll(2)
      .device(device)
      .log(quiet());
  return options;
}

// 24 rows in batches of 8 with U = 2: an epoch replays the unrolled step and the
// single step from the first round on, so both are captured in round 0 on CUDA.
ActiveLearningOptions small_loop() {
  return ActiveLearningOptions().initial(24).acquire(8).rounds(4).ensembles(2).seed(3);
}

void expect_partition(const PoolPartition& run, int64_t pool_rows, int64_t labelled) {
  ASSERT_EQ(static_cast<int64_t>(run.labelled().size()), labelled);
  ASSERT_EQ(static_cast<int64_t>(run.unlabelled().size()), pool_rows - labelled);
  const std::set<int64_t> l(run.labelled().begin(), run.labelled().end());
  const std::set<int64_t> u(run.unlabelled().begin(), run.unlabelled().end());
  EXPECT_EQ(l.size(), run.labelled().size()) << "a labelled row appears twice";
  EXPECT_EQ(u.size(), run.unlabelled().size()) << "an unlabelled row appears twice";
  std::vector<int64_t> both;
  std::set_intersection(l.begin(), l.end(), u.begin(), u.end(), std::back_inserter(both));
  EXPECT_TRUE(both.empty()) << both.size() << " rows are labelled and unlabelled at once, e.g. " << both.front();
  std::set<int64_t> all = l;
  all.insert(u.begin(), u.end());
  EXPECT_EQ(static_cast<int64_t>(all.size()), pool_rows);
  EXPECT_GE(*all.begin(), 0);
  EXPECT_LT(*all.rbegin(), pool_rows);
}

TEST(PoolPartition, AcquireTopTakesTheHighestUnlabelledScores) {
  PoolPartition run(6, {4, 1});
  run.acquire_top(at::tensor({0.5, 9.0, 0.7, 0.1, 8.0, 0.7}, at::kDouble), 2);  // 1 and 4 are labelled already
  EXPECT_EQ(run.labelled(), (std::vector<int64_t>{4, 1, 2, 5}));                // tie at 0.7: lower row first
  EXPECT_EQ(run.unlabelled(), (std::vector<int64_t>{0, 3}));
  expect_partition(run, 6, 4);
  EXPECT_THROW(run.acquire_top(at::zeros({6}, at::kDouble), 3), c10::Error);
  EXPECT_THROW(run.acquire_top(at::zeros({5}, at::kDouble), 1), c10::Error);
}

TEST(PoolPartition, AcquireRandomIsSeededAndKeepsThePartition) {
  std::mt19937_64 a(11), b(11);
  PoolPartition first(100, {0, 1, 2}), second(100, {0, 1, 2});
  for (int round = 0; round < 9; ++round) {
    first.acquire_random(a, 10);
    second.acquire_random(b, 10);
    expect_partition(first, 100, 3 + 10 * (round + 1));
  }
  EXPECT_EQ(first.labelled(), second.labelled());
  EXPECT_THROW(PoolPartition(10, {3, 3}), UserError);
  EXPECT_THROW(PoolPartition(10, {10}), UserError);
}

// Tiny tensors: intra-op threads only add synchronization, and on a loaded 2-core
// machine OpenMP's spinning made this test 10-100x slower. Results do not change.
class OneThread {
 public:
  OneThread() : saved_(at::get_num_threads()) { at::set_num_threads(1); }
  ~OneThread() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

class ActiveLearningDevice : public DeviceTest {
  const OneThread one_thread_;
};

TEST_P(ActiveLearningDevice, LabelledSetsGrowByAcquireAndStayDisjointFromThePool) {
  const PoolAndTest d = load("yacht", 0);
  const int64_t N = d.pool_x.size(0);
  const ActiveLearningOptions o = small_loop();
  ActiveLearningLoop loop(small_trainer(device()), d.pool_x, d.pool_y, d.test_x, d.test_y, o);
  ASSERT_EQ(loop.runs().size(), 4u);  // 2 strategies x 2 runs
  EXPECT_EQ(loop.trainer().options().members(), 8);
  const std::vector<int64_t> initial = loop.runs().front().labelled();
  for (const PoolPartition& run : loop.runs()) EXPECT_EQ(run.labelled(), initial) << "the initial set is shared";
  for (int64_t r = 0; r < o.rounds(); ++r) {
    const LearningCurvePoint p = loop.next_round();
    EXPECT_EQ(p.round, r);
    EXPECT_EQ(p.labelled, o.initial() + r * o.acquire());
    ASSERT_EQ(p.acquired_runs.size(), 2u);
    ASSERT_EQ(p.random_runs.size(), 2u);
    EXPECT_TRUE(std::isfinite(p.acquired) && std::isfinite(p.random));
    const int64_t after = o.initial() + std::min(r + 1, o.rounds() - 1) * o.acquire();  // acquired unless last
    for (const PoolPartition& run : loop.runs()) {
      expect_partition(run, N, after);
      EXPECT_TRUE(std::equal(initial.begin(), initial.end(), run.labelled().begin())) << "rows were only appended";
    }
  }
  EXPECT_TRUE(loop.done());
  EXPECT_NE(loop.runs()[0].labelled(), loop.runs()[2].labelled()) << "spread and random acquired the same rows";
}

// A classifier (wine quality's grades as classes) by BALD and by power-sampled
// entropy: the same bookkeeping, accuracy in [0, 1], the runs acquiring other rows
// than random acquisition does, and the sampled batches differing from the top-b.
TEST_P(ActiveLearningDevice, ClassifiersAcquireByBaldOrSampledEntropy) {
  const PoolAndTest d = load("wine-quality-red", 0);
  const int64_t N = d.pool_x.size(0);
  EnsembleTrainerOptions t = small_trainer(device());
  t.head(Head::kClassification);
  std::vector<std::vector<int64_t>> acquired;
  for (const BatchSelection selection : {BatchSelection::kTop, BatchSelection::kPower}) {
    AcquisitionOptions a;
    a.strategy = selection == BatchSelection::kTop ? AcquisitionStrategy::kBald : AcquisitionStrategy::kEntropy;
    a.selection = selection;
    const ActiveLearningOptions o = small_loop().rounds(3).acquisition(a);
    const ActiveLearningResult r = run_active_learning(t, d.pool_x, d.pool_y, d.test_x, d.test_y, o);
    EXPECT_EQ(r.metric, "accuracy");
    EXPECT_EQ(r.strategy, selection == BatchSelection::kTop ? "bald" : "entropy");
    ASSERT_EQ(r.curve.size(), 3u);
    for (const LearningCurvePoint& p : r.curve) {
      EXPECT_GE(p.acquired, 0.0);
      EXPECT_LE(p.acquired, 1.0);
      EXPECT_GE(p.random, 0.0);
      EXPECT_LE(p.random, 1.0);
    }
    ASSERT_EQ(r.labelled.size(), 4u);
    for (const std::vector<int64_t>& rows : r.labelled) {
      EXPECT_EQ(static_cast<int64_t>(std::set<int64_t>(rows.begin(), rows.end()).size()),
                o.initial() + 2 * o.acquire());
      for (const int64_t row : rows) EXPECT_LT(row, N);
    }
    EXPECT_NE(r.labelled[0], r.labelled[2]) << "the strategy and random acquired the same rows";
    acquired.push_back(r.labelled[0]);
  }
  EXPECT_NE(acquired[0], acquired[1]);
}

TEST_P(ActiveLearningDevice, ReinitializeKeepsTheStepsAndTheirGraphs) {
  const PoolAndTest d = load("yacht", 0);
  ActiveLearningLoop loop(small_trainer(device()), d.pool_x, d.pool_y, d.test_x, d.test_y, small_loop());
  EnsembleSteps* const steps = &loop.trainer().steps();
  const void* const weights = loop.trainer().model().parameters().flat().data_ptr();
  loop.next_round();
  const int64_t captured = steps->unrolled_step().captures() + steps->single_step().captures();
  if (device().is_cuda()) {
    for (graphs::CapturedStep* step : {&steps->unrolled_step(), &steps->single_step()}) {
      EXPECT_EQ(step->mode(), graphs::StepMode::kGraph) << step->name() << ": " << step->eager_reason();
      EXPECT_EQ(step->captures(), 1) << step->name();
    }
  } else {
    EXPECT_EQ(captured, 0) << "CPU runs eagerly";
  }
  while (!loop.done()) {
    loop.next_round();
    EXPECT_EQ(&loop.trainer().steps(), steps) << "the steps were rebuilt";
    EXPECT_EQ(loop.trainer().model().parameters().flat().data_ptr(), weights) << "the weights were reallocated";
    EXPECT_EQ(steps->unrolled_step().captures() + steps->single_step().captures(), captured) << "re-captured";
  }
}

// Paired runs: reinitialize(seed, P) starts member k as member k mod P (the loop
// passes P = G * M, so each random run starts from its acquired twin's weights);
// members within a period still differ, and a P that does not divide K is refused.
TEST_P(ActiveLearningDevice, RandomRunsStartFromTheirAcquiredTwinsWeights) {
  const PoolAndTest d = load("yacht", 0);
  ActiveLearningLoop loop(small_trainer(device()), d.pool_x, d.pool_y, d.test_x, d.test_y, small_loop());
  EnsembleTrainer& trainer = loop.trainer();
  const int64_t K = trainer.options().members(), P = K / 2;
  const auto member = [&](int64_t k) {
    std::vector<at::Tensor> pieces;
    for (const at::Tensor& p : trainer.model().parameters().tensors()) pieces.push_back(p[k].reshape({-1}).cpu());
    return at::cat(pieces);
  };
  trainer.reinitialize(7, P);
  for (int64_t k = 0; k < P; ++k) {
    EXPECT_TRUE(at::equal(member(k), member(k + P))) << "member " << k + P << " is not member " << k;
    if (k > 0) {
      EXPECT_FALSE(at::equal(member(k), member(0))) << "members within a period are equal";
    }
  }
  trainer.reinitialize(7);
  EXPECT_FALSE(at::equal(member(0), member(P))) << "unpaired members started equal";
  EXPECT_THROW(trainer.reinitialize(7, 3), c10::Error);
}

std::string data_error(const EnsembleTrainerOptions& t, const ActiveLearningOptions& o) {
  const PoolAndTest d = load("yacht", 0);
  try {
    run_active_learning(t, d.pool_x, d.pool_y, d.test_x, d.test_y, o);
  } catch (const DataError& e) {
    return e.what();
  }
  return "no DataError";
}

TEST(ActiveLearning, BadSizes_OneLineDataError) {
  const EnsembleTrainerOptions t = small_trainer(c10::kCPU);
  const std::string small = data_error(EnsembleTrainerOptions(t).batch_size(32), small_loop().initial(16));
  EXPECT_THAT(small, HasSubstr("initial labelled set (16 rows) is smaller than the batch size 32"));
  const std::string big = data_error(t, small_loop().initial(100).acquire(50).rounds(5));  // yacht: 277 pool rows
  EXPECT_THAT(big, HasSubstr("100 initial + 4 x 50 acquired = 300 rows, but the pool has only 277"));
  EXPECT_EQ(big.find('\n'), std::string::npos);
}

TEST(ActiveLearning, BadOptions_InvalidArgument) {
  const PoolAndTest d = load("yacht", 0);
  const auto run = [&](const EnsembleTrainerOptions& t, const ActiveLearningOptions& o) {
    run_active_learning(t, d.pool_x, d.pool_y, d.test_x, d.test_y, o);
  };
  const EnsembleTrainerOptions t = small_trainer(c10::kCPU);
  EXPECT_THROW(run(EnsembleTrainerOptions(t).patience(5), small_loop()), UserError);
  EXPECT_THROW(run(EnsembleTrainerOptions(t).members(1), small_loop()), UserError);
  // A classifier with a regression strategy (the options' default, epistemic), and the reverse.
  EXPECT_THROW(run(EnsembleTrainerOptions(t).head(Head::kClassification), small_loop()), UserError);
  AcquisitionOptions bald;
  bald.strategy = AcquisitionStrategy::kBald;
  EXPECT_THROW(run(t, small_loop().acquisition(bald)), UserError);
  EXPECT_THROW(run(EnsembleTrainerOptions(t).schedule(ensemble::LrScheduleKind::kCosine), small_loop()), UserError);
  EXPECT_THROW(run(t, small_loop().rounds(0)), UserError);
  EXPECT_THROW(run(t, small_loop().acquire(0)), UserError);
  EXPECT_THROW(run(t, small_loop().ensembles(0)), UserError);
}

TEST(ActiveLearning, SharedOrder_SwitchedToPerMemberWithALogLine) {
  const PoolAndTest d = load("yacht", 0);
  std::vector<std::string> lines;
  const EnsembleTrainerOptions t =
      small_trainer(c10::kCPU).order(graphs::BatchOrder::kShared).log([&](const std::string& line) {
        lines.push_back(line);
      });
  ActiveLearningLoop loop(t, d.pool_x, d.pool_y, d.test_x, d.test_y, small_loop().rounds(1));
  EXPECT_EQ(loop.trainer().options().order(), graphs::BatchOrder::kPerMember);
  EXPECT_THAT(lines, ::testing::Contains(HasSubstr("using 'per-member'")));
}

TEST(ActiveLearning, RunReportsEveryRoundAndTheLabelledRows) {
  const PoolAndTest d = load("yacht", 0);
  std::vector<int64_t> seen;
  const ActiveLearningResult r = run_active_learning(small_trainer(c10::kCPU), d.pool_x, d.pool_y, d.test_x, d.test_y,
                                                     small_loop().random_baseline(false),
                                                     [&](const LearningCurvePoint& p) { seen.push_back(p.round); });
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(r.pack_members, 4);  // 1 strategy x 2 runs x 2 members
  ASSERT_EQ(r.labelled.size(), 2u);
  EXPECT_EQ(r.labelled[0].size(), 24u + 3 * 8);
  EXPECT_TRUE(std::isnan(r.curve.back().random));
  EXPECT_TRUE(r.curve.back().random_runs.empty());
  EXPECT_GT(r.train_seconds, 0);
}

// The configuration of the spread-against-random comparison: yacht's heavy-tailed
// target (a few hulls with a large residuary resistance) rewards looking where the
// ensemble disagrees. Mean head, 4 runs of 5 members per strategy (40 in the pack),
// 20 labelled rows + 10 per round, 8 rounds of 100 epochs.
EnsembleTrainerOptions comparison_trainer(c10::Device device, uint64_t seed) {
  EnsembleTrainerOptions options;
  options.members(5)
      .hidden(32)
      .depth(1)
      .head(Head::kMean)
      .epochs(100)
      .batch_size(16)
      .lr(1e-2)
      .order(graphs::BatchOrder::kPerMember)
      .seed(seed)
      .device(device)
      .log(quiet());
  return options;
}

ActiveLearningOptions comparison_loop(uint64_t seed) {
  return ActiveLearningOptions().initial(20).acquire(10).rounds(8).ensembles(4).seed(seed);
}

// Mean test RMSE over the last 3 rounds and all runs, per strategy.
struct Comparison {
  double spread = 0, random = 0;
};
Comparison late_rmse(const ActiveLearningResult& r) {
  constexpr size_t kLast = 3;
  Comparison c;
  for (size_t i = r.curve.size() - kLast; i < r.curve.size(); ++i) {
    c.spread += r.curve[i].acquired / kLast;
    c.random += r.curve[i].random / kLast;
  }
  return c;
}

std::string curve_text(const ActiveLearningResult& r) {
  std::ostringstream out;
  for (const LearningCurvePoint& p : r.curve) {
    out << "  labelled " << p.labelled << ": spread " << p.acquired << ", random " << p.random << "\n";
  }
  return out.str();
}

// One learning curve says little (31 test rows, one initial set): the claim is
// pooled over three standard splits, each with G = 4 paired runs per strategy.
TEST_P(ActiveLearningDevice, SpreadAcquisitionBeatsRandom_Yacht) {
  Comparison total;
  for (const int split : {0, 1, 2}) {
    const PoolAndTest d = load("yacht", split);
    const ActiveLearningResult r = run_active_learning(comparison_trainer(device(), 0), d.pool_x, d.pool_y, d.test_x,
                                                       d.test_y, comparison_loop(0));
    const Comparison c = late_rmse(r);
    std::printf("yacht split %d (%.1f s of training):\n%s  last 3 rounds: spread %.4f, random %.4f (ratio %.3f)\n",
                split, r.train_seconds, curve_text(r).c_str(), c.spread, c.random, c.spread / c.random);
    total.spread += c.spread;
    total.random += c.random;
  }
  std::printf("pooled over 3 splits: spread %.4f, random %.4f (ratio %.3f)\n", total.spread / 3, total.random / 3,
              total.spread / total.random);
  EXPECT_LT(total.spread, total.random) << "acquisition by ensemble spread should beat random acquisition";
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(ActiveLearningDevice);

TEST(ActiveLearning, WritesTheCurveAsCsvAndSvg) {
  ActiveLearningResult r;
  r.strategy = "epistemic";
  r.metric = "rmse";
  r.curve.push_back({0, 20, 1.5, 2.0, {1.4, 1.6}, {1.9, 2.1}});
  r.curve.push_back({1, 30, 1.0, 1.8, {0.9, 1.1}, {1.7, 1.9}});
  const fs::path dir = fs::temp_directory_path();
  const fs::path csv = dir / ("packtrain_al_" + std::to_string(::getpid()) + ".csv");
  const fs::path svg = dir / ("packtrain_al_" + std::to_string(::getpid()) + ".svg");
  write_learning_curve_csv(csv, r);
  write_learning_curve_svg(svg, r, "yacht");
  std::stringstream c, s;
  c << std::ifstream(csv).rdbuf();
  s << std::ifstream(svg).rdbuf();
  std::remove(csv.c_str());
  std::remove(svg.c_str());
  EXPECT_THAT(c.str(), HasSubstr("round,labelled,epistemic_rmse,random_rmse,epistemic_std,random_std\n"
                                 "0,20,1.5,2,0.14142136,0.14142136\n1,30,1,1.8,0.14142136,0.14142136\n"));
  EXPECT_THAT(s.str(), HasSubstr(">yacht</text>"));
  EXPECT_THAT(s.str(), HasSubstr(">random</text>"));
  EXPECT_THAT(s.str(), HasSubstr("class=\"error-bars\""));
  EXPECT_EQ(s.str().substr(s.str().size() - 7), "</svg>\n");
}

}  // namespace
}  // namespace packtrain::runtime
