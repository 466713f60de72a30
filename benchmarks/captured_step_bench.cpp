// PackedGraph / PackedGraphUnrolled: the packed step captured as a CUDA graph and
// replayed, with batches gathered on the device (runtime/EnsembleSteps over a
// SyntheticWorkload: 8 inputs, 1 output, `depth` hidden layers, ReLU, MSE, AdamW
// lr 1e-3, float32) — one replay per step, or one per U steps. Arguments: members,
// hidden, batch, depth. gflops: the step's GEMM FLOPs per second of device time.
//
// Timing: manual, from CUDA events around each iteration's replays (device time);
// host_us_per_step is the host time to issue them (no waiting). The memory-traffic
// bound of one step (bytes_per_step below; benchmarks/RESULTS.md has the
// arithmetic) at two bandwidths: bound_us_per_step at the theoretical peak (memory
// clock x bus width) and copy_bound_us_per_step at the bandwidth a device-to-device
// copy measures here; device_over_bound and device_over_copy_bound are the ratios.
// <kind>_nodes_per_step: the graph's nodes per step by kind (kernel, memset, ...).
#include "benchmarks/captured_step_bench.h"

#include "benchmarks/bench_workload.h"

#include "packtrain/graphs/captured_step.h"
#include "packtrain/profiling/step_timer.h"
#include "packtrain/runtime/measure/synthetic_workload.h"

#include <ATen/Context.h>
#include <benchmark/benchmark.h>
#include <c10/cuda/CUDACachingAllocator.h>
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

// Measured DRAM bandwidth in bytes/s: the best of a few device-to-device copies of
// 1 GiB (each byte read once and written once: 2 GiB of traffic per copy) —
// what streaming kernels can reach on this GPU, usually 85-95% of the peak. Once
// per process.
double copy_bandwidth(int device) {
  static double measured = -1;
  if (measured >= 0) return measured;
  measured = 0;
  const size_t bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&src, bytes) != cudaSuccess ||
      cudaMalloc(&dst, bytes) != cudaSuccess || cudaEventCreate(&start) != cudaSuccess ||
      cudaEventCreate(&stop) != cudaSuccess) {
    (void)cudaGetLastError();
  } else {
    float best_ms = 0;
    for (int i = 0; i < 6; ++i) {  // the first warms up
      cudaEventRecord(start);
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice);
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      if (i > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;
    }
    if (best_ms > 0) measured = 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3);
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (src != nullptr) cudaFree(src);
  if (dst != nullptr) cudaFree(dst);
  return measured;
}

// Bytes the caching allocator has handed out on the device now, and at most since
// the last reset.
int64_t allocated_bytes(int index, bool peak) {
  const c10::CachingDeviceAllocator::DeviceStats stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  return peak ? stats.allocated_bytes[0].peak : stats.allocated_bytes[0].current;
}

void run_captured(benchmark::State& state, c10::Device device, int64_t unroll) {
  const int64_t members = state.range(0), hidden = state.range(1), batch = state.range(2), depth = state.range(3);
  const int index = device.index() < 0 ? 0 : device.index();
  // Each run starts from an empty cache: the pools of the runs before (their graphs
  // destroyed) are returned to the driver, so a large shape's capture does not fail
  // in one repetition and succeed in the next (Google Benchmark aborts on that).
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);  // the allocator knows no device before
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::resetPeakStats(index);
  state.counters["allocated_mib_before"] = static_cast<double>(allocated_bytes(index, false)) / (1 << 20);
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
  state.counters["gflops"] =
      step_flops(hidden, depth, batch) * static_cast<double>(members) * steps / (device_us * 1e3);
  state.counters["device_us_per_step"] = device_us / steps;
  state.counters["graph_nodes_per_step"] = static_cast<double>(step.graph_nodes()) / static_cast<double>(unroll);
  for (const auto& [kind, n] : step.graph_nodes_by_kind()) {
    state.counters[kind + "_nodes_per_step"] = static_cast<double>(n) / static_cast<double>(unroll);
  }
  // The device memory the workload and its graphs hold (peak: during warm-up and
  // capture): an unrolled graph should need about one step's, not U steps'.
  state.counters["allocated_mib"] = static_cast<double>(allocated_bytes(index, false)) / (1 << 20);
  state.counters["peak_allocated_mib"] = static_cast<double>(allocated_bytes(index, true)) / (1 << 20);
  const double bytes = bytes_per_step(members, batch, 8, hidden, depth);
  const double peak = peak_bandwidth(index), copy = copy_bandwidth(index);
  const double step_us = device_us / steps;
  state.counters["bytes_per_step"] = bytes;
  if (peak > 0) {
    state.counters["peak_bandwidth_gb_s"] = peak * 1e-9;
    state.counters["bound_us_per_step"] = bytes / peak * 1e6;
    state.counters["device_over_bound"] = step_us / (bytes / peak * 1e6);
  }
  if (copy > 0) {
    state.counters["copy_bandwidth_gb_s"] = copy * 1e-9;
    state.counters["copy_bound_us_per_step"] = bytes / copy * 1e6;
    state.counters["device_over_copy_bound"] = step_us / (bytes / copy * 1e6);
  }
  state.SetLabel(device.str() + " unroll " + std::to_string(unroll));
}

}  // namespace

void register_captured_step_benchmarks(c10::Device device, int64_t unroll,
                                       void (*apply_args)(benchmark::internal::Benchmark*)) {
  benchmark::RegisterBenchmark("PackedGraph", [=](benchmark::State& s) { run_captured(s, device, 1); })
      ->Apply(apply_args)
      ->UseManualTime();
  benchmark::RegisterBenchmark("PackedGraphUnrolled", [=](benchmark::State& s) { run_captured(s, device, unroll); })
      ->Apply(apply_args)
      ->UseManualTime();
}

}  // namespace packtrain::benchmarks
