// Convolutional members (--architecture cnn) through every feature that is not
// architecture-specific, on the bundled optdigits images with small, fast packs:
// early stopping, a learning-rate sweep with --select best, recalibration of a
// regression head, checkpoints and resume (bit for bit), member parallel and data
// parallel (gloo, two ranks), acquire, and export (the export's members against
// packtrain itself: python/tests/test_export_cnn.py).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <set>
#include <sstream>
#include <string>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

// One thread a process: small packs on a busy 2-core machine run fastest so.
const std::string kTrain = "--threads 1 train ";
// A small classifying cnn pack on optdigits (1,258 train / 180 validation / 359 test rows).
const std::string kCnn =
    "--data optdigits --architecture cnn --channels 4,8 --hidden 16 --depth 1 --members 3 --head classification "
    "--device cpu --quiet --json";

class CnnFeatures : public Cli {
 protected:
  // `rows` rows of optdigits' shape (64 grey levels 0-16 each) in pool.csv; its path.
  std::string pool(int rows) const {
    std::ostringstream csv;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < 64; ++c) csv << (c ? "," : "") << (r * 7 + c * 3) % 17;
      csv << "\n";
    }
    write_file(path("pool.csv"), csv.str());
    return path("pool.csv");
  }
  // Rank 0's JSON of `packtrain launch --nproc 2 -- ARGS` (null, and a failure, when
  // the run fails).
  static nlohmann::json launched_json(const std::string& args) {
    const Result launched = launch(2, args);
    EXPECT_EQ(launched.status, 0) << launched.out;
    const nlohmann::json rank0 = rank0_json(launched.out);
    EXPECT_TRUE(rank0.is_object()) << launched.out;
    return rank0;
  }
};

TEST_F(CnnFeatures, EarlyStoppingStopsBeforeTheLastEpochAtTheBestOne) {
  const nlohmann::json r = run_json(kTrain + kCnn + " --epochs 15 --patience 1 --lr 0.05");
  const int epochs_run = r["epochs_run"].get<int>();
  EXPECT_LT(epochs_run, 15) << r["members"];
  for (const auto& m : r["members"]) {
    EXPECT_EQ(m["status"], "stopped") << m;
    EXPECT_EQ(m["best_epoch"].get<int>(), epochs_run - 1) << m;  // patience 1: one epoch without a better loss
  }
  EXPECT_GT(r["ensemble"]["accuracy"].get<double>(), 0.5);  // the best epoch's weights, trained (chance 0.1)
}

TEST_F(CnnFeatures, SweepListsTheGridAndSelectBestKeepsTheBestConfiguration) {
  const std::string ckpt = path("sweep.ckpt");
  const nlohmann::json r = run_json(kTrain + kCnn + " --epochs 2 --lr 0.001,0.01 --select best --checkpoint " + ckpt);
  const auto& configurations = r["configurations"];
  ASSERT_EQ(configurations.size(), 2u) << r;
  EXPECT_EQ(configurations[0]["lr"], 0.001);
  EXPECT_EQ(configurations[1]["lr"], 0.01);
  const size_t best = configurations[0]["val_loss"] < configurations[1]["val_loss"] ? 0 : 1;
  ASSERT_EQ(r["members"].size(), 6u);
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_EQ(r["members"][k]["in_ensemble"].get<bool>(), k / 3 == best) << r["members"][k];
  }
  // The checkpoint and its export hold the kept configuration only.
  const Result exported = run("export " + ckpt + " " + path("best.pt"));
  ASSERT_EQ(exported.status, 0) << exported.out;
  EXPECT_THAT(exported.out, HasSubstr("3 member(s)"));
}

TEST_F(CnnFeatures, RegressionHeadIsRecalibratedOnTheValidationRows) {
  // The digit's value as a Gaussian regression target: --recalibrate variance applies.
  const std::string args =
      "--threads 1 train --data optdigits --architecture cnn --channels 4 --hidden 16 --members 2 --epochs 2 "
      "--device cpu "
      "--quiet --json";
  const nlohmann::json fitted = run_json(args);
  const nlohmann::json raw = run_json(args + " --recalibrate none");
  EXPECT_NE(fitted["variance_scale"].get<double>(), 1.0);
  EXPECT_EQ(raw["variance_scale"].get<double>(), 1.0);
  EXPECT_EQ(fitted["ensemble"]["rmse"], raw["ensemble"]["rmse"]);  // the mean is not moved
  EXPECT_NE(fitted["ensemble"]["nll"], raw["ensemble"]["nll"]);
}

