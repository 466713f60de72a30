// Image and sequence data from .npy arrays on the command line: the bundled
// optdigits trains a classifier well above chance, and a malformed array given by
// path is a data error (exit 2) naming the file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/runtime/cli/cli_harness.h"
#include "tests/runtime/data/npy_bytes.h"

namespace packtrain::cli_testing {
namespace {

using packtrain::testing::npy;
using packtrain::testing::raw_bytes;
using ::testing::HasSubstr;

TEST_F(Cli, OptdigitsTrainsAClassifierWellAboveChance) {
  // 10 classes (chance 0.1); 1,437 training rows less validation, 360 test rows.
  const nlohmann::json out =
      run_json("train --data optdigits --head classification --members 4 --epochs 5 --hidden 64 --device cpu --json");
  const double accuracy = out["ensemble"]["accuracy"].get<double>();
  EXPECT_GT(accuracy, 0.5) << out.dump();
  EXPECT_LE(accuracy, 1.0);
  const Result shown =
      run("train --data optdigits --head classification --members 2 --epochs 1 --hidden 16 --device cpu");
  ASSERT_EQ(shown.status, 0) << shown.out;
  EXPECT_THAT(shown.out, HasSubstr("64 features, samples of shape (1, 8, 8)")) << shown.out;
}

TEST_F(Cli, MnistOneDKeepsItsOwnSplit) {
  const Result r = run("train --data mnist1d --head classification --members 2 --epochs 1 --hidden 16 --device cpu");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("own train / test split (3600 train / 400 validation / 1000 test rows, 40 features, "
                               "samples of shape (1, 40))"))
      << r.out;
}

// Active learning with convolutional members: the images' shape reaches every
// round's pack, so a cnn trains on the labelled rows and scores the pool.
TEST_F(Cli, ActiveLearningOnImagesWithCnnMembers) {
  const nlohmann::json out = run_json(
      "active-learn --data optdigits --head classification --architecture cnn --channels 4 --hidden 16 --depth 1 "
      "--members 2 --rounds 2 --initial 100 --acquire 50 --epochs 10 --device cpu --csv " +
      path("curve.csv") + " --plot " + path("curve.svg") + " --json");
  ASSERT_TRUE(out.is_object()) << out.dump();
  ASSERT_EQ(out["curve"].size(), 2u) << out.dump();
  EXPECT_EQ(out["curve"][1]["labelled"], 150);
  for (const auto& point : out["curve"]) {
    const double acquired = point["bald_accuracy"].get<double>(), random = point["random_accuracy"].get<double>();
    EXPECT_GT(acquired, 0.2) << out.dump();  // chance is 0.1
    EXPECT_GT(random, 0.2) << out.dump();
  }
}

TEST_F(Cli, MalformedNpyGivenByPathIsExitTwoNamingTheFile) {
  // The test's directory is the array directory (its files are removed one by one after the test).
  write_file(dir() / "features.npy", npy("<f4", "(2, 1, 2, 2)", raw_bytes(std::vector<float>{1, 2, 3})));  // 3 of 8
  write_file(dir() / "labels.npy", npy("<i8", "(2,)", raw_bytes(std::vector<int64_t>{0, 1})));
  const Result r = run("train --data " + dir().string() + " --head classification --members 2 --epochs 1 --device cpu");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr(path("features.npy") + ": truncated: shape (2, 1, 2, 2) of <f4 needs 32 data bytes, "
                                                      "the file has 12"))
      << r.out;
}

}  // namespace
}  // namespace packtrain::cli_testing
