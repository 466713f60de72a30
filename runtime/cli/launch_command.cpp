// `packtrain launch --nproc N -- <subcommand> …`: a one-node launcher. Starts N
// copies of this binary with the variables torchrun sets (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), forwards each one's
// stdout and stderr line by line with a "[rank r] " prefix, and, when a rank fails,
// stops the others after a grace period (SIGTERM, then SIGKILL after another one)
// and exits with the failing rank's status. Each Ctrl-C is passed on to every rank
// (runtime/cli/interrupt.h), and so are SIGTERM and SIGHUP. No rank outlives the
// launcher: each is in its own process group (a terminal's Ctrl-C reaches it once,
// through the launcher) and dies with it (PR_SET_PDEATHSIG), and a launcher that
// fails to start every rank stops the ones it started.
#include "packtrain/runtime/cli/cli_common.h"
#include "packtrain/runtime/cli/commands.h"
#include "packtrain/runtime/cli/interrupt.h"
#include "packtrain/runtime/cli/range_checks.h"
#include "packtrain/runtime/distributed/rank_info.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace packtrain::cli {

namespace {

struct LaunchArgs {
  int64_t nproc = 2;
  int64_t max_nproc = 0;  // 0: 4 per CPU core, at least 8
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 0;  // 0: a free port
  double grace_seconds = 10;
  double timeout_seconds = 0;  // 0: not given (PACKTRAIN_COLLECTIVE_TIMEOUT if set, else 60 s)
  std::vector<std::string> command;
};

// The port rank 0's store will listen on: --master-port, checked by binding it (as
// rank 0 will, SO_REUSEADDR) so that a busy one ends the launch before any rank
// starts; or, for 0, one the kernel picks. An address that is not numeric (a host
// name) is left to rank 0, which resolves it.
int store_port(const std::string& addr, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, addr.c_str(), &a.sin_addr) != 1) {
    if (port != 0) return port;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw UsageError(fmt::format("launch: cannot open a socket: {}", std::strerror(errno)));
  const int yes = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  const int error = errno;
  ::close(fd);
  if (ok) return ntohs(a.sin_port);
  if (port == 0) throw UsageError("launch: cannot find a free port on " + addr + "; pass --master-port");
  throw UsageError(fmt::format("launch: cannot listen on {}:{} (--master-addr:--master-port): {}", addr, port,
                               std::strerror(error)));
}

struct Child {
  pid_t pid = -1;
  int out = -1, err = -1;  // read ends
  std::string out_buffer, err_buffer;
  int status = -1;  // exit status once reaped
};

// Prints complete lines of `buffer` with the rank prefix; with `flush`, the rest too.
void emit(std::string& buffer, int64_t rank, std::FILE* stream, bool flush) {
  size_t start = 0;
  for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
    fmt::print(stream, "[rank {}] {}\n", rank, buffer.substr(start, nl - start));
  }
  buffer.erase(0, start);
  if (flush && !buffer.empty()) {
    fmt::print(stream, "[rank {}] {}\n", rank, buffer);
    buffer.clear();
  }
  std::fflush(stream);
}

