// Several ranks end to end: packtrain launch, data parallel (equal to one process
// with the doubled batch, resumed, killed midway), ranks that diverge, die or hang,
// member parallel (its shards, re-sharded resumes, a killed run), and multi-task
// data parallel. Ranks start through the harness: launch, or by hand with the
// rendezvous variables.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

TEST_F(Cli, LaunchStartsRanksThatJoinOneGroupAndForwardsTheirOutput) {
  for (int n : {2, 3}) {
    const Result r = launch(n, "info --collectives");
    EXPECT_EQ(r.status, 0) << r.out;
    for (int rank = 0; rank < n; ++rank) {
      const std::string r_s = std::to_string(rank), n_s = std::to_string(n);
      EXPECT_THAT(r.out,
                  HasSubstr("[rank " + r_s + "] rank " + r_s + " of " + n_s + " (local " + r_s + " of " + n_s + ")"))
          << r.out;
    }
    EXPECT_EQ(std::count_if(r.out.begin(), r.out.end(), [](char c) { return c == '\n'; }), n + 1) << r.out;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("WRONG")));
  }
  // A failing command fails the launch with its status; every rank's error is shown.
  const Result bad = launch(2, "train --device cpu --patience 0 --data " + path("missing.csv"), "--grace 5");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("[rank 0] packtrain: error:"));
  EXPECT_THAT(bad.out, HasSubstr("[rank 1] packtrain: error:"));
  EXPECT_EQ(run("launch --nproc 2").status, 2);
  // Rendezvous variables that do not add up are bad input, named.
  const Result no_addr = run_with_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "info --collectives");
  EXPECT_EQ(no_addr.status, 2);
  EXPECT_THAT(no_addr.out, HasSubstr("MASTER_ADDR is not set"));
}

TEST_F(Cli, DataParallelTwoRanksEqualOneProcessWithTheDoubledBatch) {
  // With dropout: each rank draws every member's masks for the global batch and keeps
  // its rows', so the ranks together drop what one process drops.
  const std::string args =
      "train --members 4 --epochs 12 --hidden 32 --batch 64 --device cpu --patience 0 --dropout 0.2 --json --quiet";
  const nlohmann::json single = run_json(args);
  // (Checksums compared every 4 steps too: the epoch runs in pieces, the same steps.)
  const Result launched = launch(2, args + " --rank-check-every 4");
  ASSERT_EQ(launched.status, 0) << launched.out;
  EXPECT_THAT(launched.out, ::testing::Not(HasSubstr("[rank 1] {"))) << "only rank 0 reports";
  const nlohmann::json parallel = rank0_json(launched.out);
  ASSERT_TRUE(parallel.is_object()) << launched.out;
  EXPECT_EQ(parallel["data_parallel"]["global_batch"], 64);
  EXPECT_EQ(parallel["data_parallel"]["per_rank_batch"], 32);
  // Per-rank batch 32 on each of 2 ranks, gradients averaged: the batch-64 run, up to
  // float32 rounding (two half-batch means averaged, not one sum) that 12 epochs can
  // amplify where a ReLU sits at its kink: measured up to 5e-4 relative on one member.
  // A real difference is far larger (batch 32 instead of 64: 5%).
  const auto close = [](double a, double b) { return std::abs(a - b) <= 2e-3 * std::abs(b); };
  EXPECT_TRUE(close(parallel["ensemble"]["rmse"].get<double>(), single["ensemble"]["rmse"].get<double>()))
      << parallel["ensemble"] << " vs " << single["ensemble"];
  ASSERT_EQ(parallel["members"].size(), single["members"].size());
  for (size_t k = 0; k < single["members"].size(); ++k) {
    EXPECT_TRUE(close(parallel["members"][k]["rmse"].get<double>(), single["members"][k]["rmse"].get<double>()))
        << "member " << k;
  }
  // One launched process runs the data-parallel path (a group of one) and changes nothing.
  const Result one = launch(1, "train --members 4 --epochs 12 --hidden 32 --batch 64 --device cpu --patience 0 --json");
  ASSERT_EQ(one.status, 0) << one.out;
  const nlohmann::json grouped = rank0_json(one.out);
  ASSERT_TRUE(grouped.is_object()) << one.out;
  EXPECT_EQ(grouped["data_parallel"]["ranks"], 1);
  EXPECT_EQ(grouped["data_parallel"]["per_rank_batch"], 64);
  const nlohmann::json batch64 =
      run_json("train --members 4 --epochs 12 --hidden 32 --batch 64 --device cpu --patience 0 --json --quiet");
  EXPECT_EQ(grouped["ensemble"]["rmse"], batch64["ensemble"]["rmse"]);
  // A global batch that does not split evenly is refused, by name.
  const Result odd = launch(2, "train --members 2 --epochs 1 --batch 63 --device cpu --patience 0");
  EXPECT_EQ(odd.status, 2) << odd.out;
  EXPECT_THAT(odd.out, HasSubstr("does not split into 2 equal per-rank batches"));
}

