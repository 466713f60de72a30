// `multitask train --pipeline-stages S` end to end, each stage its own process
// under `packtrain launch`: the same model as one process (S = 2 and 4), the
// placement printed, checkpoints per stage with a manifest that resumes on the
// same S (and assembles in one process for score and resume), another S refused,
// S x R ranks (R replicas of the pipeline) the same model as one process too,
// a killed stage ends the other with an error naming the stages and the step.
// (The library-level float64 equivalence: tests/runtime/trainers/multitask/pipeline_training_test.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <string>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

// kTinyShape with more blocks, so 2 and 4 stages have some to split.
std::string pipeline_shape(int layers, bool quiet = true) {
  return "--width 16 --layers " + std::to_string(layers) +
         " --max-length 32 --batch 4 --device cpu --heads 2 "
         "--buckets 16,32" +
         (quiet ? " -q" : "");
}

// Two float32 runs whose gradients are summed in another order (micro-batches
// against the whole batch) agree in the dev LM loss to ~1e-6 relative after these
// few dozen Adam steps; 1e-4 leaves room and is still far below what one missed or
// repeated step changes (~1e-2).
constexpr double kRelativeTolerance = 1e-4;

void expect_same_metrics(const nlohmann::json& a, const nlohmann::json& b) {
  const double la = a["dev_metrics"]["lm_loss"].get<double>(), lb = b["dev_metrics"]["lm_loss"].get<double>();
  EXPECT_NEAR(la, lb, kRelativeTolerance * std::abs(lb));
  EXPECT_EQ(a["dev_metrics"]["accuracy"], b["dev_metrics"]["accuracy"]);
  EXPECT_EQ(a["epochs"].size(), b["epochs"].size());
}

TEST_F(Cli, PipelineTwoStagesTrainTheSameModelAsOneProcess) {
  write_file(path("train.tsv"), yes_no_tsv(24));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const std::string args = "multitask train " + pipeline_shape(2) + " --epochs 2 --train " + path("train.tsv") +
                           " --dev " + path("dev.tsv") + " --json";
  const nlohmann::json single = run_json(args + " -o " + path("one.ckpt"));
  const Result launched = launch(2, args + " --pipeline-stages 2 --micro-batches 2 -o " + path("two.ckpt"));
  ASSERT_EQ(launched.status, 0) << launched.out;
  const nlohmann::json pipelined = rank0_json(launched.out);
  ASSERT_TRUE(pipelined.is_object() && single.is_object()) << launched.out;
  expect_same_metrics(pipelined, single);

  // The manifest names one file per stage; both are there, and nothing older.
  EXPECT_TRUE(fs::exists(path("two.ckpt")));
  int stage_files = 0;
  for (const auto& entry : fs::directory_iterator(dir())) {
    if (entry.path().filename().string().rfind("two.ckpt.stage", 0) == 0) ++stage_files;
  }
  EXPECT_EQ(stage_files, 2);

  // One process assembles the stages: it scores as the one-process model does.
  const nlohmann::json a = run_json("multitask score " + path("two.ckpt") + " 'yes the cat.' --json --device cpu");
  const nlohmann::json b = run_json("multitask score " + path("one.ckpt") + " 'yes the cat.' --json --device cpu");
  ASSERT_TRUE(a.is_array() && b.is_array() && a.size() == 1 && b.size() == 1) << a.dump() << b.dump();
  const std::vector<double> pa = a[0]["probabilities"], pb = b[0]["probabilities"];
  ASSERT_EQ(pa.size(), 2u);
  ASSERT_EQ(pb.size(), 2u);
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_NEAR(pa[i], pb[i], 1e-4) << i;
}

