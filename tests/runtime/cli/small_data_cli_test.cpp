// Small training sets: fewer training rows than --batch train in batches of all of
// them (the static batch), said once on stderr; data parallel, a batch of the
// training rows that the ranks cannot share equally is refused by name (exit 2).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// `rows` rows of y = a + 2b (a table the CLI splits 80/20, then holds out 10%).
std::string small_table(const fs::path& file, int rows) {
  std::string text = "a,b,y\n";
  for (int i = 0; i < rows; ++i)
    text += std::to_string(i % 7) + "," + std::to_string(i % 5) + "," + std::to_string(i % 7 + 2 * (i % 5)) + "\n";
  write_file(file, text);
  return file.string();
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST_F(Cli, TrainingSetSmallerThanTheBatchTrainsInOneBatchOfAllItsRows) {
  const std::string data = small_table(path("forty.csv"), 40);
  // 40 rows: 32 training rows after the test fraction, 28 after validation: one step an epoch.
  const nlohmann::json out =
      run_json("train --data " + data + " --members 2 --epochs 3 --hidden 8 --device cpu --json");
  EXPECT_EQ(out["epochs_run"], 3);
  ASSERT_FALSE(out["log"].empty());
  EXPECT_EQ(out["log"][0], "batch size 64 is larger than the training set (28 rows): training with batches of 28");
  EXPECT_EQ(count(out["log"].dump(), "larger than the training set"), 1) << out["log"];
  // said once on stderr, with the progress (not with --quiet)
  const Result shown = run("train --data " + data + " --members 2 --epochs 3 --hidden 8 --device cpu");
  ASSERT_EQ(shown.status, 0) << shown.out;
  EXPECT_EQ(count(shown.out, "training with batches of 28"), 1) << shown.out;
  EXPECT_THAT(shown.out, HasSubstr("epochs, batch 28,")) << shown.out;
  EXPECT_THAT(shown.out, HasSubstr("for 3 epochs (3 steps)")) << shown.out;
  const Result quiet = run("train --data " + data + " --members 2 --epochs 3 --hidden 8 --device cpu --quiet");
  ASSERT_EQ(quiet.status, 0) << quiet.out;
  EXPECT_THAT(quiet.out, Not(HasSubstr("training with batches")));
  // a batch that fits is used as given, without a note
  const Result fits = run("train --data " + data + " --members 2 --epochs 3 --hidden 8 --batch 8 --device cpu");
  ASSERT_EQ(fits.status, 0) << fits.out;
  EXPECT_THAT(fits.out, Not(HasSubstr("larger than the training set")));
}

TEST_F(Cli, DataParallelSmallTrainingSetThatTheRanksCannotShareIsRefused) {
  const std::string data = small_table(path("forty.csv"), 40);
  // 27 rows, all of them training rows: the global batch of 27 does not split over 2 ranks.
  const std::string odd_rows = small_table(path("twenty-seven.csv"), 27);
  const Result odd = launch(2, "train --data " + odd_rows +
                                   " --members 2 --epochs 1 --hidden 8 --device cpu "
                                   "--test-fraction 0 --val-fraction 0");
  EXPECT_EQ(odd.status, 2) << odd.out;
  EXPECT_THAT(odd.out, HasSubstr("the training set's 27 rows (fewer than the batch size 64, so the global batch) do "
                                 "not split into 2 equal per-rank batches: give a batch size of at most 27 that 2 "
                                 "divides"));
  // --val-fraction 0 leaves 32 training rows: 16 per rank
  const Result even = launch(2, "train --data " + data +
                                    " --members 2 --epochs 1 --hidden 8 --device cpu "
                                    "--val-fraction 0 --json --quiet");
  ASSERT_EQ(even.status, 0) << even.out;
  const nlohmann::json out = rank0_json(even.out);
  EXPECT_EQ(out["data_parallel"]["global_batch"], 32);
  EXPECT_EQ(out["data_parallel"]["per_rank_batch"], 16);
}

}  // namespace
}  // namespace packtrain::cli_testing