TEST_F(Cli, DataParallelResumeEqualsTheUninterruptedRun) {
  const std::string args = "--members 3 --hidden 16 --batch 64 --device cpu --patience 0 --quiet";
  const Result full = launch(2, "train " + args + " --epochs 6 --json");
  ASSERT_EQ(full.status, 0) << full.out;
  ASSERT_EQ(launch(2, "train " + args + " --epochs 3 --checkpoint " + path("dp.ckpt")).status, 0);
  const Result resumed = launch(2, "resume " + path("dp.ckpt") + " --epochs 6 --device cpu --quiet --json");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  const nlohmann::json a = rank0_json(full.out), b = rank0_json(resumed.out);
  ASSERT_TRUE(a.is_object() && b.is_object());
  EXPECT_EQ(b["epochs_run"], 6);
  EXPECT_EQ(a["ensemble"]["rmse"], b["ensemble"]["rmse"]);
  EXPECT_EQ(a["ensemble"]["nll"], b["ensemble"]["nll"]);
}

TEST_F(Cli, DataParallelRunKilledMidwayResumesLikeAnUninterruptedRun) {
  const std::string common = " --members 3 --hidden 8 --batch 64 --device cpu --patience 0 --quiet --epochs 500";
  const std::string train = "--threads 1 train" + common + " --checkpoint-every 1 --checkpoint " + path("dp.ckpt");
  // Rank 1 dies (SIGKILL) mid-run; rank 0 has committed a checkpoint after every epoch.
  const Result r = run_ranks_by_hand(
      {.env = {{"PACKTRAIN_COLLECTIVE_TIMEOUT", "10"}}, .meanwhile = wait_then_kill(path("dp.ckpt"))}, train);
  ASSERT_THAT(r.out, HasSubstr("rank0 exit 1")) << "the run ended before the kill: " << r.out;
  // The last checkpoint loads, and restarting from it finishes the run as if never killed.
  EXPECT_EQ(run("evaluate " + path("dp.ckpt") + " --device cpu").status, 0);
  const Result resumed = launch(2, "--threads 1 resume " + path("dp.ckpt") + " --device cpu --quiet --json");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  const Result straight = launch(2, "--threads 1 train" + common + " --json");
  ASSERT_EQ(straight.status, 0) << straight.out;
  const nlohmann::json a = rank0_json(resumed.out), b = rank0_json(straight.out);
  ASSERT_TRUE(a.is_object() && b.is_object()) << resumed.out << straight.out;
  EXPECT_EQ(a["epochs_run"], 500);
  EXPECT_EQ(a["ensemble"]["rmse"], b["ensemble"]["rmse"]);
  EXPECT_EQ(a["ensemble"]["nll"], b["ensemble"]["nll"]);
}

TEST_F(Cli, RanksThatDivergeStopAtTheNextChecksumComparison) {
  // Two ranks with different learning rates: same gradients, different weights after
  // the first update. With --rank-check-every 5 both stop at step 5, not at the
  // epoch's end (13 steps of 64 rows).
  const std::string train =
      "train --members 2 --hidden 8 --epochs 3 --batch 64 --device cpu --patience 0 --quiet "
      "--rank-check-every 5 --lr ";
  const Result r =
      run_ranks_by_hand({.afterwards = "wait"}, [&train](int rank) { return train + (rank == 0 ? "0.01" : "0.02"); });
  EXPECT_THAT(r.out, HasSubstr("rank0 exit 1")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("parameters differ across ranks after step 5 (epoch 1): 1 rank(s) disagree with rank 0"))
      << r.out;
}