TEST_F(CnnFeatures, ResumedRunEqualsTheUninterruptedOneBitForBit) {
  const std::string args = kTrain + kCnn + " --patience 0";
  const nlohmann::json full = run_json(args + " --epochs 3 --checkpoint " + path("full.ckpt"));
  run_json(args + " --epochs 2 --checkpoint " + path("part.ckpt"));
  const nlohmann::json resumed =
      run_json("--threads 1 resume " + path("part.ckpt") + " --epochs 3 --device cpu --quiet --json");
  EXPECT_EQ(resumed["epochs_run"], 3);
  EXPECT_EQ(resumed["ensemble"], full["ensemble"]);
  EXPECT_EQ(resumed["members"], full["members"]);
  const std::string rows = pool(20);
  const Result a = run("--threads 1 predict " + path("full.ckpt") + " " + rows + " --members --device cpu");
  const Result b = run("--threads 1 predict " + path("part.ckpt") + " " + rows + " --members --device cpu");
  ASSERT_EQ(a.status, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
}

// With head dropout (each member's masks follow from its index in the ensemble,
// whichever rank or shard holds it), group norm and average pooling.
const std::string kLayers = " --dropout 0.2 --norm-groups 2 --pool avg";

TEST_F(CnnFeatures, MemberParallelEqualsOneProcess) {
  const std::string args = kTrain + kCnn + kLayers + " --patience 0 --epochs 3";
  const nlohmann::json single = run_json(args);
  nlohmann::json parallel = launched_json(args + " --member-parallel --checkpoint " + path("mp.ckpt"));
  ASSERT_EQ(parallel["members"].size(), 3u) << parallel;
  // Members 0-1 train on rank 0, member 2 on rank 1 — each as in one process, up to
  // float32 rounding: a shard's grouped convolutions have fewer groups, which the
  // CPU's convolution may sum in another order (measured: 2e-8 relative in one NLL).
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(parallel["members"][k]["accuracy"], single["members"][k]["accuracy"]) << "member " << k;
    const double a = parallel["members"][k]["nll"].get<double>(), b = single["members"][k]["nll"].get<double>();
    EXPECT_NEAR(a, b, 1e-6 * b) << "member " << k;
  }
  // One process evaluates the manifest (every shard's members) as the single run.
  const nlohmann::json evaluated = run_json("--threads 1 evaluate " + path("mp.ckpt") + " --json --device cpu");
  EXPECT_EQ(evaluated["shards"], 2);
  EXPECT_EQ(evaluated["ensemble"]["accuracy"], single["ensemble"]["accuracy"]);
  EXPECT_NEAR(evaluated["ensemble"]["nll"].get<double>(), single["ensemble"]["nll"].get<double>(), 1e-6);
}

TEST_F(CnnFeatures, DataParallelTwoRanksEqualOneProcessWithTheDoubledBatch) {
  const std::string args = kTrain + kCnn + kLayers + " --patience 0 --epochs 3 --batch 64";
  const nlohmann::json single = run_json(args);
  nlohmann::json parallel = launched_json(args + " --rank-check-every 4");
  EXPECT_EQ(parallel["data_parallel"]["per_rank_batch"], 32) << parallel;
  // Two half-batch gradients averaged instead of one batch-64 mean: float32 rounding
  // (measured 1e-8 relative); batch 32 alone would differ by percents.
  for (size_t k = 0; k < 3; ++k) {
    const double a = parallel["members"][k]["nll"].get<double>(), b = single["members"][k]["nll"].get<double>();
    EXPECT_NEAR(a, b, 1e-4 * b) << "member " << k;
  }
}

TEST_F(CnnFeatures, AcquireScoresAPoolOfImages) {
  const std::string ckpt = path("cnn.ckpt");
  run_json(kTrain + kCnn + " --patience 0 --epochs 2 --checkpoint " + ckpt);
  const std::string rows = pool(30);
  for (const std::string strategy : {"bald", "batchbald"}) {
    const nlohmann::json picked =
        run_json("--threads 1 acquire " + ckpt + " " + rows + " -b 5 --strategy " + strategy + " --json --device cpu");
    EXPECT_EQ(picked["pool_rows"], 30);
    std::set<int64_t> chosen;
    double previous = INFINITY;
    for (const auto& pick : picked["chosen"]) {
      const int64_t row = pick["row"].get<int64_t>();
      EXPECT_TRUE(row >= 0 && row < 30) << pick;
      chosen.insert(row);
      // BALD's batch is its top scores; BatchBALD's gains shrink as the batch grows.
      EXPECT_LE(pick["score"].get<double>(), previous + 1e-12) << strategy << ": " << picked;
      previous = pick["score"].get<double>();
    }
    EXPECT_EQ(chosen.size(), 5u) << strategy << ": " << picked;
  }
}

}  // namespace
}  // namespace packtrain::cli_testing
