// packtrain_bench: the CPU training step against the machine's compute limit.
//   CpuGemmRate      - one large FP32 GEMM (2048^3) through LibTorch's BLAS on every
//                      thread: the machine's measured limit (counter gflops).
//   CpuTrainStep     - packed_train_step on CPU (the fused member-wise gradients and
//                      AdamW) for the shape grid of the peers table: depth 1-3, hidden
//                      32-512, K 1-4096, batch 128, 8 inputs, 1 output, MSE.
//   CpuBf16GemmRate  - the same GEMM in bfloat16 (float32 accumulation, oneDNN): the
//                      limit of a bf16-mixed step on this CPU.
//   CpuTrainStepPrecision - the compute-bound rows (depth 2-3, hidden 256-512, K 64
//                      and 512) in fp32 (precision 0), bf16-mixed as the trainer runs
//                      it (1: autograd under autocast where the CPU has bfloat16 matrix
//                      units, else the fused step) and bf16-mixed in the fused step's
//                      float32 GEMMs of rounded operands on any CPU (2).
// Counters: gflops (the step's GEMM FLOPs per second: forward, weight and input
// gradients) and gemm_gflops (CpuGemmRate's measurement, made once in the same
// process): their ratio is how far the row is from the machine's limit;
// bf16_gemm_gflops likewise for CpuBf16GemmRate's.
#include "benchmarks/bench_workload.h"
#include "packtrain/ensemble/cpu_fused_step.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_step.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <chrono>

namespace {

using namespace packtrain::ensemble;

double measure_gemm_rate(at::ScalarType dtype = at::kFloat) {
  const int64_t n = 2048;
  const at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  at::Tensor c = at::empty({n, n}, a.options());
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

double bf16_gemm_rate() {
  static const double rate = measure_gemm_rate(at::kBFloat16);
  return rate;
}

void time_gemm(benchmark::State& state, at::ScalarType dtype) {
  const int64_t n = 2048;
  const at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  at::Tensor c = at::empty({n, n}, a.options());
  for (auto _ : state) at::mm_out(c, a, b);
  state.counters["gflops"] =
      benchmark::Counter(2.0 * n * n * n / 1e9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["threads"] = at::get_num_threads();
}

void CpuGemmRate(benchmark::State& state) { time_gemm(state, at::kFloat); }
void CpuBf16GemmRate(benchmark::State& state) { time_gemm(state, at::kBFloat16); }

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

void CpuTrainStepPrecision(benchmark::State& state) {
  const int64_t depth = state.range(0), hidden = state.range(1), members = state.range(2), route = state.range(3),
                batch = packtrain::benchmarks::kGridBatch;
  const c10::Device cpu(c10::kCPU);
  PackedMLP model(packtrain::benchmarks::workload_options(members, hidden, depth, cpu));
  model.set_precision(route == 0 ? Precision::kFP32 : Precision::kBF16Mixed);
  PackedAdam optimizer(model.parameters(), adamw_options().lr(packtrain::benchmarks::kWorkloadLr));
  const auto data = packtrain::benchmarks::fixed_batch(batch, cpu);
  const double limit = gemm_rate(), bf16_limit = bf16_gemm_rate();
  for (auto _ : state) {
    if (route == 2) {
      cpu_fused_gradients(model, data.x, data.y, LossKind::kMSE, 0.0);
      optimizer.step();
    } else {
      packed_train_step(model, optimizer, data.x, data.y, LossKind::kMSE);
    }
  }
  const double flops = packtrain::benchmarks::step_flops(hidden, depth, batch) * static_cast<double>(members);
  state.SetItemsProcessed(state.iterations() * members);
  state.counters["gflops"] =
      benchmark::Counter(flops / 1e9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["gemm_gflops"] = limit;
  state.counters["bf16_gemm_gflops"] = bf16_limit;
  state.SetLabel(route == 0 ? "fp32" : route == 1 ? "bf16-mixed" : "bf16-mixed fused");
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

// The compute-bound rows of issue 40 (depth >= 2, hidden >= 256, K >= 64), each in
// the three precisions side by side.
void PrecisionRows(benchmark::internal::Benchmark* b) {
  namespace w = packtrain::benchmarks;
  b->ArgNames({"depth", "hidden", "members", "precision"});
  for (int64_t depth : {2, 3}) {
    for (int64_t hidden : {256, 512}) {
      for (int64_t members : {64, 512}) {
        if (!w::within_state_limit(members, hidden, depth)) continue;
        for (int64_t route : {0, 1, 2}) b->Args({depth, hidden, members, route});
      }
    }
  }
}

BENCHMARK(CpuGemmRate)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(CpuBf16GemmRate)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(CpuTrainStep)->Apply(Grid)->Unit(benchmark::kMicrosecond);
BENCHMARK(CpuTrainStepPrecision)->Apply(PrecisionRows)->Unit(benchmark::kMillisecond);

}  // namespace
