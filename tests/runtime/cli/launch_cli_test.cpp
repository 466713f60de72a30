// The launcher against a hostile machine: --nproc is bounded, SIGTERM and SIGHUP
// reach the ranks, no rank outlives the launcher (even one killed with SIGKILL), and
// a stopped rank is killed after the grace periods, with the launcher saying so.
#include "tests/runtime/cli/cli_harness.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// A process's state letter and parent, from /proc/PID/stat; none once it is reaped.
struct ProcStat {
  char state = 0;
  pid_t ppid = 0;
};
std::optional<ProcStat> proc_stat(const std::string& pid) {
  std::ifstream stat("/proc/" + pid + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return std::nullopt;
  // pid (comm) state ppid ...: comm may hold spaces; parse after the last ')'.
  std::istringstream rest(line.substr(line.rfind(')') + 1));
  ProcStat s;
  rest >> s.state >> s.ppid;
  return s;
}

// Children of `parent` (the ranks a launcher started).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (const auto s = proc_stat(name); s && s->ppid == parent) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// Gone: no such process, or a zombie (dead, waiting for whoever reaps orphans).
bool gone(pid_t pid) {
  const auto s = proc_stat(std::to_string(pid));
  return !s || s->state == 'Z' || s->state == 'X';
}

bool all_gone_within(const std::vector<pid_t>& pids, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    bool done = true;
    for (pid_t p : pids) done = done && gone(p);
    if (done) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(100ms);
  }
}

// `packtrain launch ARGS` in the background, stderr into `err`; its pid.
pid_t start_launch(std::vector<std::string> args, const fs::path& err) {
  args.insert(args.begin(), "launch");
  return start_packtrain(args, err);
}

// Starts a long data-parallel run under the launcher and waits until it trains;
// the launcher's pid and its two ranks' pids (rank order).
struct Running {
  pid_t launcher = -1;
  std::vector<pid_t> ranks;
};
Running start_training(const std::vector<std::string>& args, const fs::path& log, const fs::path& err) {
  Running r;
  r.launcher = start_launch(args, err);
  if (r.launcher <= 0 || !wait_for_text(log, "epoch    2/")) return r;
  r.ranks = children_of(r.launcher);
  std::sort(r.ranks.begin(), r.ranks.end());  // started in rank order
  return r;
}

std::vector<std::string> long_run(const fs::path& log) {
  return {"--nproc", "2", "--grace", "2", "--",       "train",        "--epochs", "100000",
          "--members", "2", "--device", "cpu", "--log", log.string()};
}

TEST_F(Cli, LaunchNprocIsBoundedUnlessRaised) {
  const Result r = run("launch --nproc 1000 -- info");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--nproc 1000 is more than"));
  EXPECT_THAT(r.out, HasSubstr("--max-nproc"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("[rank"))) << "nothing was started";
  EXPECT_EQ(run("launch --nproc 3 --max-nproc 2 -- info").status, 2);
  const Result raised = run("launch --nproc 3 --max-nproc 3 -- info --collectives");
  EXPECT_EQ(raised.status, 0) << raised.out;
}

TEST_F(Cli, LaunchPassesOnTermAndHupAndLeavesNoRankBehind) {
  for (const int signal : {SIGTERM, SIGHUP}) {
    SCOPED_TRACE(signal == SIGTERM ? "SIGTERM" : "SIGHUP");
    const fs::path log = path("run" + std::to_string(signal) + ".log"), err = path("err" + std::to_string(signal));
    const auto [launcher, ranks] = start_training(long_run(log), log, err);
    ASSERT_EQ(ranks.size(), 2u) << read_file(err);
    kill(launcher, signal);
    EXPECT_EQ(exit_status(launcher), 128 + signal) << read_file(err);
    EXPECT_TRUE(all_gone_within(ranks, 5s)) << "a rank outlived the launcher";
    EXPECT_THAT(read_file(err), HasSubstr("passed it on to ranks 0, 1"));
  }
}

// The listening sockets on `port` (from /proc/net/tcp and tcp6, state LISTEN), as
// the kernel's hex local addresses ("0100007F" is 127.0.0.1; all zeros: every
// interface).
std::vector<std::string> listening_on(int port) {
  std::vector<std::string> out;
  char hex_port[8];
  std::snprintf(hex_port, sizeof(hex_port), "%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const size_t colon = local.find(':');
      if (state == "0A" && local.substr(colon + 1) == hex_port) out.push_back(local.substr(0, colon));
    }
  }
  return out;
}

TEST_F(Cli, TheStoreListensOnlyOnTheAddressMasterAddrNames) {
  const fs::path log = path("run.log"), err = path("err");
  const auto [launcher, ranks] = start_training(long_run(log), log, err);
  ASSERT_EQ(ranks.size(), 2u) << read_file(err);
  std::smatch m;
  const std::string said = read_file(err);
  ASSERT_TRUE(std::regex_search(said, m, std::regex("store 127\\.0\\.0\\.1:([0-9]+)"))) << said;
  const std::vector<std::string> addresses = listening_on(std::stoi(m[1]));
  kill(launcher, SIGTERM);
  exit_status(launcher);
  ASSERT_FALSE(addresses.empty()) << "no store listening on port " << m[1];
  for (const std::string& a : addresses) EXPECT_EQ(a, "0100007F") << "the store listens beyond loopback";
}

TEST_F(Cli, AKilledLauncherTakesItsRanksWithIt) {
  const fs::path log = path("run.log"), err = path("err");
  const auto [launcher, ranks] = start_training(long_run(log), log, err);
  ASSERT_EQ(ranks.size(), 2u) << read_file(err);
  kill(launcher, SIGKILL);
  exit_status(launcher);
  EXPECT_TRUE(all_gone_within(ranks, 5s)) << "ranks orphaned by a launcher killed with SIGKILL";
}

TEST_F(Cli, AStoppedRankIsKilledAfterTheGraceAndTheLauncherSaysSo) {
  const fs::path log = path("run.log"), err = path("err");
  const auto [launcher, ranks] = start_training({"--nproc", "2", "--grace", "1", "--timeout", "3", "--", "train",
                                                 "--epochs", "100000", "--members", "2", "--device", "cpu", "--log",
                                                 log.string()},
                                                log, err);
  ASSERT_EQ(ranks.size(), 2u) << read_file(err);
  kill(ranks[1], SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  const int status = exit_status(launcher);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string said = read_file(err);
  EXPECT_NE(status, 0) << said;
  EXPECT_LT(seconds, 60) << "the collective timeout (3 s) and two graces (1 s) bound the wait\n" << said;
  EXPECT_TRUE(all_gone_within(ranks, 5s));
  EXPECT_THAT(said, HasSubstr("exited with status"));
  EXPECT_THAT(said, ::testing::AnyOf(HasSubstr("killed them (SIGKILL)"), HasSubstr("sent SIGTERM to ranks 1")))
      << said;
  EXPECT_THAT(said, ::testing::Not(HasSubstr("stopped the remaining ranks"))) << "the old, untrue report";
}

}  // namespace
}  // namespace packtrain::cli_testing
