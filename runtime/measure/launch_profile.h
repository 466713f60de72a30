// profile_launches: measures a SyntheticWorkload's step eagerly and captured and
// fills the launch-overhead report (profiling/launch_report.h) that
// `packtrain profile` prints.
#pragma once

#include "packtrain/profiling/launch_report.h"
#include "packtrain/runtime/measure/synthetic_workload.h"

#include <string>

namespace packtrain::runtime {

struct ProfileRequest {
  WorkloadOptions workload;  // capture and unroll are set per path
  bool graph = true;         // the path the user asked about (--graph / --eager)
  int64_t unroll = 1;        // steps per replay of the captured path
  int64_t steps = 200;       // timed steps per path
  std::string trace_path;    // when set, the profiled path's ranges as Chrome trace JSON
};

profiling::LaunchReport profile_launches(const ProfileRequest& request);

}  // namespace packtrain::runtime