TEST_F(Cli, PipelinePrintsItsPlacementAndFourStagesEqualOneProcess) {
  write_file(path("train.tsv"), yes_no_tsv(16));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const std::string data = " --train " + path("train.tsv") + " --dev " + path("dev.tsv");
  const std::string args = "multitask train " + pipeline_shape(4) + " --epochs 1" + data;
  const nlohmann::json single = run_json(args + " --json -o " + path("one.ckpt"));
  const Result launched = launch(4, args + " --json --pipeline-stages 4 --micro-batches 4 -o " + path("four.ckpt"));
  ASSERT_EQ(launched.status, 0) << launched.out;
  const nlohmann::json pipelined = rank0_json(launched.out);
  ASSERT_TRUE(pipelined.is_object()) << launched.out;
  expect_same_metrics(pipelined, single);

  // The placement, the schedule and the tied embedding, in plain words (not -q, no --json).
  const Result described = launch(2, "multitask train " + pipeline_shape(4, false) + " --epochs 1" + data +
                                         " --pipeline-stages 2 --micro-batches 2 -o " + path("two.ckpt"));
  ASSERT_EQ(described.status, 0) << described.out;
  const std::string& out = described.out;
  EXPECT_THAT(out, HasSubstr("pipeline of 2 stages over 2 ranks"));
  EXPECT_THAT(out, HasSubstr("1F1B"));
  EXPECT_THAT(out, HasSubstr("(S-1)/(M+S-1) = 0.33"));
  EXPECT_THAT(out, HasSubstr("stage 0 (rank 0): blocks 0-"));
  EXPECT_THAT(out, HasSubstr("stage 1 (rank 1): blocks "));
  EXPECT_THAT(out, HasSubstr("MB of parameters, gradients and Adam state"));
  EXPECT_THAT(out, HasSubstr("their gradients are summed every step"));
}

TEST_F(Cli, PipelineResumesOnTheSameStagesAndRefusesAnother) {
  write_file(path("train.tsv"), yes_no_tsv(16));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const std::string data = " --train " + path("train.tsv") + " --dev " + path("dev.tsv");
  const std::string args = "multitask train " + pipeline_shape(2) + data + " --pipeline-stages 2 --micro-batches 2";
  ASSERT_EQ(launch(2, args + " --epochs 1 -o " + path("a.ckpt")).status, 0);
  const Result straight = launch(2, args + " --epochs 3 --json -o " + path("b.ckpt"));
  const Result resumed = launch(2, "multitask resume " + path("a.ckpt") + " --epochs 3 --device cpu -q --json");
  ASSERT_EQ(straight.status, 0) << straight.out;
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  const nlohmann::json s = rank0_json(straight.out), r = rank0_json(resumed.out);
  ASSERT_TRUE(s.is_object() && r.is_object()) << straight.out << resumed.out;
  EXPECT_EQ(r["epochs"].size(), 2u);
  EXPECT_EQ(r["dev_metrics"]["lm_loss"], s["dev_metrics"]["lm_loss"]) << "resumed on the same stages: exactly";
  EXPECT_EQ(r["dev_metrics"]["accuracy"], s["dev_metrics"]["accuracy"]);

  // One process assembles the stages and goes on as the whole model.
  const nlohmann::json alone =
      run_json("multitask resume " + path("b.ckpt") + " --epochs 4 --device cpu -q --json -o " + path("c.ckpt"));
  ASSERT_TRUE(alone.is_object());
  EXPECT_EQ(alone["epochs"].size(), 1u);

  // Three ranks for a two-stage checkpoint: refused, naming both.
  const Result wrong = launch(3, "multitask resume " + path("a.ckpt") + " --epochs 3 --device cpu -q");
  EXPECT_NE(wrong.status, 0);
  EXPECT_THAT(wrong.out, HasSubstr("a pipeline run of 2 stages resumes on 2 ranks (or a multiple: stages x "
                                   "replicas), not 3"));
}

