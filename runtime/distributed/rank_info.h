// Where this process stands in a multi-process run, read from the variables that
// torchrun (and `packtrain launch`) set — RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT — or, under srun, Slurm's SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID (with MASTER_ADDR/MASTER_PORT from the job script).
// No variables: a single process (rank 0 of 1).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace packtrain::runtime::distributed {

struct RankInfo {
  int64_t rank = 0, world_size = 1;
  int64_t local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  std::string source = "single process";  // "torchrun variables", "Slurm variables"
  // torchrun's agent already serves the store at MASTER_ADDR:MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True): every rank, rank 0 too, connects as a client,
  // as c10d's env:// initialization does.
  bool agent_store = false;

  bool distributed() const { return world_size > 1; }
  // Started by a launcher (torchrun, srun, packtrain launch), even with one process:
  // such a run joins a group, so `launch --nproc 1` runs the data-parallel path.
  bool launched() const { return source != "single process"; }
  std::string describe() const;  // "rank 1 of 2 (local 1 of 2), store 127.0.0.1:29500, from torchrun variables"
};

// A variable's value, or nothing when unset (std::getenv by default; tests pass a map).
using Environment = std::function<std::optional<std::string>(const std::string& name)>;
Environment process_environment();

// Throws packtrain::UserError naming the variable for a malformed or inconsistent value: a
// non-integer, RANK outside [0, WORLD_SIZE), LOCAL_RANK outside [0, LOCAL_WORLD_SIZE),
// a port outside 1..65535, RANK without WORLD_SIZE, or WORLD_SIZE > 1 without MASTER_ADDR.
RankInfo rank_info_from_environment(const Environment& environment = process_environment());

// The range of a collective timeout, in seconds: a second (less fails on a loaded
// machine's ordinary delays) to a day (a store or a peer that has not answered in a
// day never will).
inline constexpr double kMinTimeoutSeconds = 1;
inline constexpr double kMaxTimeoutSeconds = 86400;

// How long a collective (and the rendezvous at the store) may take before every rank
// fails with an error instead of waiting on a dead or stuck peer:
// PACKTRAIN_COLLECTIVE_TIMEOUT (seconds; `packtrain launch --timeout` sets it),
// default 60. Throws packtrain::UserError for a value that is not a number of seconds in
// [kMinTimeoutSeconds, kMaxTimeoutSeconds] (nan, inf, 0.0001, 1e10), naming it.
std::chrono::milliseconds collective_timeout(const Environment& environment = process_environment());

}  // namespace packtrain::runtime::distributed
