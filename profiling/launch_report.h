// The launch-overhead report: how much of a training step is kernel launches.
// It puts the eager step (one launch per kernel) beside the captured step (one
// graph launch) and says in plain words which bound the step is under and what a
// graph saves, from measurements only.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace packtrain::profiling {

struct StepCost {
  double host_us_per_step = 0;    // host time to issue one step, without waiting for it
  double device_us_per_step = 0;  // device time per step in a steady loop (CUDA events; CPU: host clock)
  double kernels_per_step = 0;    // CUDA: graph nodes (kernels, memsets, copies); CPU: ATen ops dispatched
  // CUDA graphs: the nodes per step by kind ("kernel", "memset", "memcpy", ...), in
  // that order; empty for an eager step.
  std::vector<std::pair<std::string, double>> nodes_by_kind;
};

// Calls `step` `warmup` times, then `steps` times between a host clock and a
// StepTimer, and waits once at the end. `step` must leave the device busy with one
// step's work (eager) or one replay (graph); `steps_per_call` > 1 for unrolled graphs.
StepCost measure_step_cost(const std::function<void()>& step, c10::Device device, int64_t steps, int64_t warmup = 3,
                           int64_t steps_per_call = 1);

// ATen operators (every dispatch level) that one call of `step` runs on this thread.
int64_t count_aten_ops(const std::function<void()>& step);

struct LaunchReport {
  std::string device;    // e.g. "cuda:0 (NVIDIA H200)" or "cpu"
  std::string workload;  // e.g. "members 64, hidden 64, depth 1, batch 128"
  std::string profiled;  // "graph" or "eager": the path the user asked about
  int64_t unroll = 1;    // steps per graph replay
  std::optional<StepCost> eager;
  std::optional<StepCost> graph;
  std::string note;  // why a path is missing (e.g. "CUDA graphs need a CUDA device")

  // "launch-bound: ..." / "compute-bound: ..." / the CPU statement.
  std::string verdict() const;
  std::string text() const;
  std::string json() const;
};

}  // namespace packtrain::profiling