// Pipeline x data parallel: 2 stages x 2 replicas on 4 ranks train the one-process
// model, say how the ranks split, save one set of stage files, and resume the
// 2-stage checkpoint on 2 ranks as it left off.
TEST_F(Cli, PipelineTimesDataParallelTrainsTheSameModelAsOneProcess) {
  write_file(path("train.tsv"), yes_no_tsv(16));
  write_file(path("dev.tsv"), yes_no_tsv(80));  // two evaluation batches of 64: one per replica
  const std::string args = "multitask train " + pipeline_shape(2, false) + " --epochs 2 --train " + path("train.tsv") +
                           " --dev " + path("dev.tsv");
  const nlohmann::json single = run_json(args + " --json -o " + path("one.ckpt"));
  const Result launched = launch(4, args + " --pipeline-stages 2 --micro-batches 2 -o " + path("four.ckpt"));
  ASSERT_EQ(launched.status, 0) << launched.out;
  EXPECT_THAT(launched.out, HasSubstr("pipeline of 2 stages over 4 ranks"));
  EXPECT_THAT(launched.out, HasSubstr("2 replicas of the pipeline (ranks = 2 stages x 2 replicas; rank r: stage r % 2 "
                                      "of replica r / 2), each on 2 of the batch's 4 sentences"));
  EXPECT_THAT(launched.out, HasSubstr("stage 1 (ranks 1, 3): blocks 1-1"));
  const Result json = launch(4, args + " --json -q --pipeline-stages 2 --micro-batches 2 -o " + path("four.ckpt"));
  ASSERT_EQ(json.status, 0) << json.out;
  const nlohmann::json pipelined = rank0_json(json.out);
  ASSERT_TRUE(pipelined.is_object()) << json.out;
  expect_same_metrics(pipelined, single);
  EXPECT_EQ(pipelined["dev_metrics"]["examples"], 80) << "each dev sentence counted once over the replicas";
  EXPECT_EQ(pipelined["dev_metrics"]["tokens"], single["dev_metrics"]["tokens"]);
  int stage_files = 0;
  for (const auto& entry : fs::directory_iterator(dir())) {
    if (entry.path().filename().string().rfind("four.ckpt.stage", 0) == 0) ++stage_files;
  }
  EXPECT_EQ(stage_files, 2) << "one file per stage: a stage's replicas hold the same weights";

  // A batch that does not split into replicas x micro-batches: refused before training.
  const Result odd = launch(4, args + " -q --pipeline-stages 2 --micro-batches 4 -o " + path("x.ckpt"));
  EXPECT_NE(odd.status, 0);
  EXPECT_THAT(odd.out, HasSubstr("--batch 4 does not split into 2 replica(s) x 4 micro-batches of equal size"));

  // The 4-rank run's checkpoint resumes on 2 ranks (1 replica): the global batch is the same.
  const Result resumed = launch(2, "multitask resume " + path("four.ckpt") + " --epochs 3 --device cpu -q --json");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_EQ(rank0_json(resumed.out)["epochs"].size(), 1u);
}

// --pipeline-balance time: rank 0 times the pieces, every stage prints its measured
// milliseconds, the checkpoint records the blocks, and a resumed run (2 replicas
// this time) holds the same blocks without measuring again.
TEST_F(Cli, PipelinePlacedByMeasuredTimeResumesOntoTheSameBlocks) {
  write_file(path("train.tsv"), yes_no_tsv(16));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const std::string data = " --train " + path("train.tsv") + " --dev " + path("dev.tsv");
  const Result timed = launch(2, "multitask train " + pipeline_shape(4, false) + " --epochs 1" + data +
                                     " --pipeline-stages 2 --pipeline-balance time -o " + path("t.ckpt"));
  ASSERT_EQ(timed.status, 0) << timed.out;
  EXPECT_THAT(timed.out,
              ::testing::ContainsRegex("stage 0 \\(rank 0\\): blocks 0-[0-9].* ms per micro-batch \\(measured\\)"));
  EXPECT_THAT(timed.out,
              ::testing::ContainsRegex("stage 1 \\(rank 1\\): blocks [1-3]-3.* ms per micro-batch \\(measured\\)"));
  const Result json = launch(4, "multitask resume " + path("t.ckpt") + " --epochs 2 --device cpu -q --json");
  ASSERT_EQ(json.status, 0) << json.out;
  const nlohmann::json resumed = rank0_json(json.out);
  ASSERT_TRUE(resumed.is_object()) << json.out;
  EXPECT_EQ(resumed["options"]["pipeline_balance"], "time");
  ASSERT_EQ(resumed["options"]["pipeline_boundaries"].size(), 1u);
  const int64_t boundary = resumed["options"]["pipeline_boundaries"][0];
  EXPECT_THAT(timed.out, HasSubstr("stage 1 (rank 1): blocks " + std::to_string(boundary) + "-3"));
  // Resumed into another file, in words: the recorded blocks, nothing measured, and
  // the checkpoint it resumed left whole (one process still assembles it).
  const Result words =
      launch(2, "multitask resume " + path("t.ckpt") + " --epochs 3 --device cpu -o " + path("u.ckpt"));
  ASSERT_EQ(words.status, 0) << words.out;
  EXPECT_THAT(words.out, HasSubstr("stage 1 (rank 1): blocks " + std::to_string(boundary) + "-3"));
  EXPECT_THAT(words.out, ::testing::Not(HasSubstr("(measured)")));
  const nlohmann::json scored = run_json("multitask score " + path("t.ckpt") + " 'yes the cat.' --json --device cpu");
  EXPECT_TRUE(scored.is_array() && scored.size() == 1) << scored.dump();
  const Result bad = run("multitask train " + pipeline_shape(4) + " --epochs 1 --pipeline-balance speed");
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.out, HasSubstr("unknown pipeline balance 'speed' (expected parameters or time)"));
}

