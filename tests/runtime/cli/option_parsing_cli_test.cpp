// Options read exactly and checked by what they mean, end to end: integers out of
// their type's range, strict sweep lists (flag and config file alike), acquisition
// strategies and interval levels a model cannot use, recalibration asked for where
// it cannot fit, and oversized requests: each exit 2 with one line saying what to
// change, never "internal error".
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kInt64Range = "must be an integer between -9223372036854775808 and 9223372036854775807";
constexpr const char* kUint64Range = "must be an integer between 0 and 18446744073709551615";
constexpr const char* kLevelTooClose =
    "--interval: must be at most 0.9999999999999998 (the upper tail (1 + level) / 2 of a larger level rounds to 1), "
    "got 0.9999999999999999";
// A regression checkpoint in seconds.
constexpr const char* kTinyRegression = "train --members 3 --epochs 2 --hidden 8 --device cpu --quiet";

// Exit 2 and one line holding `expect`.
void expect_usage_error(const Result& r, const std::string& expect, const std::string& what) {
  EXPECT_EQ(r.status, 2) << what << ": " << r.out;
  EXPECT_THAT(r.out, HasSubstr(expect)) << what;
  EXPECT_THAT(r.out, Not(HasSubstr("internal error"))) << what;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << what << ": one line: " << r.out;
}

std::vector<int64_t> chosen_rows(const nlohmann::json& j) {
  std::vector<int64_t> rows;
  for (const nlohmann::json& c : j["chosen"]) rows.push_back(c["row"].get<int64_t>());
  return rows;
}

// Beyond int64 (or below 0 for a uint64) CLI11's strtoll saturates and strtoull
// wraps: --epochs 2^63 trained 2^63 - 1 epochs, and --seed -1, 2^64 and -2^64 were
// all 2^64 - 1. (The missing data file or checkpoint after them stops the old code
// quickly; the range is checked first.)
TEST_F(Cli, IntegersBeyondTheirTypeAreRefusedWithTheRange) {
  const std::string missing = path("missing.csv");
  expect_usage_error(run("train --epochs 9223372036854775808 --device cpu --data " + missing),
                     std::string("--epochs: ") + kInt64Range + ", got 9223372036854775808", "epochs 2^63");
  // Below int64 and below the option's own bound (the schema's >= 0, checked first):
  // refused naming the bound, not saturated to -2^63.
  expect_usage_error(run("train --warmup-steps -9223372036854775809 --device cpu --data " + missing),
                     "--warmup-steps: must be >= 0, got -9223372036854775809", "warmup below int64");
  for (const std::string seed : {"-1", "18446744073709551616", "-18446744073709551616"}) {
    expect_usage_error(run("acquire " + path("missing.ckpt") + " " + missing + " --seed " + seed),
                       std::string("--seed: ") + kUint64Range + ", got " + seed, "acquire --seed " + seed);
  }
  // The same rule for a config file's key, at its line.
  write_file(path("run.toml"), "# a run\nepochs = 9223372036854775808\n");
  expect_usage_error(run("train --config " + path("run.toml") + " --device cpu --data " + missing),
                     path("run.toml") + ":2: --epochs: " + kInt64Range, "config epochs 2^63");
}

// A member-parallel manifest's counts: 2^63 read as -2^63, 2.5 as 2.
TEST_F(Cli, AManifestCountBeyondInt64IsRefusedWithTheRange) {
  const std::string input = concrete_csv("in.csv", 5, false);
  for (const std::string members : {"9223372036854775808", "2.5"}) {
    write_file(path("run.ckpt"),
               R"({"format": "packtrain-member-parallel-1", "members": )" + members +
                   R"(, "ranks": 1, "epoch": 0, "shards": [{"file": "s0", "first_member": 0, "members": 1}]})");
    expect_usage_error(run("predict " + path("run.ckpt") + " " + input + " --device cpu"),
                       std::string("bad member-parallel manifest: 'members' ") + kInt64Range + ", got " + members,
                       "members " + members);
  }
}