TEST_F(Cli, AKilledRankEndsTheOthersWithAnErrorNamingTheStep) {
  const std::string train = "train --members 2 --hidden 8 --epochs 100000 --device cpu --patience 0 --quiet";
  const auto start = std::chrono::steady_clock::now();
  const Result r = run_ranks_by_hand({.meanwhile = kill_after(3, "-9")}, train);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(r.out, HasSubstr("rank0 exit 1")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("failed on rank 0 of 2")) << r.out;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("all-reduce at step [0-9]+ failed|checksum")) << r.out;
  EXPECT_LT(seconds, 70) << "the surviving rank must not hang";
}

TEST_F(Cli, AStuckRankEndsTheOthersAfterTheCollectiveTimeout) {
  const std::string train = "train --members 2 --hidden 8 --epochs 100000 --device cpu --patience 0 --quiet";
  const auto start = std::chrono::steady_clock::now();
  // Rank 1 is stopped (not dead: its sockets stay open) after 3 s.
  const Result r = run_ranks_by_hand({.env = {{"PACKTRAIN_COLLECTIVE_TIMEOUT", "4"}},
                                      .meanwhile = kill_after(3, "-STOP"),
                                      .afterwards = "kill -9 $pid"},
                                     train);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(r.out, HasSubstr("rank0 exit 1")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("failed on rank 0 of 2 (timeout 4000 ms)")) << r.out;
  EXPECT_LT(seconds, 40) << "the timeout, not a hang";
  const Result bad = run_with_env(
      {{"PACKTRAIN_COLLECTIVE_TIMEOUT", "soon"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}},
      "train --epochs 1 --device cpu --patience 0");
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.out, HasSubstr("PACKTRAIN_COLLECTIVE_TIMEOUT='soon'"));
}

TEST_F(Cli, MemberParallelEqualsOneProcessAndItsShardsEvaluateAnywhere) {
  // With dropout: member m's masks follow from its index in the ensemble, whichever rank holds it.
  const std::string args =
      "train --members 5 --epochs 10 --hidden 32 --batch 64 --device cpu --patience 0 --dropout 0.2 --json --quiet "
      "--recalibrate none";  // a member-parallel run cannot fit one scale to all members: compared as trained
  const nlohmann::json single = run_json(args);
  const Result launched = launch(2, args + " --member-parallel --checkpoint " + path("mp.ckpt"));
  ASSERT_EQ(launched.status, 0) << launched.out;
  const nlohmann::json parallel = rank0_json(launched.out);
  ASSERT_TRUE(parallel.is_object()) << launched.out;
  // Members 0-2 on rank 0, 3-4 on rank 1, each initialized and trained as in one process.
  ASSERT_EQ(parallel["members"].size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_DOUBLE_EQ(parallel["members"][k]["rmse"].get<double>(), single["members"][k]["rmse"].get<double>())
        << "member " << k;
  }
  EXPECT_DOUBLE_EQ(parallel["ensemble"]["rmse"].get<double>(), single["ensemble"]["rmse"].get<double>());
  // One shard per rank (named by its epoch), then the manifest; one process
  // evaluates and predicts with them all.
  EXPECT_TRUE(fs::exists(path("mp.ckpt.e10.shard-0-of-2")));
  EXPECT_TRUE(fs::exists(path("mp.ckpt.e10.shard-1-of-2")));
  const nlohmann::json manifest = nlohmann::json::parse(read_file(path("mp.ckpt")), nullptr, false);
  EXPECT_EQ(manifest["format"], "packtrain-member-parallel-1");
  EXPECT_EQ(manifest["epoch"], 10);
  EXPECT_EQ(manifest["ranks"], 2);
  const nlohmann::json evaluated = run_json("evaluate " + path("mp.ckpt") + " --json --device cpu");
  ASSERT_TRUE(evaluated.is_object());
  EXPECT_EQ(evaluated["shards"], 2);
  EXPECT_DOUBLE_EQ(evaluated["ensemble"]["rmse"].get<double>(), single["ensemble"]["rmse"].get<double>());
  const Result predicted =
      run("predict " + path("mp.ckpt") + " " + concrete_csv("in.csv", 3, false) + " --members --device cpu");
  ASSERT_EQ(predicted.status, 0) << predicted.out;
  EXPECT_THAT(predicted.out,
              HasSubstr("mean,std,aleatoric_std,epistemic_std,lower_90,upper_90,member_0,member_1,member_2,member_3,"
                        "member_4\n"));
  const Result alone = run("train --members 2 --epochs 1 --member-parallel --device cpu --patience 0");
  EXPECT_EQ(alone.status, 2);
  EXPECT_THAT(alone.out, HasSubstr("multi-process run"));
  const Result recalibrated =
      launch(2, "train --members 2 --epochs 1 --member-parallel --device cpu --recalibrate variance");
  EXPECT_NE(recalibrated.status, 0);
  EXPECT_THAT(recalibrated.out, HasSubstr("use --recalibrate none with --member-parallel"));
  // The manifest resumes on another number of ranks: 3 ranks re-shard the 5 members
  // (2/2/1) from the 2 shards and continue exactly as one process would have.
  const Result three = launch(3, "resume " + path("mp.ckpt") + " --epochs 13 --device cpu --json --quiet");
  ASSERT_EQ(three.status, 0) << three.out;
  const nlohmann::json resharded = rank0_json(three.out);
  ASSERT_TRUE(resharded.is_object()) << three.out;
  const nlohmann::json longer = run_json(
      "train --members 5 --epochs 13 --hidden 32 --batch 64 --device cpu --patience 0 --dropout 0.2 --json --quiet "
      "--recalibrate none");
  EXPECT_EQ(resharded["epochs_run"], 13);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_DOUBLE_EQ(resharded["members"][k]["rmse"].get<double>(), longer["members"][k]["rmse"].get<double>())
        << "member " << k;
  }
  EXPECT_EQ(nlohmann::json::parse(read_file(path("mp.ckpt")), nullptr, false)["ranks"], 3);
  EXPECT_EQ(shard_files(dir()), (std::vector<std::string>{"mp.ckpt.e13.shard-0-of-3", "mp.ckpt.e13.shard-1-of-3",
                                                          "mp.ckpt.e13.shard-2-of-3"}));
  const Result unlaunched = run("resume " + path("mp.ckpt") + " --epochs 14 --device cpu");
  EXPECT_EQ(unlaunched.status, 2) << unlaunched.out;
  EXPECT_THAT(unlaunched.out, HasSubstr("launch --nproc 1"));
}

