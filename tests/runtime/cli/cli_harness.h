// The harness the CLI tests share: the packtrain binary run as a user runs it (a
// shell command, its exit status and output), the fixture `Cli` with a fresh
// temporary directory per test, the bundled-data inputs, and the ways the tests
// start several ranks: `packtrain launch --nproc N -- ...`, or by hand with the
// rendezvous variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) as torchrun or
// srun would set them.
//
// PACKTRAIN_BINARY, PACKTRAIN_SOURCE_DIR and PACKTRAIN_SOURCE_DATA_DIR (and
// PACKTRAIN_TEST_PYTHON where a Python was found) are compile definitions of the
// cli_tests target; environment variables of the same names (PACKTRAIN_DATA_DIR
// for the data) override them at run time (binary(), source_dir() ... below).
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/test_support.h"

namespace packtrain::cli_testing {

using packtrain::testing::free_port;

namespace fs = std::filesystem;

// --- where things are: $NAME if set, else the compiled-in path

// The packtrain binary ($PACKTRAIN_BINARY).
const std::string& binary();
// The source tree ($PACKTRAIN_SOURCE_DIR), for its scripts.
const std::string& source_dir();
// The bundled data ($PACKTRAIN_DATA_DIR, as packtrain itself reads it).
const std::string& data_dir();
// A Python with torch and numpy ($PACKTRAIN_TEST_PYTHON); empty when none.
const std::string& test_python();

// --- running packtrain

struct Result {
  int status;       // the exit status; -1 when the command did not exit normally
  std::string out;  // stdout and stderr together
};

// A shell command line; its stdout and stderr together.
Result run_command(const std::string& command);
// `packtrain ARGS`.
Result run(const std::string& args);
// `packtrain ARGS`, stdout only (JSON), stderr discarded; the command must succeed.
nlohmann::json run_json(const std::string& args);

// Environment variables, NAME and value, for one packtrain process.
using Env = std::vector<std::pair<std::string, std::string>>;
// The shell line `env NAME=value ... packtrain ARGS`.
std::string with_env(const Env& env, const std::string& args);
// `packtrain ARGS` with these variables set.
Result run_with_env(const Env& env, const std::string& args);

// --- several ranks

// `packtrain launch --nproc N [LAUNCH_FLAGS] -- COMMAND`: stdout and stderr
// together, each rank's lines prefixed "[rank K] " by launch.
Result launch(int nproc, const std::string& command, const std::string& launch_flags = {});

// Ranks started by hand, without launch: each a packtrain process with RANK,
// WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT (a free port) set.
struct HandStartedRanks {
  int nproc = 2;
  Env env = {};                 // more variables for every rank (PACKTRAIN_COLLECTIVE_TIMEOUT)
  std::string meanwhile = {};   // a shell fragment run in the background once ranks 1..N-1 run
                                // ($pid: the process id of rank N-1; see wait_then_kill, kill_after)
  std::string afterwards = {};  // a shell fragment run once rank 0 has exited (`wait`, `kill -9 $pid`)
};
// Starts ranks 1..N-1 in the background (their output discarded), then
// `meanwhile`, then rank 0 in the foreground; rank 0's output is followed by the
// line "rank0 exit STATUS", then `afterwards` runs. `args(rank)`: that rank's
// packtrain arguments.
Result run_ranks_by_hand(const HandStartedRanks& ranks, const std::function<std::string(int rank)>& args);
// The same arguments for every rank.
Result run_ranks_by_hand(const HandStartedRanks& ranks, const std::string& args);

// A shell fragment that kills $pid (SIGKILL) once `checkpoint` exists and half a
// second more has passed: midway through a run that has committed a checkpoint,
// however slowly the machine starts the processes.
std::string wait_then_kill(const std::string& checkpoint);
// A shell fragment that sends $pid `signal` (kill's flag: "-9", "-STOP") after `seconds`.
std::string kill_after(int seconds, const std::string& signal);

// The JSON a launched rank 0 printed (its lines carry the "[rank 0] " prefix).
nlohmann::json rank0_json(const std::string& out);

// --- a packtrain process in the background

// Starts `packtrain ARGS` with stderr into `err` and stdout discarded; its pid (the
// caller signals and waits for it).
pid_t start_packtrain(const std::vector<std::string>& args, const fs::path& err);
// Waits until `file` holds `text` (at most 120 s); false if it never does.
bool wait_for_text(const fs::path& file, const std::string& text);
// Waits for `pid`: its exit status, or 1000 + the signal that ended it; with
// `peak_rss_kib`, also its peak resident memory.
int exit_status(pid_t pid, int64_t* peak_rss_kib = nullptr);

// --- files

std::string read_file(const fs::path& path);
void write_file(const fs::path& path, const std::string& text);
// The shard files a member-parallel checkpoint directory holds, sorted by name.
std::vector<std::string> shard_files(const fs::path& dir);

// --- inputs

// A small ensemble run on the bundled concrete data.
inline constexpr const char* kSmall = "--members 4 --epochs 8 --hidden 32 --device cpu";

// A tiny multi-task run: label 1 when a sentence starts with "yes".
inline constexpr const char* kTinyModel = "--width 16 --layers 1 --max-length 32 --batch 4 --device cpu -q";
inline const std::string kTinyShape = std::string(kTinyModel) + " --heads 2 --buckets 16,32";
inline const std::string kTinyMultitask = kTinyShape + " --epochs 2";

// `rows` multi-task TSV rows (source, label, annotation, sentence): odd rows
// "yes ...", labelled 1, even rows "no ...", labelled 0.
std::string yes_no_tsv(int rows);

// --- the fixture

// Every CLI test: a fresh temporary directory, removed with its files after the test.
class Cli : public ::testing::Test {
 protected:
  Cli();

  const fs::path& dir() const { return temp_.path(); }
  // NAME in the test's directory.
  std::string path(const std::string& name) const { return (dir() / name).string(); }
  // A CSV of the first `rows` concrete rows: a header, 8 feature columns (+ target),
  // written to NAME in the test's directory; its path.
  std::string concrete_csv(const std::string& name, int rows, bool with_target) const;

 private:
  packtrain::testing::ScopedTempDir temp_;
};

}  // namespace packtrain::cli_testing
