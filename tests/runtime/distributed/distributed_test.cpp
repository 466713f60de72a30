// Rendezvous variables (torchrun, Slurm, none) and their errors; a one-process
// group's collectives; the collective deadline (watchdog); a trainer in a world of
// one (Gloo on CPU, NCCL captured inside the step on a GPU) equals a trainer with no
// group. Multi-process runs are tested through `packtrain launch`
// (tests/runtime/cli/distributed_cli_test.cpp).
#include "packtrain/base/user_error.h"
#include "packtrain/runtime/distributed/collective_watchdog.h"
#include "packtrain/runtime/distributed/cpu_share.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/distributed/rank_info.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_steps.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>

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
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

// The default threads: the free CPUs, shared by the ranks on the host, from 1 to
// LibTorch's own default (the last argument).
TEST(CpuShare, FreeCpusSharedAmongLocalRanks) {
  RankInfo one, two;
  two.world_size = two.local_world_size = 2;
  EXPECT_EQ(default_cpu_threads({.usable_cpus = 2, .others_running = 0}, one, 2), 2);  // idle: as before
  EXPECT_EQ(default_cpu_threads({.usable_cpus = 2, .others_running = 2}, one, 2), 1);  // a two-job compile beside it
  EXPECT_EQ(default_cpu_threads({.usable_cpus = 2, .others_running = 40}, one, 2), 1);
  EXPECT_EQ(default_cpu_threads({.usable_cpus = 16, .others_running = 0}, one, 8), 8);  // never above LibTorch's
  // Two ranks on 16 CPUs: the other rank starting beside this one is not other work.
  EXPECT_EQ(default_cpu_threads({.usable_cpus = 16, .others_running = 0}, two, 8), 8);
  EXPECT_EQ(default_cpu_threads({.usable_cpus = 16, .others_running = 1}, two, 8), 8);
  EXPECT_EQ(default_cpu_threads({.usable_cpus = 16, .others_running = 5}, two, 8), 6);
  EXPECT_EQ(default_cpu_threads({.usable_cpus = 2, .others_running = 1}, two, 2), 1);
  const CpuLoad here = read_cpu_load();
  EXPECT_GE(here.usable_cpus, 1);
  EXPECT_GE(here.others_running, 0);
}

TEST(RankInfo, NoVariablesIsOneProcess) {
  const RankInfo info = rank_info_from_environment(env({}));
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_FALSE(info.distributed());
  EXPECT_EQ(info.source, "single process");
}

TEST(RankInfo, ReadsTorchrunVariables) {
  const RankInfo info = rank_info_from_environment(env({{"RANK", "3"},
                                                        {"WORLD_SIZE", "8"},
                                                        {"LOCAL_RANK", "1"},
                                                        {"LOCAL_WORLD_SIZE", "2"},
                                                        {"MASTER_ADDR", "node7"},
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
  const RankInfo info = rank_info_from_environment(env({{"SLURM_PROCID", "5"},
                                                        {"SLURM_NTASKS", "6"},
                                                        {"SLURM_LOCALID", "1"},
                                                        {"SLURM_NTASKS_PER_NODE", "3"},
                                                        {"MASTER_ADDR", "10.0.0.1"}}));
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 6);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 3);
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_EQ(info.source, "Slurm variables");
  // torchrun's variables win over Slurm's when both are set.
  EXPECT_EQ(rank_info_from_environment(
                env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}}))
                .source,
            "torchrun variables");
}

TEST(RankInfo, BadValuesNameTheVariable) {
  EXPECT_THAT(error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}),
              HasSubstr("RANK='x' is not an integer"));
  EXPECT_THAT(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}),
              HasSubstr("rank 2 is outside [0, 2)"));
  EXPECT_THAT(error_of({{"RANK", "0"}}), HasSubstr("RANK and WORLD_SIZE must be set together"));
  EXPECT_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}), HasSubstr("MASTER_ADDR is not set"));
  EXPECT_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}}),
              HasSubstr("MASTER_PORT=70000 is not a port"));
  EXPECT_THAT(
      error_of(
          {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}),
      HasSubstr("local rank 2 is outside [0, 2)"));
}