TEST_F(Cli, MemberParallelCheckpointHoldsTheBestWeightsTheRunReported) {
  // Early stopping restores each member's best weights after the last epoch; the
  // committed manifest must hold those (the last periodic save does not).
  const Result launched = launch(2,
                                 "train --members 3 --hidden 16 --epochs 12 --lr 0.08 --patience 50 "
                                 "--checkpoint-every 4 --device cpu --json --quiet --member-parallel --checkpoint " +
                                     path("mp.ckpt"));
  ASSERT_EQ(launched.status, 0) << launched.out;
  const nlohmann::json trained = rank0_json(launched.out);
  ASSERT_TRUE(trained.is_object()) << launched.out;
  const nlohmann::json evaluated = run_json("evaluate " + path("mp.ckpt") + " --json --device cpu");
  ASSERT_TRUE(evaluated.is_object());
  EXPECT_EQ(evaluated["ensemble"]["rmse"], trained["ensemble"]["rmse"]);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(evaluated["members"][k]["rmse"], trained["members"][k]["rmse"]) << k;
}

TEST_F(Cli, MemberParallelClassificationEqualsOneProcess) {
  const std::string args =
      "train --data wine-quality-red --head classification --members 3 --epochs 4 --hidden 16 "
      "--device cpu --json --quiet";
  const nlohmann::json single = run_json(args);
  const Result launched = launch(2, args + " --member-parallel");
  ASSERT_EQ(launched.status, 0) << launched.out;
  const nlohmann::json parallel = rank0_json(launched.out);
  ASSERT_TRUE(parallel.is_object()) << launched.out;
  ASSERT_EQ(parallel["members"].size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_DOUBLE_EQ(parallel["members"][k]["accuracy"].get<double>(), single["members"][k]["accuracy"].get<double>());
    EXPECT_DOUBLE_EQ(parallel["members"][k]["nll"].get<double>(), single["members"][k]["nll"].get<double>());
  }
  EXPECT_DOUBLE_EQ(parallel["ensemble"]["accuracy"].get<double>(), single["ensemble"]["accuracy"].get<double>());
  EXPECT_DOUBLE_EQ(parallel["ensemble"]["nll"].get<double>(), single["ensemble"]["nll"].get<double>());
  // Per-member batch orders depend on the sharding: such a run re-shards by no means.
  ASSERT_EQ(launch(2,
                   "train --members 3 --epochs 1 --hidden 8 --device cpu --patience 0 --quiet --order bootstrap "
                   "--member-parallel --checkpoint " +
                       path("boot.ckpt"))
                .status,
            0);
  const Result reshard = launch(3, "resume " + path("boot.ckpt") + " --epochs 2 --device cpu");
  EXPECT_EQ(reshard.status, 2) << reshard.out;
  EXPECT_THAT(reshard.out, HasSubstr("bootstrap batch orders, which depend on how the members were sharded"));
}

