// Rendezvous variables (torchrun, Slurm, none) and their errors; a one-process
// group's collectives. Multi-process runs are tested through `packtrain launch`
// (tests/runtime/cli_test.cpp).
#include "runtime/data_error.h"
#include "runtime/distributed/process_group.h"
#include "runtime/distributed/rank_info.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace packtrain::runtime::distributed {
namespace {

using ::testing::HasSubstr;

Environment env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

std::string error_of(std::map<std::string, std::string> vars) {
  try {
    rank_info_from_environment(env(std::move(vars)));
  } catch (const DataError& e) {
    return e.what();
  }
  return "no error";
}

TEST(RankInfo, NoVariablesIsOneProcess) {
  const RankInfo info = rank_info_from_environment(env({}));
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_FALSE(info.distributed());
  EXPECT_EQ(info.source, "single process");
}

TEST(RankInfo, ReadsTorchrunVariables) {
  const RankInfo info = rank_info_from_environment(env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                                        {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "node7"},
                                                        {"MASTER_PORT", "29600"}}));
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.master_addr, "node7");
  EXPECT_EQ(info.master_port, 29600);
  EXPECT_TRUE(info.distributed());
  EXPECT_THAT(info.describe(), HasSubstr("rank 3 of 8 (local 1 of 2), store node7:29600, from torchrun variables"));
}

TEST(RankInfo, FallsBackToSlurmVariables) {
  const RankInfo info = rank_info_from_environment(env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"},
                                                        {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "3"},
                                                        {"MASTER_ADDR", "10.0.0.1"}}));
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 6);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 3);
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_EQ(info.source, "Slurm variables");
  // torchrun's variables win over Slurm's when both are set.
  EXPECT_EQ(rank_info_from_environment(env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SLURM_PROCID", "5"},
                                            {"SLURM_NTASKS", "6"}}))
                .source,
            "torchrun variables");
}

TEST(RankInfo, BadValuesNameTheVariable) {
  EXPECT_THAT(error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}), HasSubstr("RANK='x' is not an integer"));
  EXPECT_THAT(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}), HasSubstr("rank 2 is outside [0, 2)"));
  EXPECT_THAT(error_of({{"RANK", "0"}}), HasSubstr("RANK and WORLD_SIZE must be set together"));
  EXPECT_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}), HasSubstr("MASTER_ADDR is not set"));
  EXPECT_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}}),
              HasSubstr("MASTER_PORT=70000 is not a port"));
  EXPECT_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"},
                        {"MASTER_ADDR", "a"}}),
              HasSubstr("local rank 2 is outside [0, 2)"));
}

TEST(ProcessGroupTest, OneProcessCollectivesAreTheIdentity) {
  if (!ProcessGroup::gloo_available()) GTEST_SKIP() << "built without Gloo's headers (Debian libgloo-dev)";
  auto group = ProcessGroup::join(RankInfo{}, std::chrono::seconds(10));
  at::Tensor t = at::arange(5, at::kFloat);
  group->all_reduce_mean_(t);
  EXPECT_TRUE(at::equal(t, at::arange(5, at::kFloat)));
  group->broadcast_(t, 0);
  EXPECT_TRUE(at::equal(t, at::arange(5, at::kFloat)));
  group->barrier();
  at::Tensor strided = at::zeros({4, 4}).t();
  EXPECT_THROW(group->all_reduce_sum_(strided), c10::Error);
}

}  // namespace
}  // namespace packtrain::runtime::distributed
