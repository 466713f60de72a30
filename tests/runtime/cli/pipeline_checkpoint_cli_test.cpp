// What a multitask run reads is never what it writes, and a pipeline checkpoint's
// stage files are checked against their manifest: an output naming the class
// names, the config or a stage file of the checkpoint resumed is refused (so is a
// stage file a pipeline save would write over an input); a stage file copied over
// another is refused by score, generate and resume, naming the file; a launched
// resume missing a stage file fails on every rank with that reason, exit 2; the
// pipeline flags' errors name the flags. (Pipeline runs: pipeline_cli_test.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Two blocks, so two stages have one each.
const std::string kPipelineShape =
    "--width 16 --layers 2 --max-length 32 --batch 4 --device cpu --heads 2 --buckets 16,32 -q";

class PipelineCheckpoint : public Cli {
 protected:
  // A two-stage checkpoint at `name` after one epoch on 16 sentences; its stage files
  // (stage 0, stage 1).
  std::pair<std::string, std::string> train_two_stages(const std::string& name) {
    write_file(path("train.tsv"), yes_no_tsv(16));
    write_file(path("dev.tsv"), yes_no_tsv(8));
    const Result r = launch(2, "multitask train " + kPipelineShape + " --epochs 1 --train " + path("train.tsv") +
                                   " --dev " + path("dev.tsv") + " --pipeline-stages 2 -o " + path(name));
    EXPECT_EQ(r.status, 0) << r.out;
    std::string stage0, stage1;
    for (const auto& entry : fs::directory_iterator(dir())) {
      const std::string file = entry.path().filename().string();
      if (file.rfind(name + ".stage0-of-2.step", 0) == 0) stage0 = entry.path().string();
      if (file.rfind(name + ".stage1-of-2.step", 0) == 0) stage1 = entry.path().string();
    }
    EXPECT_FALSE(stage0.empty() || stage1.empty()) << r.out;
    return {stage0, stage1};
  }
};

TEST_F(Cli, MultitaskOutputsNeverReplaceTheClassNamesOrTheConfig) {
  write_file(path("train.tsv"), yes_no_tsv(16));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const std::string data = " --train " + path("train.tsv") + " --dev " + path("dev.tsv");
  write_file(path("names.txt"), "no\nyes\n");
  const Result names = run("multitask train " + kTinyMultitask + data + " --class-names " + path("names.txt") + " -o " +
                           path("names.txt"));
  EXPECT_EQ(names.status, 2) << names.out;
  EXPECT_THAT(names.out, HasSubstr("is the same file as the input --class-names"));
  EXPECT_EQ(read_file(path("names.txt")), "no\nyes\n");

  write_file(path("mt.toml"), "epochs = 1\n");
  const Result config =
      run("multitask train --config " + path("mt.toml") + " " + kTinyShape + data + " -o " + path("mt.toml"));
  EXPECT_EQ(config.status, 2) << config.out;
  EXPECT_THAT(config.out, HasSubstr("is the same file as the input --config"));
  EXPECT_EQ(read_file(path("mt.toml")), "epochs = 1\n");

  // resume: the config given to it, and its log naming the run's training file or
  // the checkpoint.
  ASSERT_EQ(run("multitask train " + kTinyShape + data + " --epochs 1 -o " + path("a.ckpt")).status, 0);
  const Result resume_config = run("multitask resume --config " + path("mt.toml") + " " + path("a.ckpt") +
                                   " --epochs 2 --device cpu -q -o " + path("mt.toml"));
  EXPECT_EQ(resume_config.status, 2) << resume_config.out;
  EXPECT_THAT(resume_config.out, HasSubstr("is the same file as the input --config"));
  EXPECT_EQ(read_file(path("mt.toml")), "epochs = 1\n");
  const std::string train = read_file(path("train.tsv"));
  const Result log = run("multitask resume " + path("a.ckpt") + " --epochs 2 --device cpu -q -o " + path("b.ckpt") +
                         " --log " + path("train.tsv"));
  EXPECT_EQ(log.status, 2) << log.out;
  EXPECT_THAT(log.out, HasSubstr("is the same file as the input training file"));
  EXPECT_EQ(read_file(path("train.tsv")), train);
  // -o may replace the checkpoint resumed (the default); the log may not append to it.
  const std::string checkpoint = read_file(path("a.ckpt"));
  const Result log_over_checkpoint = run("multitask resume " + path("a.ckpt") + " --epochs 2 --device cpu -q -o " +
                                         path("b.ckpt") + " --log " + path("a.ckpt"));
  EXPECT_EQ(log_over_checkpoint.status, 2) << log_over_checkpoint.out;
  EXPECT_THAT(log_over_checkpoint.out,
              HasSubstr("--log " + path("a.ckpt") + " is the same file as the input checkpoint"));
  EXPECT_EQ(read_file(path("a.ckpt")), checkpoint);
}

