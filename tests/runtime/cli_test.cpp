// The packtrain binary end to end: the default training job's shape, JSON output,
// and exit status 2 with a one-line message for bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <string>

namespace {

struct Result {
  int status;
  std::string out;
};

Result run(const std::string& args) {
  const std::string command = std::string(PACKTRAIN_BINARY) + " " + args + " 2>&1";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string out;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) out += buffer.data();
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(Cli, TrainJsonReportsEveryMemberAndAnEnsembleBetterThanTheAverageMember) {
  const Result r = run("train --members 6 --epochs 60 --json --device cpu");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto json = nlohmann::json::parse(r.out);
  ASSERT_EQ(json["member_metrics"].size(), 6u);
  double mean_rmse = 0;
  for (const auto& m : json["member_metrics"]) mean_rmse += m["rmse"].get<double>() / 6;
  const double ensemble_rmse = json["ensemble"]["rmse"].get<double>();
  // Concrete's target spans 2-83 MPa (std ~16.7); a trained model is far better
  // than predicting the mean, and averaging members does not hurt.
  EXPECT_LT(ensemble_rmse, 10.0);
  EXPECT_LE(ensemble_rmse, mean_rmse + 1e-9);
}

TEST(Cli, HelpExplainsTrain) {
  const Result r = run("train --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, ::testing::HasSubstr("--members"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("bundled UCI concrete"));
}

TEST(Cli, BadInputExitsTwoWithOneLine) {
  for (const std::string args : {"train --data no_such_set", "train --members 0", "train --batch 100000 --epochs 1",
                                 "train --split 99", "train --activation swish", "train --epochs notanumber"}) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_FALSE(r.out.empty()) << args;
  }
  EXPECT_THAT(run("train --data no_such_set").out, ::testing::HasSubstr("no_such_set: no such data set directory"));
  EXPECT_THAT(run("train --split 99").out, ::testing::HasSubstr("split 99 out of range"));
}

}  // namespace