TEST_F(Cli, MemberParallelRunKilledMidwayResumesFromItsLastCommitLikeAnUninterruptedRun) {
  const std::string common = " --members 3 --hidden 8 --batch 64 --device cpu --patience 0 --quiet";
  const std::string train =
      "train" + common + " --epochs 100000 --member-parallel --checkpoint-every 1 --checkpoint " + path("mp.ckpt");
  // Rank 1 dies (SIGKILL) while both commit a checkpoint after every epoch.
  const Result r = run_ranks_by_hand(
      {.env = {{"PACKTRAIN_COLLECTIVE_TIMEOUT", "10"}}, .meanwhile = wait_then_kill(path("mp.ckpt"))}, train);
  EXPECT_THAT(r.out, HasSubstr("rank0 exit 1")) << r.out;
  // The last committed manifest and its shards load.
  const nlohmann::json manifest = nlohmann::json::parse(read_file(path("mp.ckpt")), nullptr, false);
  ASSERT_TRUE(manifest.is_object()) << r.out;
  const int epoch = manifest["epoch"].get<int>();
  ASSERT_GE(epoch, 1);
  for (const auto& shard : manifest["shards"]) EXPECT_TRUE(fs::exists(path(shard["file"].get<std::string>())));
  EXPECT_EQ(run("evaluate " + path("mp.ckpt") + " --device cpu").status, 0);
  // Restarting from it continues the run: the same members as a run never interrupted.
  const std::string until = " --epochs " + std::to_string(epoch + 3);
  const Result resumed = launch(2, "resume " + path("mp.ckpt") + until + " --device cpu --json --quiet");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  const Result straight = launch(2, "train" + common + until + " --member-parallel --json");
  ASSERT_EQ(straight.status, 0) << straight.out;
  const nlohmann::json a = rank0_json(resumed.out), b = rank0_json(straight.out);
  ASSERT_TRUE(a.is_object() && b.is_object()) << resumed.out << straight.out;
  EXPECT_EQ(a["epochs_run"], epoch + 3);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(a["members"][k]["rmse"], b["members"][k]["rmse"]) << "member " << k;
  EXPECT_EQ(a["ensemble"]["nll"], b["ensemble"]["nll"]);
  // The resumed run committed in place and removed every earlier generation.
  const std::string e = std::to_string(epoch + 3);
  EXPECT_EQ(shard_files(dir()),
            (std::vector<std::string>{"mp.ckpt.e" + e + ".shard-0-of-2", "mp.ckpt.e" + e + ".shard-1-of-2"}));
}

TEST_F(Cli, MultitaskDataParallelEqualsOneProcessWithTheDoubledBatch) {
  write_file(path("train.tsv"), yes_no_tsv(32));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const std::string args = "multitask train " + kTinyShape + " --epochs 2 --train " + path("train.tsv") + " --dev " +
                           path("dev.tsv") + " --json";
  const nlohmann::json single = run_json(args + " -o " + path("one.ckpt"));
  const Result launched = launch(2, args + " -o " + path("two.ckpt"));
  ASSERT_EQ(launched.status, 0) << launched.out;
  const nlohmann::json parallel = rank0_json(launched.out);
  ASSERT_TRUE(parallel.is_object() && single.is_object()) << launched.out;
  // 2 ranks x 2 rows = one process's batch of 4 (kTinyModel's --batch 4).
  const double a = parallel["dev_metrics"]["lm_loss"].get<double>(), b = single["dev_metrics"]["lm_loss"].get<double>();
  EXPECT_NEAR(a, b, 1e-5 * std::abs(b));
  EXPECT_EQ(parallel["dev_metrics"]["accuracy"], single["dev_metrics"]["accuracy"]);
}

}  // namespace
}  // namespace packtrain::cli_testing