// Starts rank r: this binary with the variables torchrun sets, its stdout and
// stderr into pipes the launcher reads.
Child start_rank(const LaunchArgs& a, int port, int64_t r) {
  const pid_t launcher = ::getpid();
  int out[2], err[2];
  if (::pipe(out) != 0 || ::pipe(err) != 0) throw std::runtime_error("launch: pipe() failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("launch: fork() failed");
  if (pid == 0) {
    // Dies with the launcher however it ends (even SIGKILL); a launcher already gone
    // before this line leaves the rank re-parented: exit at once.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(1);
    ::setpgid(0, 0);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::close(out[0]), ::close(out[1]), ::close(err[0]), ::close(err[1]);
    ::setenv("RANK", std::to_string(r).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(a.nproc).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(a.nproc).c_str(), 1);
    ::setenv("MASTER_ADDR", a.master_addr.c_str(), 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    // Every rank is on this host: Gloo binds to loopback unless the user chose an
    // interface (a host whose name does not resolve otherwise gets Gloo's warning).
    ::setenv("GLOO_SOCKET_IFNAME", "lo", /*overwrite=*/0);
    if (a.timeout_seconds > 0) {
      ::setenv("PACKTRAIN_COLLECTIVE_TIMEOUT", fmt::format("{}", a.timeout_seconds).c_str(), 1);
    }
    std::vector<std::string> args{"packtrain"};
    args.insert(args.end(), a.command.begin(), a.command.end());
    std::vector<char*> argv;
    for (std::string& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    std::fprintf(stderr, "launch: exec failed: %s\n", std::strerror(errno));
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  return {pid, out[0], err[0], {}, {}, -1};
}

// Forwards what the ranks wrote since the last call (waiting up to 100 ms).
void forward_output(std::vector<Child>& children) {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, bool>> owner;  // child, is stderr
  for (size_t i = 0; i < children.size(); ++i) {
    if (children[i].out >= 0) fds.push_back({children[i].out, POLLIN, 0}), owner.emplace_back(i, false);
    if (children[i].err >= 0) fds.push_back({children[i].err, POLLIN, 0}), owner.emplace_back(i, true);
  }
  if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
  for (size_t f = 0; f < fds.size(); ++f) {
    if ((fds[f].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    Child& c = children[owner[f].first];
    const bool is_err = owner[f].second;
    char chunk[4096];
    const ssize_t n = ::read(fds[f].fd, chunk, sizeof(chunk));
    std::string& buffer = is_err ? c.err_buffer : c.out_buffer;
    if (n > 0) {
      buffer.append(chunk, static_cast<size_t>(n));
      emit(buffer, static_cast<int64_t>(owner[f].first), is_err ? stderr : stdout, false);
    } else {
      emit(buffer, static_cast<int64_t>(owner[f].first), is_err ? stderr : stdout, true);
      ::close(fds[f].fd);
      (is_err ? c.err : c.out) = -1;
    }
  }
}

// Reads what the ranks wrote just before they exited and forwards it.
void drain_output(std::vector<Child>& children) {
  for (Child& c : children) {
    for (int* fd : {&c.out, &c.err}) {
      if (*fd < 0) continue;
      char chunk[4096];
      for (ssize_t n; (n = ::read(*fd, chunk, sizeof(chunk))) > 0;) {
        (fd == &c.out ? c.out_buffer : c.err_buffer).append(chunk, static_cast<size_t>(n));
      }
      ::close(*fd);
    }
    const int64_t r = &c - children.data();
    emit(c.out_buffer, r, stdout, true);
    emit(c.err_buffer, r, stderr, true);
  }
}

// SIGTERM and SIGHUP sent to the launcher, to be passed on to the ranks.
volatile std::sig_atomic_t g_forward_signal = 0;
extern "C" void on_forwarded_signal(int signal) { g_forward_signal = signal; }

// Installs the TERM/HUP handlers for the launcher's lifetime.
class ForwardedSignals {
 public:
  ForwardedSignals() {
    g_forward_signal = 0;
    struct sigaction action {};
    action.sa_handler = on_forwarded_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, &term_);
    sigaction(SIGHUP, &action, &hup_);
  }
  ~ForwardedSignals() {
    sigaction(SIGTERM, &term_, nullptr);
    sigaction(SIGHUP, &hup_, nullptr);
  }
  ForwardedSignals(const ForwardedSignals&) = delete;
  ForwardedSignals& operator=(const ForwardedSignals&) = delete;

 private:
  struct sigaction term_ {
  }, hup_{};
};

void signal_running(const std::vector<Child>& children, int signal) {
  for (const Child& c : children) {
    if (c.status >= 0) continue;
    ::kill(c.pid, signal);
    if (signal == SIGTERM) ::kill(c.pid, SIGCONT);  // a stopped rank must run to act on it
  }
}

std::string running_ranks(const std::vector<Child>& children) {
  std::vector<size_t> ranks;
  for (size_t i = 0; i < children.size(); ++i)
    if (children[i].status < 0) ranks.push_back(i);
  return fmt::format("{}", fmt::join(ranks, ", "));
}

// Runs until every rank has exited: forwards their output, each Ctrl-C (the
// ranks' run driver stops after the epoch at the first, at once at the second) and
// SIGTERM/SIGHUP; a grace period after a rank fails (or after a forwarded TERM/HUP)
// it sends the others SIGTERM, and SIGKILL a grace period later — a stopped or
// hung rank cannot keep the launcher waiting. Returns the first failure's status
// (128 + signal when the launcher was told to stop by one), but 2 where that was 1
// and another rank exited 2 (its user error is why the first lost its peer).
int supervise(std::vector<Child>& children, const LaunchArgs& a, const Interrupts& interrupts) {
  using clock = std::chrono::steady_clock;
  int first_failure = 0, told_to_stop = 0;
  int64_t failed_rank = -1, forwarded = 0;
  clock::time_point deadline = clock::time_point::max();  // when the next escalation is due
  int escalation = 0;                                     // 0: none yet, 1: SIGTERM sent, 2: SIGKILL sent
  size_t running = children.size();
  const auto grace = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(a.grace_seconds));
  while (running > 0) {
    for (; forwarded < interrupts.presses(); ++forwarded) signal_running(children, SIGINT);
    if (const int sig = g_forward_signal; sig != 0 && told_to_stop == 0) {
      told_to_stop = sig;
      signal_running(children, sig);
      escalation = 1;  // the ranks have the signal; SIGKILL if they are still here after the grace
      deadline = clock::now() + grace;
      fmt::print(stderr, "launch: got {}; passed it on to ranks {}\n", sig == SIGTERM ? "SIGTERM" : "SIGHUP",
                 running_ranks(children));
    }
    forward_output(children);
    for (size_t i = 0; i < children.size(); ++i) {
      Child& c = children[i];
      if (c.status >= 0) continue;
      int raw = 0;
      if (::waitpid(c.pid, &raw, WNOHANG) != c.pid) continue;
      c.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
      --running;
      if (c.status != 0 && first_failure == 0 && told_to_stop == 0) {
        first_failure = c.status;
        failed_rank = static_cast<int64_t>(i);
        deadline = clock::now() + grace;
        fmt::print(stderr, "launch: rank {} exited with status {}; the others get {} s to finish\n", i, c.status,
                   a.grace_seconds);
      }
    }
    if (running > 0 && clock::now() > deadline && escalation < 2) {
      const std::string ranks = running_ranks(children);
      if (escalation == 0) {
        signal_running(children, SIGTERM);
        fmt::print(stderr, "launch: sent SIGTERM to ranks {} (rank {} had failed); SIGKILL in {} s if still running\n",
                   ranks, failed_rank, a.grace_seconds);
      } else {
        signal_running(children, SIGKILL);
        fmt::print(stderr, "launch: ranks {} still running {} s after SIGTERM: killed them (SIGKILL)\n", ranks,
                   a.grace_seconds);
      }
      ++escalation;
      deadline = clock::now() + grace;
    }
  }
  if (told_to_stop != 0) return 128 + told_to_stop;
  // A rank that lost its peer fails with an internal error (1) while the peer exits 2
  // with the real reason, a user error: the launch says what the user must change.
  if (first_failure == 1 &&
      std::any_of(children.begin(), children.end(), [](const Child& c) { return c.status == 2; })) {
    return 2;
  }
  return first_failure;
}

// Stops and reaps ranks started before a failure to start the rest.
void stop_started(std::vector<Child>& children) {
  signal_running(children, SIGKILL);
  for (Child& c : children) {
    int raw = 0;
    ::waitpid(c.pid, &raw, 0);
    if (c.out >= 0) ::close(c.out);
    if (c.err >= 0) ::close(c.err);
  }
}

int64_t nproc_limit(const LaunchArgs& a) {
  if (a.max_nproc > 0) return a.max_nproc;
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  return std::max<int64_t>(8, 4 * static_cast<int64_t>(cores > 0 ? cores : 1));
}

int run_launch(const LaunchArgs& a) {
  if (a.command.empty())
    throw UsageError("launch: give the command after --, e.g. packtrain launch --nproc 2 -- train");
  if (a.command.front() == "launch") throw UsageError("launch: the command cannot itself be launch");
  if (a.nproc > nproc_limit(a)) {
    const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    throw UsageError(
        fmt::format("launch: --nproc {} is more than {} ({}; every rank is a whole process with its "
                    "own copy of the model and data); pass --max-nproc N to allow more",
                    a.nproc, nproc_limit(a),
                    a.max_nproc > 0 ? "--max-nproc" : fmt::format("4 per CPU core here, {} cores", cores)));
  }
  const int port = store_port(a.master_addr, static_cast<int>(a.master_port));
  fmt::print(stderr, "launch: {} processes, store {}:{}, command: packtrain {}\n", a.nproc, a.master_addr, port,
             fmt::join(a.command, " "));
  const ForwardedSignals forwarded;              // before the first fork: a TERM/HUP from now on reaches the ranks
  const Interrupts interrupts(/*end_after=*/0);  // forwarded: the ranks decide
  std::vector<Child> children;
  try {
    for (int64_t r = 0; r < a.nproc; ++r) children.push_back(start_rank(a, port, r));
  } catch (const std::exception& e) {
    stop_started(children);
    throw std::runtime_error(
        fmt::format("{} (after starting {} of {} ranks; those were stopped)", e.what(), children.size(), a.nproc));
  }
  const int first_failure = supervise(children, a, interrupts);
  drain_output(children);
  return interrupts.presses() > 0 && first_failure == 0 ? 130 : first_failure;
}

}  // namespace

void add_launch_command(CLI::App& app, int& status) {
  auto a = std::make_shared<LaunchArgs>();
  CLI::App* launch = app.add_subcommand(
      "launch",
      "Run a packtrain command in N processes on this machine, as torchrun would: each gets RANK, WORLD_SIZE, "
      "LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (and GLOO_SOCKET_IFNAME=lo unless set: all "
      "ranks are on this host); output is forwarded with a [rank r] prefix. "
      "Example: packtrain launch --nproc 2 -- info --collectives");
  launch->add_option("--nproc", a->nproc, "Processes to start (one per GPU on a GPU machine)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}))
      ->capture_default_str();
  launch->add_option("--max-nproc", a->max_nproc, "Most processes --nproc may start (0: 4 per CPU core, at least 8)")
      ->check(CLI::Range(int64_t{0}, int64_t{1024}))
      ->capture_default_str();
  launch->add_option("--master-addr", a->master_addr, "Address of rank 0's store")->capture_default_str();
  launch->add_option("--master-port", a->master_port, "Port of rank 0's store (0: a free one)")
      ->check(CLI::Range(int64_t{0}, int64_t{65535}))
      ->capture_default_str();
  launch
      ->add_option("--grace", a->grace_seconds,
                   "Seconds the other ranks get after one fails (then SIGTERM; SIGKILL after as many again)")
      ->check(non_negative())
      ->capture_default_str();
  launch
      ->add_option("--timeout", a->timeout_seconds,
                   "Seconds the rendezvous and each collective may take before every rank stops with an error "
                   "(sets PACKTRAIN_COLLECTIVE_TIMEOUT; default: that variable if set, else 60)")
      ->check(between(runtime::distributed::kMinTimeoutSeconds, runtime::distributed::kMaxTimeoutSeconds));
  launch->add_option("command", a->command, "The packtrain command and its arguments, after --")->required();
  launch->callback([a, &status] { status = run_launch(*a); });
}

}  // namespace packtrain::cli