TEST_F(PipelineCheckpoint, OutputsNeverReplaceAStageFileOfTheCheckpointOrAnInput) {
  const auto [stage0, stage1] = train_two_stages("pp.ckpt");
  const std::string before = read_file(stage0);
  // A resume writing over a stage file of the checkpoint it reads.
  const Result resumed = run("multitask resume " + path("pp.ckpt") + " --epochs 2 --device cpu -q -o " + stage0);
  EXPECT_EQ(resumed.status, 2) << resumed.out;
  EXPECT_THAT(resumed.out, HasSubstr("is the same file as the input stage file " + stage0));
  EXPECT_EQ(read_file(stage0), before);

  // A stage file the run's first save would write, named as an input: refused on
  // every rank before the first epoch.
  const std::string step = stage0.substr(stage0.rfind(".step"));
  const std::string names = path("q.ckpt.stage1-of-2") + step;
  write_file(names, "no\nyes\n");
  const Result trained =
      launch(2, "multitask train " + kPipelineShape + " --epochs 1 --train " + path("train.tsv") + " --dev " +
                    path("dev.tsv") + " --pipeline-stages 2 --class-names " + names + " -o " + path("q.ckpt"));
  EXPECT_EQ(trained.status, 2) << trained.out;
  EXPECT_THAT(trained.out, HasSubstr("'s stage file " + names + " is the same file as the input --class-names"));
  EXPECT_EQ(read_file(names), "no\nyes\n");
}

TEST_F(PipelineCheckpoint, AStageFileCopiedOverAnotherIsRefusedNamingIt) {
  const auto [stage0, stage1] = train_two_stages("x.ckpt");
  fs::copy_file(stage0, stage1, fs::copy_options::overwrite_existing);
  const std::string why = stage1 + ": not the stage 1 file that " + path("x.ckpt") + " committed";
  const Result score = run("multitask score " + path("x.ckpt") + " 'yes the cat.' --device cpu");
  EXPECT_EQ(score.status, 2) << score.out;
  EXPECT_THAT(score.out, HasSubstr(why));
  const Result generate = run("multitask generate " + path("x.ckpt") + " --prompt 'yes the' --device cpu");
  EXPECT_EQ(generate.status, 2) << generate.out;
  EXPECT_THAT(generate.out, HasSubstr(why));
  const Result resume = run("multitask resume " + path("x.ckpt") + " --epochs 2 --device cpu -q -o " + path("y.ckpt"));
  EXPECT_EQ(resume.status, 2) << resume.out;
  EXPECT_THAT(resume.out, HasSubstr(why));
  EXPECT_FALSE(fs::exists(path("y.ckpt")));
}

TEST_F(PipelineCheckpoint, ALaunchedResumeMissingAStageFileFailsOnEveryRankWithTheReason) {
  const auto [stage0, stage1] = train_two_stages("m.ckpt");
  fs::remove(stage1);
  const Result r = launch(2, "multitask resume " + path("m.ckpt") + " --epochs 2 --device cpu -q");
  EXPECT_EQ(r.status, 2) << r.out;
  const std::string why = "stage 1's file " + stage1 + " is missing";
  EXPECT_THAT(r.out, HasSubstr("[rank 0] packtrain: error: " + path("m.ckpt") + ": " + why)) << r.out;
  EXPECT_THAT(r.out, HasSubstr("[rank 1] packtrain: error: " + path("m.ckpt") + ": " + why)) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("Connection closed")));
}

TEST_F(Cli, PipelineFlagErrorsNameTheFlags) {
  const Result stages =
      run("multitask train " + kPipelineShape + " --epochs 1 --pipeline-stages 3 -o " + path("x.ckpt"));
  EXPECT_EQ(stages.status, 2) << stages.out;
  EXPECT_THAT(stages.out, HasSubstr("--pipeline-stages 3 exceeds --layers 2"));
  EXPECT_THAT(stages.out, Not(HasSubstr("model.layers")));
  const Result micro = run("multitask train " + kPipelineShape +
                           " --epochs 1 --pipeline-stages 2 --micro-batches 3 -o " + path("x.ckpt"));
  EXPECT_EQ(micro.status, 2) << micro.out;
  EXPECT_THAT(micro.out, HasSubstr("--micro-batches 3 does not divide --batch 4"));
  EXPECT_THAT(micro.out, Not(HasSubstr("micro_batches")));
  const Result separate = run("multitask train " + kPipelineShape +
                              " --epochs 1 --pipeline-stages 2 "
                              "--separate-lm-texts -o " +
                              path("x.ckpt"));
  EXPECT_EQ(separate.status, 2) << separate.out;
  EXPECT_THAT(separate.out, HasSubstr("--separate-lm-texts cannot be used with --pipeline-stages 2"));
  EXPECT_THAT(separate.out, Not(HasSubstr("shared_inputs")));
}

}  // namespace
}  // namespace packtrain::cli_testing
