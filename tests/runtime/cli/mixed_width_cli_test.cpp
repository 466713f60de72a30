// Architecture sweeps in one pack: `--hidden 8,32` trains members of both widths as
// one pack padded to the widest (packed_mlp.h), reported and selected as a sweep over
// learning rates is; the checkpoint keeps each member's width, so evaluate, predict
// and the export (each member at its own width in plain PyTorch) read it back. A
// cnn's channel lists (`--channels 2,4/4,8`) sweep the same way.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/runtime/cli/cli_harness.h"
#include "tests/runtime/cli/export_check.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

TEST_F(Cli, MembersOfDifferentWidthsTrainAsOnePackAndTheBestWidthIsKept) {
  const std::string ckpt = path("widths.ckpt");
  const nlohmann::json j =
      run_json("train --hidden 4,32 --members 2 --epochs 8 --device cpu --json --select best --checkpoint " + ckpt);
  EXPECT_EQ(j["options"]["members"], 4);
  EXPECT_EQ(j["options"]["hidden"], 32) << "the pack is as wide as its widest member";
  EXPECT_EQ(j["options"]["member_hidden"], nlohmann::json({4, 4, 32, 32}));
  ASSERT_EQ(j["configurations"].size(), 2u) << j.dump();
  EXPECT_EQ(j["configurations"][0]["hidden"], 4);
  EXPECT_EQ(j["configurations"][1]["hidden"], 32);
  // Each configuration's members are their own ensemble: different widths, different fits.
  EXPECT_NE(j["configurations"][0]["val_loss"], j["configurations"][1]["val_loss"]);
  const size_t best = j["configurations"][0]["val_loss"] < j["configurations"][1]["val_loss"] ? 0 : 1;
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(j["members"][k]["status"] == "deselected", k / 2 != best) << "member " << k;
  }
  EXPECT_DOUBLE_EQ(j["ensemble"]["rmse"].get<double>(), j["configurations"][best]["test"]["rmse"].get<double>());

  // Read back: the same ensemble, the sweep's widths in the checkpoint's options.
  EXPECT_DOUBLE_EQ(run_json("evaluate " + ckpt + " --json --device cpu")["ensemble"]["rmse"].get<double>(),
                   j["ensemble"]["rmse"].get<double>());
  const Result text = run("train --hidden 4,32 --members 1 --epochs 2 --device cpu");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("hidden width x learning rate"));
  EXPECT_THAT(text.out, HasSubstr("Sweep: 2 configurations x 1 members"));

  // The export holds every member at its own width: plain PyTorch predicts what packtrain does.
  const std::string all = path("all.ckpt");
  ASSERT_EQ(run("train --hidden 4,16 --members 1 --epochs 3 --device cpu --quiet --checkpoint " + all).status, 0);
  ASSERT_EQ(run("export " + all + " " + path("widths.pt")).status, 0);
  expect_export_predicts_as_packtrain(all, path("widths.pt"), concrete_csv("in.csv", 20, false), 20, dir().string());
}

// A cnn's head of different widths: one pack, a row per width, the best kept.
TEST_F(Cli, ACnnHeadOfDifferentWidthsIsASweepInOnePack) {
  const nlohmann::json j = run_json(
      "train --data optdigits --head classification --architecture cnn --channels 4 --hidden 8,16 --members 2 "
      "--epochs 3 --device cpu --json --select best");
  EXPECT_EQ(j["options"]["member_hidden"], nlohmann::json({8, 8, 16, 16}));
  ASSERT_EQ(j["configurations"].size(), 2u) << j.dump();
  // Both widths learn (chance: 0.1).
  for (const auto& c : j["configurations"]) EXPECT_GT(c["test"]["accuracy"].get<double>(), 0.3) << c.dump();
  EXPECT_NE(j["configurations"][0]["val_loss"], j["configurations"][1]["val_loss"]);
}

// cnn members of different channel counts: `--channels 2,4/4,8` is one pack padded
// to the widest channels of each block, a row per list, the best kept; the
// checkpoint keeps each member's channels, so evaluate reads the same ensemble back.
TEST_F(Cli, ACnnOfDifferentChannelsIsASweepInOnePack) {
  const std::string ckpt = path("channels.ckpt");
  const nlohmann::json j = run_json(
      "train --data optdigits --head classification --architecture cnn --channels 2,4/4,8 --hidden 16 --members 2 "
      "--epochs 3 --device cpu --json --select best --checkpoint " +
      ckpt);
  EXPECT_EQ(j["options"]["channels"], nlohmann::json({4, 8})) << "the pack is as wide as its widest member";
  EXPECT_EQ(j["options"]["member_channels"], nlohmann::json({2, 4, 2, 4, 4, 8, 4, 8}));
  ASSERT_EQ(j["configurations"].size(), 2u) << j.dump();
  EXPECT_EQ(j["configurations"][0]["channels"], nlohmann::json({2, 4}));
  EXPECT_EQ(j["configurations"][1]["channels"], nlohmann::json({4, 8}));
  for (const auto& c : j["configurations"]) EXPECT_GT(c["test"]["accuracy"].get<double>(), 0.3) << c.dump();
  EXPECT_NE(j["configurations"][0]["val_loss"], j["configurations"][1]["val_loss"]);
  EXPECT_DOUBLE_EQ(run_json("evaluate " + ckpt + " --json --device cpu")["ensemble"]["accuracy"].get<double>(),
                   j["ensemble"]["accuracy"].get<double>());
  const Result text =
      run("train --data optdigits --head classification --architecture cnn --channels 2,4/4,8 --hidden 16 --members 1 "
          "--epochs 1 --device cpu");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("(channels x hidden width x learning rate"));
  EXPECT_THAT(text.out, HasSubstr("cnn (channels {2,4/4,8})"));
  EXPECT_THAT(text.out, HasSubstr("channels  hidden"));
}

TEST_F(Cli, WidthsThatCannotBePackedAreUsageErrors) {
  const std::vector<std::pair<std::string, std::string>> refused{
      {"--hidden 8,16 --layer-norm", "--layer-norm with several --hidden widths"},
      {"--hidden 8.5", "--hidden: widths must be positive integers, got 8.5"},
      {"--hidden 8,8", "given twice"},
      {"--hidden 8,16 --architecture residual-mlp", "no members of different widths"},
      {"--channels 2,4/2,4 --architecture cnn --data optdigits", "the list '2,4' is given twice"},
      {"--channels 2,4/4 --architecture cnn --data optdigits", "differ in their number of blocks"},
      {"--channels 2,4/4,8 --architecture cnn --data optdigits --norm-groups 2", "cannot have GroupNorm"},
      {"--channels 2,4/4,8", "--channels shapes a cnn member's convolutions: give --architecture cnn"},
      {"--kernel 5", "--kernel shapes a cnn member's convolutions"},
      {"--padding 0 --architecture residual-mlp", "(this run's architecture is residual-mlp)"},
      {"--channels 2.5 --architecture cnn --data optdigits", "each count must be a whole number > 0, got 2.5"},
      {"--channels 4/0 --architecture cnn --data optdigits", "each count must be a whole number > 0, got 0"},
  };
  for (const auto& [flags, message] : refused) {
    const Result r = run("train " + flags + " --epochs 1 --device cpu");
    EXPECT_EQ(r.status, 2) << flags << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(message)) << flags;
  }
}

}  // namespace
}  // namespace packtrain::cli_testing
