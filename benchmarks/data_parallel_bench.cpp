// DataParallelStep/members:K/hidden:H/batch:B/group:G — the packed training step
// (benchmarks/bench_workload.h's workload) run through a CapturedStep, with (G=1)
// or without (G=0) the data-parallel gradient hook: one all-reduce (mean) of the
// flat gradient buffer between backward and the optimizer, over a process group of
// one — Gloo on CPU, NCCL on a GPU (recorded inside the step's CUDA graph). The
// difference between G=1 and G=0 at the same K is the per-step cost of the
// all-reduce call for gradient_bytes bytes, the fixed part (alpha) of the scaling
// model in benchmarks/RESULTS.md; link bandwidth needs several GPUs.
//
// Timing: device time per step (CUDA events on a GPU, the host clock on CPU).
#include "benchmarks/data_parallel_bench.h"

#include "benchmarks/bench_workload.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_step.h"
#include "packtrain/graphs/captured_step.h"
#include "packtrain/profiling/step_timer.h"
#include "packtrain/runtime/distributed/process_group.h"

#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <string>

namespace packtrain::benchmarks {

namespace {

constexpr int64_t kStepsPerIteration = 32;

void run_data_parallel_step(benchmark::State& state, c10::Device device) {
  const int64_t members = state.range(0), hidden = state.range(1), batch = state.range(2);
  const bool grouped = state.range(3) != 0;
  using runtime::distributed::ProcessGroup;
  if (grouped && (!ProcessGroup::gloo_available() || (device.is_cuda() && !ProcessGroup::nccl_available()))) {
    state.SkipWithError("this build has no Gloo or no NCCL");
    return;
  }
  // The group before the step: the step's graph (holding NCCL kernels) goes first.
  const std::unique_ptr<ProcessGroup> group =
      grouped ? ProcessGroup::join(runtime::distributed::RankInfo{}, std::chrono::seconds(60), device) : nullptr;
  ensemble::PackedMLP model(workload_options(members, hidden, 1, device));
  ensemble::PackedAdam optimizer(model.parameters(), ensemble::adamw_options().lr(kWorkloadLr));
  const FixedBatch data = fixed_batch(batch, device);
  const ensemble::GradientHook hook = grouped ? ensemble::GradientHook([&] {
    at::Tensor gradients = model.parameters().flat_grad();
    group->all_reduce_mean_(gradients, "gradient all-reduce");
  })
                                              : ensemble::GradientHook();
  graphs::CapturedStep step(
      "data-parallel step", device, {},
      [&](const std::vector<at::Tensor>&) {
        ensemble::packed_train_step(model, optimizer, data.x, data.y, ensemble::LossKind::kMSE, 1e-6, hook);
      },
      graphs::CaptureOptions().log([](const std::string&) {}));
  for (int i = 0; i < 5; ++i) step.run();  // warm-up and capture
  if (device.is_cuda() && step.mode() != graphs::StepMode::kGraph) {
    state.SkipWithError(("not captured: " + step.eager_reason()).c_str());
    return;
  }
  profiling::StepTimer timer(device);
  double device_us = 0;
  for (auto _ : state) {
    timer.begin();
    for (int64_t i = 0; i < kStepsPerIteration; ++i) step.run();
    timer.end(kStepsPerIteration);
    if (group != nullptr) group->wait_device("gradient all-reduce");
    const double us = timer.read().device_us;
    device_us += us;
    state.SetIterationTime(us * 1e-6);
  }
  const double steps = static_cast<double>(state.iterations() * kStepsPerIteration);
  state.SetItemsProcessed(static_cast<int64_t>(steps) * members);
  state.counters["us_per_step"] = device_us / steps;
  state.counters["gradient_bytes"] = static_cast<double>(model.parameters().flat_grad().nbytes());
  state.SetLabel(device.str() +
                 (grouped ? (device.is_cuda() ? " NCCL world 1, in the graph" : " Gloo world 1") : " no all-reduce"));
}

}  // namespace

void register_data_parallel_benchmarks(c10::Device device) {
  benchmark::RegisterBenchmark("DataParallelStep", [=](benchmark::State& s) { run_data_parallel_step(s, device); })
      ->ArgNames({"members", "hidden", "batch", "group"})
      ->ArgsProduct({{64, 512, 4096}, {64}, {128}, {0, 1}})
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace packtrain::benchmarks
