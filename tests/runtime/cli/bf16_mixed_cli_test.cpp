// --precision bf16-mixed through every feature that is not precision-specific, on
// small fast packs: MLP members on concrete (regression) — early stopping with the
// best weights restored, a learning-rate x dropout sweep with --select best,
// recalibration, checkpoints and resume (bit for bit) with the precision recorded,
// member parallel and data parallel (gloo, two ranks) — and cnn members on optdigits.
// The accuracy it keeps against fp32 on the UCI protocol is measured, not tested
// (benchmarks/RESULTS.md); here only that it learns as fp32 does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

const std::string kTrain = "--threads 1 train ";
const std::string kMlp =
    "--data concrete --members 3 --hidden 32 --depth 2 --batch 64 --device cpu --quiet --json --precision bf16-mixed";
// The same pack in fp32.
const std::string kMlpFp32 = "--data concrete --members 3 --hidden 32 --depth 2 --batch 64 --device cpu --quiet --json";
const std::string kCnn =
    "--data optdigits --architecture cnn --channels 4,8 --hidden 16 --depth 1 --members 3 --head classification "
    "--device cpu --quiet --json --precision bf16-mixed";

using Bf16Mixed = Cli;

TEST_F(Bf16Mixed, TrainsAsFp32DoesAndSaysItsPrecision) {
  const nlohmann::json mixed = run_json(kTrain + kMlp + " --epochs 40 --patience 0");
  const nlohmann::json fp32 = run_json(kTrain + kMlpFp32 + " --epochs 40 --patience 0");
  EXPECT_EQ(mixed["precision"], "bf16-mixed");
  EXPECT_EQ(fp32["precision"], "fp32");
  // Learned (concrete's strength has an sd of about 16.7 MPa) and as well as fp32 to
  // within a fifth; not the same numbers (the products ran in bfloat16).
  const double a = mixed["ensemble"]["rmse"].get<double>(), b = fp32["ensemble"]["rmse"].get<double>();
  EXPECT_LT(a, 10.0);
  EXPECT_NEAR(a, b, 0.2 * b);
  EXPECT_NE(mixed["ensemble"]["nll"], fp32["ensemble"]["nll"]);
  const Result text = run(kTrain + "--data concrete --members 2 --epochs 1 --device cpu --precision bf16-mixed");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("on cpu in bf16-mixed."));
}

// `info` says whether this CPU multiplies bfloat16 in hardware, as /proc/cpuinfo's
// flags do (LibTorch's CPU capabilities are what packtrain reads).
TEST_F(Bf16Mixed, InfoSaysWhetherTheCpuHasBfloat16MatrixUnits) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo.good()) GTEST_SKIP() << "no /proc/cpuinfo to compare with";
  std::string line;
  bool flags_say = false, found = false;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    found = true;
    std::istringstream words(line);
    for (std::string w; words >> w;) flags_say = flags_say || w == "avx512_bf16" || w == "amx_bf16";
    break;
  }
  if (!found) GTEST_SKIP() << "/proc/cpuinfo lists no flags";
  const nlohmann::json info = run_json("info --json");
  ASSERT_TRUE(info["cpu_bf16_matrix_units"].is_boolean()) << info;
  EXPECT_EQ(info["cpu_bf16_matrix_units"].get<bool>(), flags_say);
}

TEST_F(Bf16Mixed, EarlyStoppingStopsMembersAtTheirBestEpoch) {
  const nlohmann::json r = run_json(kTrain + kMlp + " --epochs 200 --patience 3 --early-stopping member --lr 0.03");
  ASSERT_LT(r["epochs_run"].get<int>(), 200) << r["members"];
  for (const auto& m : r["members"]) {
    EXPECT_EQ(m["status"], "stopped") << m;
    EXPECT_LE(m["best_epoch"].get<int>(), r["epochs_run"].get<int>() - 3) << m;
  }
}

TEST_F(Bf16Mixed, ASweepOfRatesAndDropoutSelectsItsBestConfiguration) {
  const nlohmann::json r =
      run_json(kTrain + kMlp + " --epochs 4 --patience 0 --lr 0.001,0.01 --dropout 0,0.2 --select best");
  const auto& configurations = r["configurations"];
  ASSERT_EQ(configurations.size(), 4u) << r;
  size_t best = 0;
  for (size_t c = 1; c < 4; ++c) {
    if (configurations[c]["val_loss"] < configurations[best]["val_loss"]) best = c;
  }
  ASSERT_EQ(r["members"].size(), 12u);
  for (size_t k = 0; k < 12; ++k) EXPECT_EQ(r["members"][k]["in_ensemble"].get<bool>(), k / 3 == best) << k;
}

TEST_F(Bf16Mixed, RecalibrationFitsItsScaleAndLeavesTheMean) {
  const std::string args = kTrain + kMlp + " --epochs 5 --patience 0";
  const nlohmann::json fitted = run_json(args);
  const nlohmann::json raw = run_json(args + " --recalibrate none");
  EXPECT_NE(fitted["variance_scale"].get<double>(), 1.0);
  EXPECT_EQ(raw["variance_scale"].get<double>(), 1.0);
  EXPECT_EQ(fitted["ensemble"]["rmse"], raw["ensemble"]["rmse"]);
  EXPECT_NE(fitted["ensemble"]["nll"], raw["ensemble"]["nll"]);
}

