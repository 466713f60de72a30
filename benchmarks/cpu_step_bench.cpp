// packtrain_bench: the CPU training step against the machine's compute limit.
//   CpuGemmRate      - one large FP32 GEMM (2048^3) through LibTorch's BLAS on every
//                      thread: the machine's measured limit (counter gflops).
//   CpuTrainStep     - packed_train_step on CPU (the fused member-wise gradients and
//                      AdamW) for the shape grid of the peers table: depth 1-3, hidden
//                      32-512, K 1-4096, batch 128, 8 inputs, 1 output, MSE.
// Counters: gflops (the step's GEMM FLOPs per second: forward, weight and input
// gradients) and gemm_gflops (CpuGemmRate's measurement, made once in the same
// process): their ratio is how far the row is from the machine's limit.
#include "benchmarks/bench_workload.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_step.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <chrono>

namespace {

using namespace packtrain::ensemble;

double measure_gemm_rate() {
  const int64_t n = 2048;
  const at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
  at::Tensor c = at::empty({n, n});
  at::mm_out(c, a, b);  // warm up
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double seconds = 0;
  while (seconds < 1.0 || reps < 3) {
    at::mm_out(c, a, b);
    ++reps;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return 2.0 * n * n * n * reps / seconds / 1e9;
}

double gemm_rate() {
  static const double rate = measure_gemm_rate();
  return rate;
}

void CpuGemmRate(benchmark::State& state) {
  const int64_t n = 2048;
  const at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
  at::Tensor c = at::empty({n, n});
  for (auto _ : state) at::mm_out(c, a, b);
  state.counters["gflops"] =
      benchmark::Counter(2.0 * n * n * n / 1e9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["threads"] = at::get_num_threads();
}

void CpuTrainStep(benchmark::State& state) {
  const int64_t depth = state.range(0), hidden = state.range(1), members = state.range(2),
                batch = packtrain::benchmarks::kGridBatch;
  const c10::Device cpu(c10::kCPU);
  PackedMLP model(packtrain::benchmarks::workload_options(members, hidden, depth, cpu));
  PackedAdam optimizer(model.parameters(), adamw_options().lr(packtrain::benchmarks::kWorkloadLr));
  const auto data = packtrain::benchmarks::fixed_batch(batch, cpu);
  const double limit = gemm_rate();
  for (auto _ : state) packed_train_step(model, optimizer, data.x, data.y, LossKind::kMSE);
  const double flops = packtrain::benchmarks::step_flops(hidden, depth, batch) * static_cast<double>(members);
  state.SetItemsProcessed(state.iterations() * members);
  state.counters["gflops"] =
      benchmark::Counter(flops / 1e9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["gemm_gflops"] = limit;
  state.SetLabel("cpu");
}

// The grid of the peers table (bench_workload.h), less the packs over its state limit.
void Grid(benchmark::internal::Benchmark* b) {
  namespace w = packtrain::benchmarks;
  b->ArgNames({"depth", "hidden", "members"});
  for (int64_t depth : w::kGridDepths) {
    for (int64_t hidden : w::kGridHiddens) {
      for (int64_t members : w::kGridMembers) {
        if (w::within_state_limit(members, hidden, depth)) b->Args({depth, hidden, members});
      }
    }
  }
}

BENCHMARK(CpuGemmRate)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(CpuTrainStep)->Apply(Grid)->Unit(benchmark::kMicrosecond);

}  // namespace
