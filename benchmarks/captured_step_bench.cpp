// PackedGraph / PackedGraphUnrolled: the packed step captured as a CUDA graph and
// replayed, with batches gathered on the device (runtime/EnsembleSteps over a
// SyntheticWorkload: 8 inputs, 1 output, ReLU, MSE, AdamW lr 1e-3, float32) —
// one replay per step, or one per U steps.
//
// Timing: manual, from CUDA events around each iteration's replays (device time);
// host_us_per_step is the host time to issue them (no waiting). bound_us_per_step
// is the memory-traffic bound of one step on this GPU (see bytes_per_step below and
// benchmarks/RESULTS.md for the arithmetic); device_over_bound is the ratio.
#include "benchmarks/captured_step_bench.h"

#include "packtrain/graphs/captured_step.h"
#include "packtrain/profiling/step_timer.h"
#include "packtrain/runtime/profile/synthetic_workload.h"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <string>

namespace packtrain::benchmarks {

namespace {

constexpr int64_t kStepsPerIteration = 64;

// The least memory traffic of one training step, float32, in bytes: what must be
// read or written at least once if every kernel streamed its operands exactly
// once. Per hidden layer (K*B*H activations): forward GEMM writes h, ReLU reads and
// writes it; backward writes the output gradient, ReLU-backward reads it and h and
// writes it, the weight-gradient GEMM reads it, the input-gradient GEMM writes one
// (9 passes). Optimizer: AdamW reads p, g, m, v and writes p, m, v (7 passes over
// K*P), gradients are zeroed and written once more (2 passes).
double bytes_per_step(int64_t K, int64_t B, int64_t I, int64_t H, int64_t depth) {
  const double P = static_cast<double>(I * H + H + (depth - 1) * (H * H + H) + H + 1);
  const double activations = static_cast<double>(K * B * H) * static_cast<double>(depth);
  const double inputs = static_cast<double>(B * I);
  return 4.0 * (9.0 * activations + 9.0 * static_cast<double>(K) * P + inputs);
}

// Peak DRAM bandwidth in bytes/s from the device's memory clock and bus width.
double peak_bandwidth(int device) {
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    return 0;
  }
  return 2.0 * clock_khz * 1e3 * (bus_bits / 8.0);  // double data rate
}

void run_captured(benchmark::State& state, c10::Device device, int64_t depth, int64_t unroll) {
  const int64_t members = state.range(0), hidden = state.range(1), batch = state.range(2);
  runtime::SyntheticWorkload w(runtime::WorkloadOptions()
                                   .members(members)
                                   .hidden(hidden)
                                   .depth(depth)
                                   .batch(batch)
                                   .rows(64 * batch)
                                   .device(device)
                                   .unroll(unroll)
                                   .seed(1));
  graphs::CapturedStep& step = w.steps().unrolled_step();
  while (step.mode() == graphs::StepMode::kWarmingUp) step.run();
  if (step.mode() != graphs::StepMode::kGraph) {
    state.SkipWithError(("not captured: " + step.eager_reason()).c_str());
    return;
  }
  profiling::StepTimer timer(device);
  double host_us = 0, device_us = 0;
  const int64_t replays = kStepsPerIteration / unroll;
  for (auto _ : state) {
    timer.begin();
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < replays; ++i) step.run();
    host_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    timer.end(replays * unroll);
    const double us = timer.read().device_us;
    device_us += us;
    state.SetIterationTime(us * 1e-6);
  }
  const double steps = static_cast<double>(state.iterations() * replays * unroll);
  state.SetItemsProcessed(static_cast<int64_t>(steps) * members);
  state.counters["host_us_per_step"] = host_us / steps;
  state.counters["device_us_per_step"] = device_us / steps;
  state.counters["graph_nodes_per_step"] = static_cast<double>(step.graph_nodes()) / static_cast<double>(unroll);
  const double bytes = bytes_per_step(members, batch, 8, hidden, depth);
  const double bandwidth = peak_bandwidth(device.index() < 0 ? 0 : device.index());
  state.counters["bytes_per_step"] = bytes;
  if (bandwidth > 0) state.counters["bound_us_per_step"] = bytes / bandwidth * 1e6;
  state.SetLabel(device.str() + " unroll " + std::to_string(unroll));
}

}  // namespace

void register_captured_step_benchmarks(c10::Device device, int64_t depth, int64_t unroll,
                                       void (*apply_args)(benchmark::internal::Benchmark*)) {
  benchmark::RegisterBenchmark("PackedGraph", [=](benchmark::State& s) { run_captured(s, device, depth, 1); })
      ->Apply(apply_args)
      ->UseManualTime();
  benchmark::RegisterBenchmark("PackedGraphUnrolled",
                               [=](benchmark::State& s) { run_captured(s, device, depth, unroll); })
      ->Apply(apply_args)
      ->UseManualTime();
}

}  // namespace packtrain::benchmarks
