// The default CPU threads of a process (runtime/distributed/cpu_share.h).
#include "packtrain/runtime/distributed/cpu_share.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace packtrain::runtime::distributed {

namespace {

// /proc/loadavg's "runnable/total": the kernel's count of runnable threads now,
// this process's own included; -1 when it cannot be read.
int64_t runnable_now() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen, running;
  if (!(in >> one >> five >> fifteen >> running)) return -1;
  try {
    return std::stoll(running.substr(0, running.find('/')));
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

CpuLoad read_cpu_load() {
  CpuLoad load;
  cpu_set_t set;
  CPU_ZERO(&set);
  load.usable_cpus = ::sched_getaffinity(0, sizeof(set), &set) == 0
                         ? std::max(1, CPU_COUNT(&set))
                         : std::max<int64_t>(1, std::thread::hardware_concurrency());
  // The least of a few samples 2 ms apart: work that keeps running is counted,
  // a process that only flickers through is not.
  int64_t least = -1;
  for (int i = 0; i < 5; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const int64_t now = runnable_now();
    if (now >= 0) least = least < 0 ? now : std::min(least, now);
  }
  load.others_running = std::max<int64_t>(0, least - 1);  // not this process's own thread
  return load;
}

int64_t default_cpu_threads(const CpuLoad& load, const RankInfo& rank, int64_t most) {
  const int64_t ranks = std::max<int64_t>(1, rank.local_world_size);
  const int64_t others = std::max<int64_t>(0, load.others_running - (ranks - 1));
  const int64_t share = (load.usable_cpus - others) / ranks;
  return std::clamp<int64_t>(share, 1, std::max<int64_t>(1, most));
}

}  // namespace packtrain::runtime::distributed
