// How many CPU threads a process of a run uses when the user says nothing (no
// --threads, PACKTRAIN_THREADS or OMP_NUM_THREADS): the CPUs it may run on that
// nothing else is running on now, shared evenly among the ranks on this host. On a
// busy machine OpenMP's threads wait on each other behind the other work (a profile
// step beside a two-job compile: 555 us with 2 threads, 228 us with 1 —
// benchmarks/RESULTS.md, "Threads under load"); on an idle one every CPU is used.
#pragma once

#include "packtrain/runtime/distributed/rank_info.h"

#include <cstdint>
#include <functional>
#include <string>

namespace packtrain::runtime::distributed {

// What the choice is made from, read from the host (tests pass their own).
struct CpuLoad {
  int64_t usable_cpus = 1;     // the CPUs this process may run on (sched_getaffinity)
  int64_t others_running = 0;  // runnable threads of other work now, the least of a few samples
};
CpuLoad read_cpu_load();

// The CPUs free of other work, divided among the ranks on this host, from 1 to
// `most` (LibTorch's own default: an idle machine keeps it, so a run there computes
// exactly as before). The other ranks of this run, starting beside this one, are not
// other work: up to local_world_size - 1 runnable threads are taken for theirs.
int64_t default_cpu_threads(const CpuLoad& load, const RankInfo& rank, int64_t most);

}  // namespace packtrain::runtime::distributed
