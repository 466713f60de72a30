#include "packtrain/runtime/distributed/rank_info.h"

#include "packtrain/base/user_error.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace packtrain::runtime::distributed {

namespace {

int64_t integer(const Environment& env, const std::string& name, int64_t fallback) {
  const std::optional<std::string> value = env(name);
  if (!value) return fallback;
  int64_t out = 0;
  const auto [end, error] = std::from_chars(value->data(), value->data() + value->size(), out);
  if (error != std::errc() || end != value->data() + value->size()) {
    throw UserError(fmt::format("environment variable {}='{}' is not an integer", name, *value));
  }
  return out;
}

}  // namespace

std::string RankInfo::describe() const {
  return fmt::format("rank {} of {} (local {} of {}), store {}:{}{}, from {}", rank, world_size, local_rank,
                     local_world_size, master_addr, master_port, agent_store ? " (torchrun's agent's)" : "", source);
}

Environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  };
}

RankInfo rank_info_from_environment(const Environment& env) {
  RankInfo info;
  const bool torchrun = env("RANK").has_value() || env("WORLD_SIZE").has_value();
  const bool slurm = !torchrun && env("SLURM_PROCID").has_value() && env("SLURM_NTASKS").has_value();
  if (torchrun) {
    if (!env("RANK") || !env("WORLD_SIZE")) {
      throw UserError("RANK and WORLD_SIZE must be set together (torchrun sets both; so does packtrain launch)");
    }
    info.source = "torchrun variables";
    info.rank = integer(env, "RANK", 0);
    info.world_size = integer(env, "WORLD_SIZE", 1);
    info.local_rank = integer(env, "LOCAL_RANK", info.rank);
    info.local_world_size = integer(env, "LOCAL_WORLD_SIZE", info.world_size);
    info.agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";  // torch's own test of it
  } else if (slurm) {
    info.source = "Slurm variables";
    info.rank = integer(env, "SLURM_PROCID", 0);
    info.world_size = integer(env, "SLURM_NTASKS", 1);
    info.local_rank = integer(env, "SLURM_LOCALID", 0);
    info.local_world_size = integer(env, "SLURM_NTASKS_PER_NODE", integer(env, "SLURM_TASKS_PER_NODE", 1));
  } else {
    return info;
  }
  if (info.world_size < 1) throw UserError(fmt::format("world size must be >= 1, got {}", info.world_size));
  if (info.rank < 0 || info.rank >= info.world_size) {
    throw UserError(fmt::format("rank {} is outside [0, {}) (the world size)", info.rank, info.world_size));
  }
  if (info.local_world_size < 1 || info.local_rank < 0 || info.local_rank >= info.local_world_size) {
    throw UserError(
        fmt::format("local rank {} is outside [0, {}) (the local world size)", info.local_rank, info.local_world_size));
  }
  if (const auto addr = env("MASTER_ADDR")) {
    info.master_addr = *addr;
  } else if (info.world_size > 1) {
    throw UserError("MASTER_ADDR is not set: a run of " + std::to_string(info.world_size) +
                    " processes needs the address of rank 0's store (torchrun and packtrain launch set it; under "
                    "Slurm export it from the job script)");
  }
  info.master_port = integer(env, "MASTER_PORT", info.master_port);
  if (info.master_port < 1 || info.master_port > 65535) {
    throw UserError(fmt::format("MASTER_PORT={} is not a port (1-65535)", info.master_port));
  }
  return info;
}

std::chrono::milliseconds collective_timeout(const Environment& env) {
  const std::optional<std::string> value = env("PACKTRAIN_COLLECTIVE_TIMEOUT");
  if (!value) return std::chrono::seconds(60);
  double seconds = std::nan("");
  try {
    size_t used = 0;
    seconds = std::stod(*value, &used);
    if (used != value->size()) seconds = std::nan("");
  } catch (const std::exception&) {  // not a number, or out of double's range
  }
  if (!(seconds >= kMinTimeoutSeconds && seconds <= kMaxTimeoutSeconds)) {
    throw UserError(fmt::format("PACKTRAIN_COLLECTIVE_TIMEOUT='{}': must be seconds between {} and {}", *value,
                                kMinTimeoutSeconds, kMaxTimeoutSeconds));
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

}  // namespace packtrain::runtime::distributed
