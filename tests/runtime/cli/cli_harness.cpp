// The CLI tests' shared harness (see cli_harness.h).
#include "tests/runtime/cli/cli_harness.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

namespace packtrain::cli_testing {

using packtrain::testing::env_or;

const std::string& binary() {
  static const std::string path = env_or("PACKTRAIN_BINARY", PACKTRAIN_BINARY);
  return path;
}

const std::string& source_dir() {
  static const std::string path = env_or("PACKTRAIN_SOURCE_DIR", PACKTRAIN_SOURCE_DIR);
  return path;
}

const std::string& data_dir() {
  static const std::string path = env_or("PACKTRAIN_DATA_DIR", PACKTRAIN_SOURCE_DATA_DIR);
  return path;
}

const std::string& test_python() {
#ifdef PACKTRAIN_TEST_PYTHON
  static const std::string path = env_or("PACKTRAIN_TEST_PYTHON", PACKTRAIN_TEST_PYTHON);
#else
  static const std::string path = env_or("PACKTRAIN_TEST_PYTHON", "");
#endif
  return path;
}

Result run_command(const std::string& command) {
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string out;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) out += buffer.data();
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

Result run(const std::string& args) { return run_command(binary() + " " + args); }

nlohmann::json run_json(const std::string& args) {
  std::FILE* pipe = ::popen((binary() + " " + args + " 2>/dev/null").c_str(), "r");
  std::string out;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) out += buffer.data();
  EXPECT_EQ(::pclose(pipe), 0) << args;
  return nlohmann::json::parse(out, nullptr, false);
}

std::string with_env(const Env& env, const std::string& args) {
  std::string line = "env";
  for (const auto& [name, value] : env) line += " " + name + "=" + value;
  return line + " " + binary() + " " + args;
}

Result run_with_env(const Env& env, const std::string& args) { return run_command(with_env(env, args)); }

Result launch(int nproc, const std::string& command, const std::string& launch_flags) {
  return run("launch --nproc " + std::to_string(nproc) + (launch_flags.empty() ? "" : " " + launch_flags) + " -- " +
             command);
}

Result run_ranks_by_hand(const HandStartedRanks& ranks, const std::function<std::string(int rank)>& args) {
  const std::string port = std::to_string(free_port());
  const auto rank_line = [&](int rank) {
    Env env = {{"WORLD_SIZE", std::to_string(ranks.nproc)}, {"MASTER_ADDR", "127.0.0.1"}};
    env.insert(env.end(), ranks.env.begin(), ranks.env.end());
    env.push_back({"MASTER_PORT", port});
    env.push_back({"RANK", std::to_string(rank)});
    return with_env(env, args(rank));
  };
  std::string shell = "(";
  for (int rank = 1; rank < ranks.nproc; ++rank) shell += rank_line(rank) + " >/dev/null 2>&1 & pid=$!; ";
  if (!ranks.meanwhile.empty()) shell += ranks.meanwhile + " & ";
  shell += rank_line(0) + "; echo \"rank0 exit $?\"";
  if (!ranks.afterwards.empty()) shell += "; " + ranks.afterwards;
  return run_command(shell + ")");
}

Result run_ranks_by_hand(const HandStartedRanks& ranks, const std::string& args) {
  return run_ranks_by_hand(ranks, [&args](int) { return args; });
}

std::string wait_then_kill(const std::string& checkpoint) {
  return "(while [ ! -e '" + checkpoint + "' ]; do sleep 0.1; done; sleep 0.5; kill -9 $pid)";
}

std::string kill_after(int seconds, const std::string& signal) {
  return "(sleep " + std::to_string(seconds) + "; kill " + signal + " $pid)";
}

nlohmann::json rank0_json(const std::string& out) {
  std::string json;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[rank 0] ", 0) == 0) json += line.substr(9) + "\n";
  }
  return nlohmann::json::parse(json, nullptr, false);
}

pid_t start_packtrain(const std::vector<std::string>& args, const fs::path& err) {
  const std::string& exe = binary();                 // before fork: the child only execs
  const std::string out = err.string() + ".stdout";  // beside err, not the real /dev/null
  const pid_t child = ::fork();
  if (child == 0) {
    if (std::freopen(err.c_str(), "w", stderr) == nullptr || std::freopen(out.c_str(), "w", stdout) == nullptr) {
      ::_exit(126);
    }
    std::vector<char*> argv{const_cast<char*>(exe.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  return child;
}

bool wait_for_text(const fs::path& file, const std::string& text) {
  for (int i = 0; i < 1200; ++i) {
    if (read_file(file).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

int exit_status(pid_t pid, int64_t* peak_rss_kib) {
  int raw = 0;
  struct rusage usage {};
  if (::wait4(pid, &raw, 0, &usage) != pid) return -1;
  if (peak_rss_kib != nullptr) *peak_rss_kib = usage.ru_maxrss;  // KiB on Linux
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : 1000 + (WIFSIGNALED(raw) ? WTERMSIG(raw) : 0);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::vector<std::string> shard_files(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".shard-") != std::string::npos) names.push_back(e.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string yes_no_tsv(int rows) {
  std::string out;
  const char* words[] = {"the cat", "a dog ran", "on the mat", "it sat"};
  for (int i = 0; i < rows; ++i)
    out += std::string("src\t") + (i % 2 ? "1\t\tyes " : "0\t*\tno ") + words[i % 4] + ".\n";
  return out;
}

Cli::Cli()
    : temp_(std::string("packtrain_cli_test_") + ::testing::UnitTest::GetInstance()->current_test_info()->name()) {}

std::string Cli::concrete_csv(const std::string& name, int rows, bool with_target) const {
  std::ifstream in(data_dir() + "/concrete/data.txt");
  std::string out = "cement,slag,ash,water,plasticizer,coarse,fine,age";
  out += with_target ? ",strength\n" : "\n";
  std::string line;
  for (int r = 0; r < rows && std::getline(in, line); ++r) {
    std::istringstream fields(line);
    std::string cell, row;
    for (int c = 0; c < (with_target ? 9 : 8) && fields >> cell; ++c) row += (c ? "," : "") + cell;
    out += row + "\n";
  }
  write_file(path(name), out);
  return path(name);
}

}  // namespace packtrain::cli_testing