// Sweep lists: an empty element was dropped on the command line (and read as 0 in a
// config file), "" said "got 0", nan said "values repeat".
TEST_F(Cli, SweepListsAreReadStrictlyOnTheCommandLineAndInAConfigFile) {
  const std::string tail = " --device cpu --data " + path("missing.csv");
  const std::vector<std::pair<std::string, std::string>> flags = {
      {"--lr 1e-3,,2", "--lr: element 2 of '1e-3,,2' is empty"},
      {"--lr 1e-3,", "--lr: element 2 of '1e-3,' is empty"},
      {"--lr ,1e-3", "--lr: element 1 of ',1e-3' is empty"},
      {"--lr ''", "--lr: needs at least one number, got ''"},
      {"--lr 1e-3,nan", "--lr: element 2 of '1e-3,nan', 'nan', is not a finite number"},
      {"--weight-decay 0,inf", "--weight-decay: element 2 of '0,inf', 'inf', is not a finite number"},
      {"--dropout 0,abc", "--dropout: element 2 of '0,abc', 'abc', is not a number"},
      {"--lr 1e-3,2e-3,1e-3", "--lr: 0.001 is given twice (elements 1 and 3)"},
  };
  for (const auto& [args, expect] : flags) expect_usage_error(run("train " + args + tail), expect, args);
  const std::vector<std::pair<std::string, std::string>> config = {
      {"lr = 1e-3,,2", ":1: --lr: element 2 of '1e-3,,2' is empty"},
      {"lr = [1e-3, , 2]", ":1: --lr: element 2 of '1e-3,,2' is empty"},
      {"lr = ,1e-3", ":1: --lr: element 1 of ',1e-3' is empty"},
      {"lr = 1e-3,", ":1: 'lr = 1e-3,' ends with a comma: an element of the list is empty"},
      {"lr = [1e-3, nan]", ":1: --lr: element 2 of '1e-3,nan', 'nan', is not a finite number"},
  };
  for (const auto& [line, expect] : config) {
    write_file(path("sweep.toml"), line + "\n");
    expect_usage_error(run("train --config " + path("sweep.toml") + tail), path("sweep.toml") + expect, line);
  }
}

// A strategy of the other head, a UCB beta that is not finite or overflows the
// scores, an interval level whose tail rounds to 1, a level given twice, an
// interval asked of a classifier: all were "internal error" (exit 1), or exit 0
// with a CSV packtrain itself refuses to read.
TEST_F(Cli, AcquireAndPredictRefuseOptionsTheModelCannotUse) {
  const std::string reg = path("reg.ckpt");
  ASSERT_EQ(run(std::string(kTinyRegression) + " --checkpoint " + reg).status, 0);
  const std::string pool = concrete_csv("pool.csv", 50, false);
  expect_usage_error(run("acquire " + reg + " " + pool + " --strategy bald"),
                     "--strategy bald: the acquisition strategy 'bald' scores classification predictions; this model "
                     "is a regressor (use epistemic, variance, ucb or random)",
                     "acquire bald on a regressor");
  expect_usage_error(run("acquire " + reg + " " + pool + " --strategy batchbald"),
                     "--strategy batchbald: the acquisition strategy 'batchbald' scores classification predictions; "
                     "this model is a regressor (use epistemic, variance, ucb or random)",
                     "acquire batchbald on a regressor");
  for (const std::string beta : {"nan", "inf", "-1e308"}) {
    expect_usage_error(run("acquire " + reg + " " + pool + " --strategy ucb --ucb-beta " + beta),
                       "--ucb-beta: must be between -1000000 and 1000000, got " + beta, "ucb beta " + beta);
  }
  expect_usage_error(run("predict " + reg + " " + pool + " --interval 0.9999999999999999"), kLevelTooClose,
                     "predict level 1 - 1e-16");
  expect_usage_error(run("evaluate " + reg + " --device cpu --interval 0.9999999999999999"), kLevelTooClose,
                     "evaluate level 1 - 1e-16");
  expect_usage_error(run("predict " + reg + " " + pool + " --interval 0.9 --interval 0.5 --interval 0.9"),
                     "--interval 0.9 and --interval 0.9 are both the 90% interval: give each level once",
                     "a level twice");
  // "the input input": the positional input is named once.
  expect_usage_error(run("predict " + reg + " " + pool + " -o " + pool),
                     "-o " + pool + " is the same file as the input " + pool + ":", "-o over the input");

  const std::string cls = path("cls.ckpt");
  ASSERT_EQ(run("train --data wine-quality-red --head classification --members 2 --epochs 1 --hidden 8 --device cpu "
                "--quiet --checkpoint " +
                cls)
                .status,
            0);
  // The pool: 40 rows of the wine table's 11 feature columns (its last, the label, dropped).
  ASSERT_EQ(run_command("head -n 40 " + data_dir() +
                        "/wine-quality-red/data.txt | awk -v OFS=, '{NF--; $1=$1; print}' > " + path("wine.csv"))
                .status,
            0);
  for (const std::string strategy : {"epistemic", "ucb"}) {
    expect_usage_error(run("acquire " + cls + " " + path("wine.csv") + " --strategy " + strategy),
                       "this model is a classifier (use bald, batchbald, entropy, margin, variation-ratio or random)",
                       "acquire " + strategy + " on a classifier");
  }
  expect_usage_error(run("predict " + cls + " " + path("wine.csv") + " --interval 0.8"),
                     "--interval is for regression: this model is a classifier", "predict --interval on a classifier");
  const Result plain = run("predict " + cls + " " + path("wine.csv"));
  EXPECT_EQ(plain.status, 0) << "without --interval a classifier predicts: " << plain.out;
}

