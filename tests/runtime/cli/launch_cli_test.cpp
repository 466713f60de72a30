// The launcher against a hostile machine: --nproc is bounded, SIGTERM and SIGHUP
// reach the ranks, no rank outlives the launcher (even one killed with SIGKILL), and
// a stopped rank is killed after the grace periods, with the launcher saying so.
// The rendezvous: timeouts outside their range are refused; a busy MASTER_PORT, an
// unreachable store and a rank that never comes each end with one line, within the
// timeout.
#include "tests/runtime/cli/cli_harness.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
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
  return {"--nproc", "2",         "--grace", "2",        "--",  "train", "--epochs",
          "100000",  "--members", "2",       "--device", "cpu", "--log", log.string()};
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
  const auto [launcher, ranks] =
      start_training({"--nproc", "2", "--grace", "1", "--timeout", "3", "--", "train", "--epochs", "100000",
                      "--members", "2", "--device", "cpu", "--log", log.string()},
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
  EXPECT_THAT(said, ::testing::AnyOf(HasSubstr("killed them (SIGKILL)"), HasSubstr("sent SIGTERM to ranks 1"))) << said;
  EXPECT_THAT(said, ::testing::Not(HasSubstr("stopped the remaining ranks"))) << "the old, untrue report";
}

TEST_F(Cli, TimeoutsOutsideASecondToADayAreRefused) {
  for (const std::string t : {"nan", "inf", "1e300", "1e10", "0.0001", "1e400"}) {
    const Result r = run("launch --nproc 2 --timeout " + t + " -- info --collectives");
    EXPECT_EQ(r.status, 2) << t << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr("--timeout: must be between 1 and 86400, got " + t)) << r.out;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("[rank"))) << "nothing was started";
  }
  // The variable itself (set by hand, or by a launcher other than ours).
  const Result r = run_with_env({{"PACKTRAIN_COLLECTIVE_TIMEOUT", "nan"},
                                 {"RANK", "0"},
                                 {"WORLD_SIZE", "2"},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", std::to_string(free_port())}},
                                "info --collectives");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("PACKTRAIN_COLLECTIVE_TIMEOUT='nan': must be seconds between 1 and 86400"));
}

// A port someone else holds: a socket listening on 127.0.0.1, for the test's life.
class BusyPort {
 public:
  BusyPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof(a);
    if (fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd_, 16) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &size) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~BusyPort() { ::close(fd_); }
  BusyPort(const BusyPort&) = delete;
  BusyPort& operator=(const BusyPort&) = delete;
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

// `packtrain ARGS` as rank RANK of 2 with a store at 127.0.0.1:PORT and a timeout of
// TIMEOUT seconds; what it printed and how long it took.
struct TimedResult {
  Result result;
  double seconds;
};
TimedResult run_as_rank(int rank, int port, int timeout, const std::string& args) {
  const auto start = std::chrono::steady_clock::now();
  Result r = run_with_env({{"RANK", std::to_string(rank)},
                           {"WORLD_SIZE", "2"},
                           {"MASTER_ADDR", "127.0.0.1"},
                           {"MASTER_PORT", std::to_string(port)},
                           {"PACKTRAIN_COLLECTIVE_TIMEOUT", std::to_string(timeout)}},
                          args);
  return {std::move(r), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

long lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

TEST_F(Cli, ABusyMasterPortIsOneLineAtOnce) {
  const BusyPort busy;
  ASSERT_GT(busy.port(), 0);
  const std::string where = "127.0.0.1:" + std::to_string(busy.port());
  const auto [r, seconds] = run_as_rank(0, busy.port(), 10, "info --collectives");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr(where));
  EXPECT_THAT(r.out, HasSubstr("Address already in use"));
  EXPECT_LT(seconds, 5) << "no wait for a port that is taken";
  // The launcher checks --master-port before it starts a rank.
  const auto start = std::chrono::steady_clock::now();
  const Result launched = launch(2, "info --collectives", "--master-port " + std::to_string(busy.port()));
  EXPECT_EQ(launched.status, 2) << launched.out;
  EXPECT_EQ(lines(launched.out), 1) << launched.out;
  EXPECT_THAT(launched.out, HasSubstr("cannot listen on " + where));
  EXPECT_THAT(launched.out, HasSubstr("Address already in use"));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5);
}

TEST_F(Cli, AnUnreachableStoreIsOneLineWithinTheTimeout) {
  const int port = free_port();
  const auto [r, seconds] = run_as_rank(1, port, 2, "info --collectives");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("rank 1 of 2 could not reach the store at 127.0.0.1:" + std::to_string(port) +
                               " within 2 s: Connection refused"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("frame #")));
  EXPECT_LT(seconds, 2 + 3) << "the timeout (2 s) and the process's start, no retries after it\n" << r.out;
}

TEST_F(Cli, ARankThatNeverComesIsOneLineWithinTheTimeout) {
  const int port = free_port();
  const auto [r, seconds] = run_as_rank(0, port, 2, "info --collectives");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("1 of 2 ranks reached the store at 127.0.0.1:" + std::to_string(port) + " within 2 s"));
  EXPECT_LT(seconds, 2 + 3) << "the timeout (2 s) and the process's start\n" << r.out;
}

}  // namespace
}  // namespace packtrain::cli_testing