TEST(RankInfo, CollectiveTimeoutIsBetweenASecondAndADay) {
  EXPECT_EQ(collective_timeout(env({})), std::chrono::seconds(60));
  EXPECT_EQ(collective_timeout(env({{"PACKTRAIN_COLLECTIVE_TIMEOUT", "1"}})), std::chrono::seconds(1));
  EXPECT_EQ(collective_timeout(env({{"PACKTRAIN_COLLECTIVE_TIMEOUT", "2.5"}})), std::chrono::milliseconds(2500));
  EXPECT_EQ(collective_timeout(env({{"PACKTRAIN_COLLECTIVE_TIMEOUT", "86400"}})), std::chrono::hours(24));
  for (const std::string t : {"nan", "inf", "-inf", "1e300", "1e400", "1e10", "0.0001", "0", "-5", "soon", "", "5s"}) {
    try {
      collective_timeout(env({{"PACKTRAIN_COLLECTIVE_TIMEOUT", t}}));
      ADD_FAILURE() << t << ": accepted";
    } catch (const UserError& e) {
      EXPECT_THAT(e.what(), HasSubstr("PACKTRAIN_COLLECTIVE_TIMEOUT='" + t + "': must be seconds between 1 and 86400"));
    }
  }
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
  EXPECT_TRUE(group->any(true, "flag"));
  EXPECT_FALSE(group->any(false, "flag"));
  EXPECT_NO_THROW(group->check_same(at::arange(7, at::kFloat), "parameters", "after step 1"));
  at::Tensor strided = at::zeros({4, 4}).t();
  EXPECT_THROW(group->all_reduce_sum_(strided), c10::Error);
}

// --- the collective deadline ----------------------------------------------------

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// A probe that reports completion once `after` has passed since it was made.
std::function<bool()> completes_after(milliseconds after) {
  const auto at = Clock::now() + after;
  return [at] { return Clock::now() >= at; };
}

WatchdogOptions watchdog_options(milliseconds timeout, std::atomic<int>* timeouts = nullptr,
                                 std::function<void(const std::string&)> give_up = {}) {
  WatchdogOptions o;
  o.timeout = timeout;
  o.grace = milliseconds(2000);
  o.who = "rank 1 of 2";
  o.on_timeout = [timeouts] {
    if (timeouts != nullptr) ++*timeouts;
  };
  o.give_up = give_up ? std::move(give_up) : [](const std::string& m) { ADD_FAILURE() << "gave up: " << m; };
  return o;
}

TEST(CollectiveWatchdogTest, WorkThatCompletesInTimeIsWaitedFor) {
  std::atomic<int> timeouts = 0;
  CollectiveWatchdog watchdog(watchdog_options(milliseconds(2000), &timeouts));
  for (int i = 0; i < 5; ++i)
    watchdog.watch({"gradient all-reduce", i + 1, i + 1, completes_after(milliseconds(20 * i))});
  const auto start = Clock::now();
  watchdog.wait_all();
  EXPECT_GE(Clock::now() - start, milliseconds(60));  // it really waited for the slowest piece
  EXPECT_EQ(watchdog.pending(), 0);
  EXPECT_FALSE(watchdog.fired());
  EXPECT_EQ(timeouts.load(), 0);
  EXPECT_NO_THROW(watchdog.check());
}

TEST(CollectiveWatchdogTest, MissedDeadlineAbortsAndNamesStepsAndRank) {
  std::atomic<int> timeouts = 0;
  CollectiveWatchdog watchdog(watchdog_options(milliseconds(300), &timeouts));
  watchdog.watch({"gradient all-reduce", 1, 8, completes_after(milliseconds(0))});
  watchdog.watch({"gradient all-reduce", 17, 24, [] { return false; }});  // a dead peer: never completes
  const auto start = Clock::now();
  try {
    watchdog.wait_all();
    FAIL() << "wait_all returned although a piece never completed";
  } catch (const CollectiveError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("gradient all-reduce at steps 17-24 did not complete within 300 ms on rank 1 of 2"));
  }
  const auto waited = Clock::now() - start;
  EXPECT_GE(waited, milliseconds(300));
  EXPECT_LT(waited, milliseconds(3000));
  // The communicator is aborted once, on a thread of its own.
  for (int i = 0; i < 200 && timeouts.load() == 0; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(timeouts.load(), 1);
  EXPECT_TRUE(watchdog.fired());
  EXPECT_THROW(watchdog.check(), CollectiveError);
  EXPECT_THROW(watchdog.watch({"gradient all-reduce", 25, 25, [] { return true; }}), CollectiveError);
}