// The same strategies in the loop: refused before any round trains (they ended
// the loop as "internal error"), and --ucb-beta nan ran.
TEST_F(Cli, ActiveLearningRefusesAStrategyOfTheOtherHeadBeforeTraining) {
  const std::string tail = " --rounds 2 --initial 20 --acquire 5 --epochs 2 --device cpu --quiet --csv " +
                           path("c.csv") + " --plot " + path("c.svg");
  expect_usage_error(run("active-learn --strategy bald" + tail), "this model is a regressor", "bald, regression");
  expect_usage_error(run("active-learn --data wine-quality-red --head classification --strategy epistemic" + tail),
                     "this model is a classifier", "epistemic, classification");
  expect_usage_error(run("active-learn --strategy ucb --ucb-beta nan" + tail),
                     "--ucb-beta: must be between -1000000 and 1000000, got nan", "ucb beta nan");
}

// Gumbel top-k of power * score overflowed to +inf for every large score, a tie
// broken arbitrarily: an enormous power must tend to the top rows.
TEST_F(Cli, SoftmaxSamplingWithAHugePowerChoosesTheTopRows) {
  const std::string reg = path("reg.ckpt");
  ASSERT_EQ(run(std::string(kTinyRegression) + " --checkpoint " + reg).status, 0);
  const std::string pool = concrete_csv("pool.csv", 200, false);
  const std::string base = "acquire " + reg + " " + pool + " --count 8 --json --strategy variance";
  const nlohmann::json top = run_json(base);
  ASSERT_GT(top["chosen"][7]["score"].get<double>(), 2.0) << "scores whose product with 1e308 overflows";
  EXPECT_EQ(chosen_rows(run_json(base + " --selection softmax --power 1e308")), chosen_rows(top));
  EXPECT_EQ(chosen_rows(run_json(base + " --selection power --power 1e308")), chosen_rows(top));
}

// --recalibrate variance did nothing without validation rows or for a classifier,
// and fitted its scale on a validation row or two without a word.
TEST_F(Cli, RecalibrationAskedForWhereItCannotFitIsRefusedOrNoted) {
  expect_usage_error(run(std::string(kTinyRegression) + " --recalibrate variance --val-fraction 0"),
                     "--recalibrate variance fits its scale on validation rows, and this run has none",
                     "no validation rows");
  expect_usage_error(run("train --data wine-quality-red --head classification --recalibrate variance --members 2 "
                         "--epochs 1 --hidden 8 --device cpu --quiet"),
                     "a classifier has none (drop --recalibrate)", "a classifier");
  const std::string data = concrete_csv("small.csv", 40, true);
  const Result few = run("train --data " + data +
                         " --val-fraction 0.04 --test-fraction 0.25 --batch 4 --members 2 "
                         "--epochs 1 --hidden 8 --device cpu");
  ASSERT_EQ(few.status, 0) << few.out;
  EXPECT_THAT(few.out, HasSubstr("note: --recalibrate variance fits its scale on only 2 validation rows, too few"));
}

// Runs too large for the memory the process may have (a 4 GB address-space limit,
// below what the machine has free, so the estimate made before allocating lets
// them through): an allocation that fails was "internal error: std::bad_alloc".
// Either the estimate or the failed allocation now says what to lower.
TEST_F(Cli, RunsTooLargeForMemoryAreUsageErrors) {
  const auto limited = [&](const std::string& args) {
    return run_command("ulimit -v 4000000 && " + binary() + " " + args + " 2>&1");
  };
  const Result run =
      limited("train --members 1000000 --hidden 8 --depth 1 --epochs 1 --val-fraction 0 --device cpu --quiet");
  expect_usage_error(run, "lower --members, --hidden, --depth or --batch", "10^6 members");
  const Result sweep = limited("train --lr 1e-3,2e-3 --members 100000000 --device cpu --data " + path("missing.csv"));
  expect_usage_error(sweep, "--members", "a sweep of 2 x 10^8 members");
  // A cnn pack is its channels and feature maps: the refusal names them.
  const Result cnn = limited(
      "train --architecture cnn --data optdigits --channels 4096,4096 --members 4096 --epochs 1 "
      "--device cpu --quiet");
  expect_usage_error(cnn, "lower --members, --channels, --hidden or --batch, or shrink the feature maps",
                     "a huge cnn pack");
}

