#include "packtrain/runtime/measure/launch_profile.h"

#include "packtrain/profiling/nvtx.h"
#include "packtrain/profiling/trace.h"
#include "packtrain/runtime/io/checkpoint_file.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/util/Exception.h>

namespace packtrain::runtime {

namespace {

std::string device_text(c10::Device device) {
  if (device.is_cpu()) return "cpu";
  const int index = device.index() < 0 ? at::cuda::current_device() : device.index();
  return "cuda:" + std::to_string(index) + " (" + at::cuda::getDeviceProperties(index)->name + ")";
}

profiling::StepCost measure_eager(const ProfileRequest& request) {
  SyntheticWorkload w(WorkloadOptions(request.workload).capture(false).unroll(1).log([](const std::string&) {}));
  EnsembleSteps& steps = w.steps();
  profiling::StepCost cost =
      profiling::measure_step_cost([&] { steps.run_steps(1); }, w.options().device(), request.steps);
  if (w.options().device().is_cpu()) {
    cost.kernels_per_step = static_cast<double>(profiling::count_aten_ops([&] { steps.run_steps(1); }));
  }
  return cost;
}

profiling::StepCost measure_graph(const ProfileRequest& request, int64_t* nodes_single_step) {
  SyntheticWorkload w(WorkloadOptions(request.workload).capture(true).unroll(request.unroll));
  EnsembleSteps& steps = w.steps();
  graphs::CapturedStep& step = steps.unrolled_step();
  TORCH_CHECK(step.mode() != graphs::StepMode::kEager, "profile: the step runs eagerly: ", step.eager_reason());
  while (step.mode() != graphs::StepMode::kGraph) step.run();
  const int64_t U = request.unroll;
  profiling::StepCost cost =
      profiling::measure_step_cost([&] { step.run(); }, w.options().device(), request.steps, 1, U);
  cost.kernels_per_step = static_cast<double>(step.graph_nodes()) / static_cast<double>(U);
  for (const auto& [kind, n] : step.graph_nodes_by_kind()) {
    cost.nodes_by_kind.emplace_back(kind, static_cast<double>(n) / static_cast<double>(U));
  }
  if (nodes_single_step != nullptr) {
    // Kernels of one eager step: the nodes of a one-step graph of the same workload.
    if (U == 1) {
      *nodes_single_step = step.graph_nodes();
    } else {
      SyntheticWorkload one(WorkloadOptions(request.workload).capture(true).unroll(1));
      graphs::CapturedStep& s = one.steps().unrolled_step();
      while (s.mode() == graphs::StepMode::kWarmingUp) s.run();
      *nodes_single_step = s.graph_nodes();
    }
  }
  return cost;
}

}  // namespace

profiling::LaunchReport profile_launches(const ProfileRequest& request) {
  TORCH_CHECK(request.steps > 0, "profile: steps must be positive, got ", request.steps);
  TORCH_CHECK(request.unroll > 0, "profile: unroll must be positive, got ", request.unroll);
  const c10::Device device = request.workload.device();
  profiling::LaunchReport report;
  report.device = device_text(device);
  report.workload = request.workload.describe();
  report.unroll = request.unroll;
  const bool can_capture = device.is_cuda();
  report.profiled = request.graph && can_capture ? "graph" : "eager";
  if (!can_capture) {
    report.note = request.graph ? "graph path requested, but CUDA graphs need a CUDA device: profiled eagerly"
                                : "CUDA graphs need a CUDA device: no graph path on the CPU";
  }
  const bool trace = !request.trace_path.empty();
  // The path not asked about is measured first, so the trace holds only the profiled one.
  int64_t nodes_single = 0;
  if (can_capture && !request.graph) report.graph = measure_graph(request, &nodes_single);
  profiling::StepCost profiled;
  if (report.profiled == "eager") {
    if (trace) profiling::trace_start();
    profiled = *(report.eager = measure_eager(request));
  } else {
    report.eager = measure_eager(request);
    if (trace) profiling::trace_start();
    profiled = *(report.graph = measure_graph(request, &nodes_single));
  }
  if (trace) {
    profiling::trace_counter("host us per step", profiled.host_us_per_step);
    profiling::trace_counter("device us per step", profiled.device_us_per_step);
    profiling::trace_stop();
    write_file_atomically(request.trace_path, profiling::chrome_trace_json());
  }
  if (can_capture) report.eager->kernels_per_step = static_cast<double>(nodes_single);
  return report;
}

}  // namespace packtrain::runtime