TEST(CollectiveWatchdogTest, AProbeThatFailsEndsTheWaitWithItsReason) {
  std::atomic<int> timeouts = 0;
  CollectiveWatchdog watchdog(watchdog_options(milliseconds(60'000), &timeouts));
  watchdog.watch({"gradient all-reduce", 5, 5,
                  []() -> bool { throw std::runtime_error("CUDA error: an illegal memory access"); }});
  try {
    watchdog.wait_all();
    FAIL() << "no error";
  } catch (const CollectiveError& e) {
    EXPECT_THAT(e.what(), HasSubstr("gradient all-reduce failed on rank 1 of 2: CUDA error: an illegal memory access"));
  }
  for (int i = 0; i < 200 && timeouts.load() == 0; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(timeouts.load(), 1);
}

TEST(CollectiveWatchdogTest, TheGraceRunsEvenWhileTheAbortBlocks) {
  // ncclCommAbort can block (it waits for graphs holding its kernels): the process
  // must still end after the timeout and the grace.
  std::atomic<bool> gave_up = false;
  auto release = std::make_shared<std::atomic<bool>>(false);
  WatchdogOptions o = watchdog_options(milliseconds(100), nullptr, [&](const std::string&) { gave_up = true; });
  o.grace = milliseconds(100);
  o.on_timeout = [release] {
    while (!release->load()) std::this_thread::sleep_for(milliseconds(5));
  };
  {
    CollectiveWatchdog watchdog(std::move(o));
    watchdog.watch({"gradient all-reduce", 1, 1, [] { return false; }});
    for (int i = 0; i < 400 && !gave_up; ++i) std::this_thread::sleep_for(milliseconds(5));
  }
  release->store(true);
  EXPECT_TRUE(gave_up);
}

TEST(CollectiveWatchdogTest, EachPieceGetsTheTimeoutFromWhenItBecomesTheOldest) {
  // B waits behind A: 450 ms after it was registered, but only 150 ms after A
  // completed. A per-registration clock would fire at 400 ms; the watchdog must not.
  std::atomic<int> timeouts = 0;
  CollectiveWatchdog watchdog(watchdog_options(milliseconds(400), &timeouts));
  watchdog.watch({"A", 1, 1, completes_after(milliseconds(300))});
  watchdog.watch({"B", 2, 2, completes_after(milliseconds(450))});
  EXPECT_NO_THROW(watchdog.wait_all());
  EXPECT_EQ(timeouts.load(), 0);
}

TEST(CollectiveWatchdogTest, GivesUpOnTheProcessWhenTheOwnerNeverComesBack) {
  // The owner is stuck (it never calls check or wait_all): after the timeout and the
  // grace the watchdog ends the process itself (here: records the message).
  std::atomic<bool> gave_up = false;
  std::string message;
  std::mutex m;
  WatchdogOptions o = watchdog_options(milliseconds(100), nullptr, [&](const std::string& text) {
    std::lock_guard lock(m);
    message = text;
    gave_up = true;
  });
  o.grace = milliseconds(100);
  CollectiveWatchdog watchdog(std::move(o));
  watchdog.watch({"NCCL communicator setup", -1, -1, [] { return false; }});
  const auto deadline = Clock::now() + milliseconds(5000);
  while (!gave_up && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(gave_up);
  std::lock_guard lock(m);
  EXPECT_THAT(message, HasSubstr("NCCL communicator setup did not complete within 100 ms on rank 1 of 2"));
}

TEST(CollectiveWatchdogTest, AnOwnerThatTakesTheErrorKeepsTheProcess) {
  std::atomic<bool> gave_up = false;
  WatchdogOptions o = watchdog_options(milliseconds(100), nullptr, [&](const std::string&) { gave_up = true; });
  o.grace = milliseconds(300);
  {
    CollectiveWatchdog watchdog(std::move(o));
    watchdog.watch({"gradient all-reduce", 3, 3, [] { return false; }});
    EXPECT_THROW(watchdog.wait_all(), CollectiveError);
    std::this_thread::sleep_for(milliseconds(500));  // past the grace
  }
  EXPECT_FALSE(gave_up);
}

// --- a trainer in a world of one -------------------------------------------------

using packtrain::testing::all_close;
using packtrain::testing::DeviceTest;

void ignore_log(const std::string&) {}

// The data-parallel path (gradient all-reduce between backward and the optimizer,
// initial broadcast) in a world of one changes nothing: CPU goes over Gloo, a GPU
// over NCCL recorded inside the captured step. The GPU check.
class WorldOfOneTest : public DeviceTest {};

TEST_P(WorldOfOneTest, DataParallelTrainerEqualsTrainerWithoutGroup) {
  if (!ProcessGroup::gloo_available()) GTEST_SKIP() << "built without Gloo's headers (Debian libgloo-dev)";
  if (device().is_cuda() && !ProcessGroup::nccl_available()) GTEST_SKIP() << "built without NCCL";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  // 9 steps per epoch at unroll 2: the unrolled step is captured mid-epoch 1 and the
  // remainder step in epoch 4, both while earlier replays are still being watched.
  const at::Tensor x = at::randn({150, 3}, gen, f64);
  const at::Tensor y = (x.select(1, 0).sin() + 0.5 * x.select(1, 1)).unsqueeze(1) + 3;
  const auto options = EnsembleTrainerOptions()
                           .members(3)
                           .hidden(16)
                           .epochs(5)
                           .batch_size(16)
                           .lr(1e-2)
                           .seed(5)
                           .unroll(2)
                           .device(device())
                           .log(&ignore_log);
  EnsembleTrainer alone(options);
  alone.fit(x, y);
  auto group = ProcessGroup::join(RankInfo{}, std::chrono::seconds(30), device());
  EXPECT_EQ(group->device(), device());
  EnsembleTrainer grouped(options);
  grouped.set_process_group(group.get());
  grouped.fit(x, y);
  // The broadcast and gradient all-reduces went through the group (on a GPU only
  // while warming up and capturing: replays run them from the graph).
  EXPECT_GE(group->calls(), 3);
  if (device().is_cpu()) {
    EXPECT_EQ(group->calls(), 1 + grouped.steps_taken());
  }
  if (device().is_cuda()) {
    for (graphs::CapturedStep* step : {&grouped.steps().unrolled_step(), &grouped.steps().single_step()}) {
      EXPECT_EQ(step->mode(), graphs::StepMode::kGraph)
          << step->name() << ": the NCCL all-reduce must be captured with the step: " << step->eager_reason();
    }
  }
  const at::Tensor a = alone.model().parameters().flat().detach().cpu();
  const at::Tensor b = grouped.model().parameters().flat().detach().cpu();
  EXPECT_TRUE(all_close(b, a, device().is_cuda() ? 1e-6 : 0.0));
  EXPECT_EQ(grouped.steps_taken(), alone.steps_taken());
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(WorldOfOneTest);

TEST(ProcessGroupTest, CudaTensorOnACpuGroupIsAnError) {
  if (!ProcessGroup::gloo_available()) GTEST_SKIP() << "built without Gloo's headers (Debian libgloo-dev)";
  const std::string why = packtrain::testing::device_unavailable_reason(c10::Device(c10::kCUDA, 0));
  if (!why.empty()) GTEST_SKIP() << why;
  auto group = ProcessGroup::join(RankInfo{}, std::chrono::seconds(10));
  at::Tensor t = at::ones({4}, at::TensorOptions().device(c10::Device(c10::kCUDA, 0)));
  try {
    group->all_reduce_mean_(t, "gradient all-reduce");
    FAIL() << "no error";
  } catch (const CollectiveError& e) {
    EXPECT_THAT(e.what(), HasSubstr("joined for the CPU"));
  }
}

}  // namespace
}  // namespace packtrain::runtime::distributed