// `info_flag`'s schema (`packtrain info <info_flag> --json`) is what `command --help`
// lists: each field with a flag, with the schema's default and help; and the
// markdown table `info <info_flag>` prints has a row per flag. Returns the flags.
int expect_help_lists_its_schema(const std::string& command, const std::string& info_flag) {
  const nlohmann::json schema = run_json("info " + info_flag + " --json");
  const Result help = run(command + " --help");
  const Result table = run("info " + info_flag);
  EXPECT_EQ(help.status, 0) << help.out;
  EXPECT_EQ(table.status, 0) << table.out;
  int flags = 0;
  for (const nlohmann::json& f : schema) {
    const std::string flag = f.at("flag");
    if (flag.empty()) continue;
    ++flags;
    const size_t at = help.out.find("  " + flag + " ");
    const size_t at_end = help.out.find("  " + flag + "\n");
    if (at == std::string::npos && at_end == std::string::npos) {
      ADD_FAILURE() << flag << " not in " << command << " --help";
      continue;
    }
    const size_t begin = std::min(at, at_end);
    const std::string line = help.out.substr(begin, help.out.find('\n', begin) - begin);
    if (f.at("kind") != "flag") {
      // The strategy's default is the head's (runtime::default_strategy).
      const std::string shown = f.at("name") == "strategy" ? "epistemic|bald" : f.at("shown").get<std::string>();
      EXPECT_THAT(line, HasSubstr("=" + shown)) << command << " " << flag;
    }
    EXPECT_THAT(help.out, HasSubstr(f.at("help").get<std::string>())) << command << " " << flag;
    EXPECT_THAT(table.out, HasSubstr("| `" + flag + "` |")) << info_flag << " " << flag;
  }
  return flags;
}

TEST_F(Cli, ActiveLearnAndAcquireFlagsAreTheirOptionSchemas) {
  // initial, acquire, rounds, runs, no-random-baseline, al-seed and the acquisition's
  // four (its seed is --al-seed's business there: --seed is the trainer's).
  EXPECT_EQ(expect_help_lists_its_schema("active-learn", "--active-learning-options"), 10);
  EXPECT_EQ(expect_help_lists_its_schema("acquire", "--acquisition-options"), 5);  // strategy ... seed
  // Their bounds are the schema's, in the CLI's words.
  expect_usage_error(run("active-learn --runs 0 --device cpu"), "--runs: must be > 0, got 0", "runs 0");
  expect_usage_error(run("acquire " + path("missing.ckpt") + " " + path("missing.csv") + " --power -1"),
                     "--power: must be >= 0 and finite, got -1", "power -1");
}

// --no-random-baseline (the schema's random_baseline, off): the curve has no random
// column, and the pack only the strategy's runs.
TEST_F(Cli, ActiveLearnWithoutTheRandomBaseline) {
  const std::string out = " --csv " + path("c.csv") + " --plot " + path("c.svg");
  const std::string args =
      "active-learn --members 2 --epochs 2 --rounds 2 --initial 20 --acquire 5 --hidden 8 "
      "--device cpu --quiet --json" +
      out;
  const nlohmann::json with = run_json(args);
  const nlohmann::json without = run_json(args + " --no-random-baseline");
  EXPECT_EQ(with.at("pack_members"), 4);
  EXPECT_EQ(without.at("pack_members"), 2);
  ASSERT_EQ(without.at("curve").size(), 2u);
  EXPECT_TRUE(without.at("curve")[1].at("random_rmse").is_null());
  EXPECT_TRUE(with.at("curve")[1].at("random_rmse").is_number());
  // The strategy's runs are seeded alike with or without the baseline beside them.
  EXPECT_NEAR(without.at("curve")[0].at("epistemic_rmse").get<double>(),
              with.at("curve")[0].at("epistemic_rmse").get<double>(), 1e-9);
}

}  // namespace
}  // namespace packtrain::cli_testing
