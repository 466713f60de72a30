// The multi-task subcommands end to end: train, score and generate from a
// checkpoint, resume equal to the uninterrupted run, config files. (Data parallel:
// distributed_cli_test.cpp; bad input: bad_input_cli_test.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

TEST_F(Cli, MultitaskTrainScoreGenerateFromACheckpoint) {
  write_file(path("train.tsv"), yes_no_tsv(24));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const nlohmann::json report = run_json("multitask train " + kTinyMultitask + " --train " +
                                         path("train.tsv") + " --dev " + path("dev.tsv") + " -o " + path("mt.ckpt") +
                                         " --json");
  ASSERT_TRUE(report.is_object());
  EXPECT_EQ(report["epochs"].size(), 2u);
  EXPECT_EQ(report["dev_metrics"]["examples"], 8);
  EXPECT_GT(report["dev_metrics"]["perplexity"].get<double>(), 1.0);
  EXPECT_TRUE(fs::exists(path("mt.ckpt")));

  const Result scored = run("multitask score " + path("mt.ckpt") + " 'yes the cat.' 'no a dog ran.' --device cpu");
  EXPECT_EQ(scored.status, 0) << scored.out;
  EXPECT_THAT(scored.out, HasSubstr("\tyes the cat."));
  EXPECT_THAT(scored.out, HasSubstr("\tno a dog ran."));

  const nlohmann::json generated = run_json("multitask generate " + path("mt.ckpt") +
                                            " --prompt 'yes the' --max-new-tokens 10 --seed 3 --score --json --device cpu");
  ASSERT_TRUE(generated.is_object());
  EXPECT_EQ(generated["continuations"].size(), 1u);
  EXPECT_EQ(generated["probabilities"].size(), 2u);
  EXPECT_EQ(run_json("multitask generate " + path("mt.ckpt") +
                     " --prompt 'yes the' --max-new-tokens 10 --seed 3 --json --device cpu")["continuations"],
            generated["continuations"])
      << "the same seed gives the same text";
}

TEST_F(Cli, MultitaskResumeEqualsTheUninterruptedRunAndConfigFilesWork) {
  write_file(path("train.tsv"), yes_no_tsv(16));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const std::string data = " --train " + path("train.tsv") + " --dev " + path("dev.tsv");
  ASSERT_EQ(run("multitask train " + kTinyShape + data + " --epochs 1 -o " + path("a.ckpt")).status, 0);
  const nlohmann::json resumed = run_json("multitask resume " + path("a.ckpt") + " --epochs 3 --device cpu -q --json");
  // Epochs and width from a config file; the command line gives the rest.
  write_file(path("mt.toml"), "epochs = 3\nwidth = 16\n");
  const nlohmann::json straight = run_json("multitask train --config " + path("mt.toml") +
                                           " --layers 1 --max-length 32 --batch 4 --device cpu -q --heads 2 "
                                           "--buckets 16,32" + data + " -o " + path("b.ckpt") + " --json");
  ASSERT_TRUE(resumed.is_object() && straight.is_object());
  EXPECT_EQ(resumed["epochs"].size(), 2u);
  EXPECT_EQ(straight["epochs"].size(), 3u);
  EXPECT_EQ(resumed["dev_metrics"]["lm_loss"], straight["dev_metrics"]["lm_loss"]);
  EXPECT_EQ(resumed["dev_metrics"]["accuracy"], straight["dev_metrics"]["accuracy"]);
  const Result done = run("multitask resume " + path("a.ckpt") + " --epochs 3 --device cpu");
  EXPECT_EQ(done.status, 2);
  EXPECT_THAT(done.out, HasSubstr("is at epoch 3"));
}

}  // namespace
}  // namespace packtrain::cli_testing
