// The multi-task subcommands end to end: train, score and generate from a
// checkpoint, resume equal to the uninterrupted run, config files. (Data parallel:
// distributed_cli_test.cpp; bad input: bad_input_cli_test.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

TEST_F(Cli, MultitaskTrainScoreGenerateFromACheckpoint) {
  write_file(path("train.tsv"), yes_no_tsv(24));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const nlohmann::json report = run_json("multitask train " + kTinyMultitask + " --train " + path("train.tsv") +
                                         " --dev " + path("dev.tsv") + " -o " + path("mt.ckpt") + " --json");
  ASSERT_TRUE(report.is_object());
  EXPECT_EQ(report["epochs"].size(), 2u);
  EXPECT_EQ(report["dev_metrics"]["examples"], 8);
  EXPECT_GT(report["dev_metrics"]["perplexity"].get<double>(), 1.0);
  EXPECT_TRUE(fs::exists(path("mt.ckpt")));

  const Result scored = run("multitask score " + path("mt.ckpt") + " 'yes the cat.' 'no a dog ran.' --device cpu");
  EXPECT_EQ(scored.status, 0) << scored.out;
  EXPECT_THAT(scored.out, HasSubstr("\tyes the cat."));
  EXPECT_THAT(scored.out, HasSubstr("\tno a dog ran."));

  const nlohmann::json generated =
      run_json("multitask generate " + path("mt.ckpt") +
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
                                           "--buckets 16,32" +
                                           data + " -o " + path("b.ckpt") + " --json");
  ASSERT_TRUE(resumed.is_object() && straight.is_object());
  EXPECT_EQ(resumed["epochs"].size(), 2u);
  EXPECT_EQ(straight["epochs"].size(), 3u);
  EXPECT_EQ(resumed["dev_metrics"]["lm_loss"], straight["dev_metrics"]["lm_loss"]);
  EXPECT_EQ(resumed["dev_metrics"]["accuracy"], straight["dev_metrics"]["accuracy"]);
  const Result done = run("multitask resume " + path("a.ckpt") + " --epochs 3 --device cpu");
  EXPECT_EQ(done.status, 2);
  EXPECT_THAT(done.out, HasSubstr("is at epoch 3"));
}

// More than two classes, named: the dev metrics stand beside the majority class's,
// score names the likeliest class, and a resume reads the dev labels against the
// model's classes.
TEST_F(Cli, MultitaskNamedClassesAreScoredByName) {
  std::string rows;
  const char* words[] = {"red apple", "green leaf", "blue sky"};
  for (int i = 0; i < 24; ++i) rows += std::to_string(i % 3) + "\t" + words[i % 3] + " " + std::to_string(i) + "\n";
  write_file(path("train.tsv"), rows);
  write_file(path("names.txt"), "red\ngreen\nblue\n");
  const std::string data = " --train " + path("train.tsv") + " --dev " + path("train.tsv");
  const nlohmann::json report = run_json("multitask train " + kTinyMultitask + data + " --class-names " +
                                         path("names.txt") + " -o " + path("c.ckpt") + " --json");
  ASSERT_TRUE(report.is_object());
  EXPECT_EQ(report["options"]["classes"], 3);
  EXPECT_EQ(report["class_names"], nlohmann::json({"red", "green", "blue"}));
  EXPECT_EQ(report["majority_class"]["class"], "red");  // 8 of each: the first
  EXPECT_NEAR(report["majority_class"]["accuracy"].get<double>(), 1.0 / 3, 1e-12);

  const nlohmann::json scored = run_json("multitask score " + path("c.ckpt") + " 'blue sky 3' --json --device cpu");
  ASSERT_TRUE(scored.is_array());
  EXPECT_EQ(scored[0]["probabilities"].size(), 3u);
  const std::vector<double> p = scored[0]["probabilities"].get<std::vector<double>>();
  const std::string names[] = {"red", "green", "blue"};
  EXPECT_EQ(scored[0]["class"], names[std::max_element(p.begin(), p.end()) - p.begin()]);
  const Result plain = run("multitask score " + path("c.ckpt") + " 'blue sky 3' --device cpu");
  EXPECT_THAT(plain.out, HasSubstr(scored[0]["class"].get<std::string>() + "\t"));
  EXPECT_EQ(run("multitask resume " + path("c.ckpt") + " --epochs 3 --device cpu -q").status, 0);

  // Without names, the labels imply the classes; a dev label beyond them is named.
  write_file(path("dev.tsv"), "3\tyellow sun\n");
  const Result beyond = run("multitask train " + kTinyMultitask + " --train " + path("train.tsv") + " --dev " +
                            path("dev.tsv") + " -o " + path("d.ckpt"));
  EXPECT_EQ(beyond.status, 2) << beyond.out;
  EXPECT_THAT(beyond.out, HasSubstr("dev.tsv:1: unknown label '3' (labels are integers 0 to 2)"));
  // Names fix the count: a training label beyond them is refused.
  write_file(path("two.txt"), "red\ngreen\n");
  const Result fewer =
      run("multitask train " + kTinyMultitask + data + " --class-names " + path("two.txt") + " -o " + path("d.ckpt"));
  EXPECT_EQ(fewer.status, 2) << fewer.out;
  EXPECT_THAT(fewer.out, HasSubstr("train.tsv:3: unknown label '2' (labels are integers 0 to 1)"));
}

// The default task: the classifier learns within one epoch of the default model —
// well above the majority class (20% accuracy, MCC 0) — and says that it does.
TEST_F(Cli, MultitaskDefaultTaskBeatsTheMajorityClass) {
  const Result r = run("multitask train --epochs 1 --device cpu -o " + path("lang.ckpt"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("train.tsv (8000 train / 1000 dev sentences, 5 classes)"));
  EXPECT_THAT(r.out, HasSubstr("Majority class ('English') on dev: accuracy 0.2000, Matthews correlation 0: the "
                               "classifier beats it"));
  std::smatch dev;
  ASSERT_TRUE(std::regex_search(r.out, dev,
                                std::regex("Dev \\(dev.tsv, 1000 sentences\\): accuracy ([0-9.]+), "
                                           "Matthews correlation ([-0-9.]+)")))
      << r.out;
  EXPECT_GT(std::stod(dev[1]), 0.5) << "accuracy";
  EXPECT_GT(std::stod(dev[2]), 0.4) << "Matthews correlation";
  const nlohmann::json scored =
      run_json("multitask score " + path("lang.ckpt") + " 'Der Hund schläft unter dem Tisch.' --json --device cpu");
  ASSERT_TRUE(scored.is_array());
  EXPECT_EQ(scored[0]["class"], "German");
}

}  // namespace
}  // namespace packtrain::cli_testing