// A stage killed in the middle of a save — its new stage file written, its old one
// not yet deleted (two of its files side by side: between its write and the
// manifest's commit, or just after) — leaves a checkpoint that is whole: the
// manifest names stage files of one save, all present, and one process assembles
// and scores it. The kill is timed by watching the files, so it lands in a save
// whatever the machine's speed.
TEST_F(Cli, APipelineStageKilledMidSaveLeavesAWholeCheckpoint) {
  write_file(path("train.tsv"), yes_no_tsv(16));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const std::string ckpt = path("m.ckpt");
  const std::string train = "multitask train " + pipeline_shape(2) + " --epochs 400 --train " + path("train.tsv") +
                            " --dev " + path("dev.tsv") + " --pipeline-stages 2 --micro-batches 2 -o " + ckpt;
  // Shell builtins only (no process per poll): rank 1's stage files, until two coexist.
  const std::string kill_mid_save = "(while :; do set -- '" + ckpt +
                                    "'.stage1-of-2.step*; [ $# -ge 2 ] && [ -e \"$2\" ] "
                                    "&& break; done; kill -9 $pid; echo killed-mid-save)";
  const Result r =
      run_ranks_by_hand({.env = {{"PACKTRAIN_COLLECTIVE_TIMEOUT", "10"}}, .meanwhile = kill_mid_save}, train);
  ASSERT_THAT(r.out, HasSubstr("killed-mid-save")) << r.out;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("rank0 exit [1-9]")) << "rank 0 outlived its stage 1: " << r.out;
  ASSERT_TRUE(fs::exists(ckpt)) << r.out;
  const nlohmann::json scored = run_json("multitask score " + ckpt + " 'yes the cat.' --json --device cpu");
  ASSERT_TRUE(scored.is_array() && scored.size() == 1) << scored.dump();
  EXPECT_EQ(scored[0]["probabilities"].size(), 2u);
}

TEST_F(Cli, PipelineNeedsOneRankPerStage) {
  const Result r = run("multitask train " + pipeline_shape(2) + " --epochs 1 --pipeline-stages 2 -o " + path("x.ckpt"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--pipeline-stages 2 needs 2 processes, one per stage"));
  const Result too_many =
      launch(2, "multitask train " + pipeline_shape(2) + " --epochs 1 --pipeline-stages 3 -o " + path("x.ckpt"));
  EXPECT_NE(too_many.status, 0);
  EXPECT_THAT(too_many.out, HasSubstr("--pipeline-stages 3 exceeds --layers 2"));
}

TEST_F(Cli, AKilledStageEndsTheOtherNamingTheStagesAndTheStep) {
  // The bundled CoLA set: an epoch of ~2000 steps, so the kill lands mid-epoch.
  const std::string train =
      "multitask train " + pipeline_shape(2) + " --epochs 1 --pipeline-stages 2 -o " + path("k.ckpt");
  const auto start = std::chrono::steady_clock::now();
  const Result r =
      run_ranks_by_hand({.env = {{"PACKTRAIN_COLLECTIVE_TIMEOUT", "10"}}, .meanwhile = kill_after(4, "-9")}, train);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(r.out, HasSubstr("rank0 exit 1")) << r.out;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("stage [01] to stage [01] at step [0-9]+ failed on rank 0 of 2"))
      << r.out;
  EXPECT_LT(seconds, 70) << "the surviving stage must not hang";
}

}  // namespace
}  // namespace packtrain::cli_testing