TEST_F(Bf16Mixed, AResumedRunEqualsTheUninterruptedOneBitForBitAndKeepsItsPrecision) {
  const std::string args = kTrain + kMlp + " --patience 0 --dropout 0.1";
  const nlohmann::json full = run_json(args + " --epochs 4 --checkpoint " + path("full.ckpt"));
  run_json(args + " --epochs 2 --checkpoint " + path("part.ckpt"));
  // The checkpoint's precision, not the default: no --precision here.
  const nlohmann::json resumed =
      run_json("--threads 1 resume " + path("part.ckpt") + " --epochs 4 --device cpu --quiet --json");
  EXPECT_EQ(resumed["precision"], "bf16-mixed");
  EXPECT_EQ(resumed["epochs_run"], 4);
  EXPECT_EQ(resumed["ensemble"], full["ensemble"]);
  EXPECT_EQ(resumed["members"], full["members"]);
  const std::string rows = concrete_csv("rows.csv", 20, false);
  const Result a = run("--threads 1 predict " + path("full.ckpt") + " " + rows + " --members --device cpu");
  const Result b = run("--threads 1 predict " + path("part.ckpt") + " " + rows + " --members --device cpu");
  ASSERT_EQ(a.status, 0) << a.out;
  EXPECT_EQ(a.out, b.out);  // resume wrote part.ckpt at epoch 4
  const nlohmann::json evaluated = run_json("--threads 1 evaluate " + path("full.ckpt") + " --json --device cpu");
  EXPECT_EQ(evaluated["precision"], "bf16-mixed");
  EXPECT_EQ(evaluated["ensemble"], full["ensemble"]);
}

TEST_F(Bf16Mixed, MemberParallelEqualsOneProcess) {
  const std::string args = kTrain + kMlp + " --patience 0 --epochs 3 --dropout 0.1 --recalibrate none";
  const nlohmann::json single = run_json(args);
  const Result launched = launch(2, args + " --member-parallel");
  ASSERT_EQ(launched.status, 0) << launched.out;
  const nlohmann::json parallel = rank0_json(launched.out);
  ASSERT_EQ(parallel["members"].size(), 3u) << launched.out;
  // Members 0-1 on rank 0, member 2 on rank 1, each initialized and trained as in
  // one process, in the same arithmetic: the same numbers.
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_DOUBLE_EQ(parallel["members"][k]["rmse"].get<double>(), single["members"][k]["rmse"].get<double>())
        << "member " << k;
  }
}

TEST_F(Bf16Mixed, DataParallelTwoRanksAgreeWithOneProcessWithTheDoubledBatch) {
  const std::string args = kTrain + kMlp + " --patience 0 --epochs 3";  // --batch 64
  const nlohmann::json single = run_json(args);
  const Result launched = launch(2, args);
  ASSERT_EQ(launched.status, 0) << launched.out;
  const nlohmann::json parallel = rank0_json(launched.out);
  EXPECT_EQ(parallel["data_parallel"]["per_rank_batch"], 32) << launched.out;
  // Two half-batch gradients averaged instead of one batch-64 mean: the products'
  // bfloat16 results round differently (a step of 2^-8 relative) and 3 epochs carry
  // that on (measured 2e-4 relative in the NLL, 2026-12-07); batch 32 alone would
  // differ by percents.
  for (size_t k = 0; k < 3; ++k) {
    const double a = parallel["members"][k]["nll"].get<double>(), b = single["members"][k]["nll"].get<double>();
    EXPECT_NEAR(a, b, 2e-3 * std::abs(b)) << "member " << k;
  }
}

TEST_F(Bf16Mixed, CnnMembersTrainAndResumeBitForBit) {
  const std::string args = kTrain + kCnn + " --patience 0";
  const nlohmann::json full = run_json(args + " --epochs 3 --checkpoint " + path("full.ckpt"));
  run_json(args + " --epochs 2 --checkpoint " + path("part.ckpt"));
  EXPECT_GT(full["ensemble"]["accuracy"].get<double>(), 0.5);  // chance: 0.1
  const nlohmann::json resumed =
      run_json("--threads 1 resume " + path("part.ckpt") + " --epochs 3 --device cpu --quiet --json");
  EXPECT_EQ(resumed["precision"], "bf16-mixed");
  EXPECT_EQ(resumed["ensemble"], full["ensemble"]);
}

// The multi-task transformer in bf16-mixed: two pipeline stages (each stage's blocks
// under autocast, float32 activations between them) and two data-parallel ranks train
// the model one process trains.
TEST_F(Bf16Mixed, MultitaskPipelineStagesAndDataParallelRanksTrainAsOneProcess) {
  write_file(path("train.tsv"), yes_no_tsv(24));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const std::string args =
      "multitask train --width 16 --layers 2 --max-length 32 --batch 4 --device cpu --heads 2 --buckets 16,32 -q "
      "--epochs 2 --precision bf16-mixed --json --train " +
      path("train.tsv") + " --dev " + path("dev.tsv");
  const nlohmann::json single = run_json(args + " -o " + path("one.ckpt"));
  ASSERT_TRUE(single.is_object());
  for (const std::string parallel : {" --pipeline-stages 2 --micro-batches 2", ""}) {
    const Result launched = launch(2, args + parallel + " -o " + path("two.ckpt"));
    ASSERT_EQ(launched.status, 0) << launched.out;
    const nlohmann::json r = rank0_json(launched.out);
    ASSERT_TRUE(r.is_object()) << launched.out;
    // Gradients summed in another order (micro-batches, or two ranks' halves) round
    // some bfloat16 products the other way (measured 2e-6 and 1e-5 relative in the dev
    // LM loss, 2026-12-07); 1e-3 leaves room and is far below a missed step's change.
    const double a = r["dev_metrics"]["lm_loss"].get<double>(), b = single["dev_metrics"]["lm_loss"].get<double>();
    EXPECT_NEAR(a, b, 1e-3 * std::abs(b)) << parallel;
  }
}

}  // namespace
}  // namespace packtrain::cli_testing
