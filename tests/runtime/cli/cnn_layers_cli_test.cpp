// The cnn's layers from the command line: group norm, dropout in the head, average
// pooling and a kernel of 5 train on optdigits above chance, the checkpoint keeps
// them (evaluate scores the test rows exactly as train did, a resumed run equals an
// uninterrupted one, predict reads rows), and
// a group count that does not divide the channels is a usage error naming it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

TEST_F(Cli, CnnWithGroupNormDropoutAveragePoolAndKernelFiveTrainsAndRoundTrips) {
  const std::string ckpt = path("cnn.ckpt");
  const std::string layers =
      "--architecture cnn --channels 4,8 --norm-groups 2 --dropout 0.2 --pool avg --kernel 5 --hidden 32 --depth 1";
  const nlohmann::json trained = run_json("train --data optdigits --head classification " + layers +
                                          " --members 2 --epochs 2 --device cpu --json --checkpoint " + ckpt);
  const double accuracy = trained["ensemble"]["accuracy"].get<double>();
  EXPECT_GT(accuracy, 0.3) << trained.dump();  // 10 classes: chance is 0.1
  // The checkpoint restores the layers: the same test rows score the same.
  const nlohmann::json evaluated = run_json("evaluate " + ckpt + " --json --device cpu");
  EXPECT_EQ(evaluated["ensemble"]["accuracy"].get<double>(), accuracy) << evaluated.dump();
  // One epoch resumed to two is the two-epoch run (dropout's masks reseeded by epoch).
  const Result first = run("train --data optdigits --head classification " + layers +
                           " --members 2 --epochs 1 --device cpu --checkpoint " + path("one.ckpt"));
  ASSERT_EQ(first.status, 0) << first.out;
  const nlohmann::json resumed = run_json("resume " + path("one.ckpt") + " --epochs 2 --json");
  EXPECT_EQ(resumed["ensemble"]["nll"], trained["ensemble"]["nll"]) << resumed.dump();
  // predict: one label per row of 64 pixels.
  {
    std::ofstream rows(path("rows.csv"));
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 64; ++c) rows << (c ? "," : "") << (c * (r + 1)) % 17;
      rows << "\n";
    }
  }
  const Result predicted = run("predict " + ckpt + " " + path("rows.csv") + " -o " + path("out.csv"));
  ASSERT_EQ(predicted.status, 0) << predicted.out;
  std::ifstream out(path("out.csv"));
  std::string header, line;
  std::getline(out, header);
  EXPECT_THAT(header, HasSubstr("predicted,p_0,"));
  int lines = 0;
  while (std::getline(out, line)) ++lines;
  EXPECT_EQ(lines, 3);

  const Result bad =
      run("train --data optdigits --head classification --architecture cnn --channels 4,6 "
          "--norm-groups 4 --members 2 --epochs 1 --device cpu");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("cnn norm groups 4 do not divide block 1's 6 channels")) << bad.out;
}

}  // namespace
}  // namespace packtrain::cli_testing
