// packtrain_bench: member-steps per second of K small regressors trained
//   NaiveLoop    - K standalone LibTorch models, each with its own torch::optim::AdamW,
//                  one step each in a loop (what users write today);
//   PackedEager  - one PackedMLP of K members and one PackedAdam (AdamW), eager:
//                  ensemble::packed_train_step (on CPU its fused member-wise step);
//   PackedGraph, PackedGraphUnrolled - the packed step captured as a CUDA graph
//                  (benchmarks/captured_step_bench.cpp; CUDA only).
// Workload: I=8 inputs, 1 output, `depth` hidden layers of width `hidden`, ReLU,
// MSE, AdamW lr 1e-3, float32, one fixed batch already on the device.
// Arguments members/hidden/batch/depth over the grid of bench_workload.h: depth 1-3,
// hidden 32-512, members 1-4096, batch 128, less the packs whose weights, gradients
// and AdamW moments exceed 1 GiB (named in the JSON context, "skipped_over_1gib");
// NaiveLoop only up to K = 64 (a loop of K models: larger K only takes longer);
// the captured families add K = 2048 at hidden 64.
// items_per_second counts member-steps (one member doing one optimizer step); the
// packed families' gflops counter is the step's GEMM FLOPs per second
// (bench_workload.h's step_flops), to set against CpuGemmRate (cpu_step_bench.cpp).
// Device: CUDA when available (or PACKTRAIN_BENCH_DEVICE=cpu|cuda), else CPU.
// PACKTRAIN_BENCH_DEPTH=D registers only depth D (one of the grid's, or any other);
// PACKTRAIN_BENCH_UNROLL sets U for PackedGraphUnrolled
// (default: the trainer's).
#include "benchmarks/bench_workload.h"
#include "benchmarks/captured_step_bench.h"
#include "benchmarks/data_parallel_bench.h"
#include "benchmarks/multitask_bench.h"
#include "benchmarks/pipeline_bench.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/pack.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_step.h"
#include "packtrain/runtime/measure/cpu_memory.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_steps.h"

#include <ATen/Context.h>
#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace packtrain::ensemble;

// The depths registered: the grid's, or only PACKTRAIN_BENCH_DEPTH's.
std::vector<int64_t> bench_depths() {
  const char* env = std::getenv("PACKTRAIN_BENCH_DEPTH");
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long long depth = std::strtoll(env, &end, 10);
    if (*end != '\0' || depth < 0) {
      throw std::invalid_argument(std::string("PACKTRAIN_BENCH_DEPTH=") + env +
                                  ": expected a number of hidden layers (0 or more), or unset for the grid's 1, 2, 3");
    }
    return {depth};
  }
  return {std::begin(packtrain::benchmarks::kGridDepths), std::end(packtrain::benchmarks::kGridDepths)};
}

c10::Device bench_device() {
  const char* env = std::getenv("PACKTRAIN_BENCH_DEVICE");
  if (env != nullptr) return c10::Device(env);
  return at::hasCUDA() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
}

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// The benchmark's arguments: members, hidden, batch, depth.
struct Shape {
  int64_t members, hidden, batch, depth;
  explicit Shape(const benchmark::State& state)
      : members(state.range(0)), hidden(state.range(1)), batch(state.range(2)), depth(state.range(3)) {}
  PackedMLPOptions options(c10::Device device) const {
    return packtrain::benchmarks::workload_options(members, hidden, depth, device);
  }
};

// The step's GEMM FLOPs per second over the run (a rate counter: Google Benchmark
// divides by the run's time, real time here).
benchmark::Counter gflops(const benchmark::State& state, const Shape& s) {
  const double flops = packtrain::benchmarks::step_flops(s.hidden, s.depth, s.batch) * static_cast<double>(s.members);
  return benchmark::Counter(flops / 1e9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// Host time to issue a step (before waiting for the device); a step of all K members.
struct HostClock {
  std::chrono::steady_clock::time_point t0;
  double total_us = 0;
  void start() { t0 = std::chrono::steady_clock::now(); }
  void stop() { total_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count(); }
};

void NaiveLoop(benchmark::State& state) {
  const Shape shape(state);
  const int64_t members = shape.members;
  const c10::Device device = bench_device();
  const auto options = shape.options(device);
  std::vector<torch::nn::Sequential> models;
  std::vector<std::unique_ptr<torch::optim::AdamW>> optimizers;
  for (int64_t k = 0; k < members; ++k) {
    models.push_back(make_standalone_mlp(options, k));
    optimizers.push_back(std::make_unique<torch::optim::AdamW>(
        models.back()->parameters(), torch::optim::AdamWOptions(packtrain::benchmarks::kWorkloadLr)));
  }
  const auto data = packtrain::benchmarks::fixed_batch(shape.batch, device);
  HostClock host;
  for (auto _ : state) {
    host.start();
    for (int64_t k = 0; k < members; ++k) {
      optimizers[k]->zero_grad();
      torch::mse_loss(models[k]->forward(data.x), data.y).backward();
      optimizers[k]->step();
    }
    host.stop();
    synchronize(device);
  }
  state.SetItemsProcessed(state.iterations() * members);
  state.counters["host_us_per_step"] = host.total_us / static_cast<double>(state.iterations());
  state.SetLabel(device.str());
}

void PackedEager(benchmark::State& state) {
  const Shape shape(state);
  const c10::Device device = bench_device();
  PackedMLP model(shape.options(device));
  PackedAdam optimizer(model.parameters(), adamw_options().lr(packtrain::benchmarks::kWorkloadLr));
  const auto data = packtrain::benchmarks::fixed_batch(shape.batch, device);
  HostClock host;
  for (auto _ : state) {
    host.start();
    packed_train_step(model, optimizer, data.x, data.y, LossKind::kMSE);
    host.stop();
    synchronize(device);
  }
  state.SetItemsProcessed(state.iterations() * shape.members);
  state.counters["host_us_per_step"] = host.total_us / static_cast<double>(state.iterations());
  state.counters["gflops"] = gflops(state, shape);
  state.SetLabel(device.str());
}

// The grid's shapes with at most `max_members` members, within the state limit.
// The grid's shapes and unit only: the families add their own timing (real time for
// the host-timed ones, manual time for the captured ones; Google Benchmark refuses both).
void Grid(benchmark::internal::Benchmark* b, int64_t max_members) {
  namespace pb = packtrain::benchmarks;
  b->ArgNames({"members", "hidden", "batch", "depth"});
  for (int64_t depth : bench_depths()) {
    for (int64_t hidden : pb::kGridHiddens) {
      for (int64_t members : pb::kGridMembers) {
        if (members <= max_members && pb::within_state_limit(members, hidden, depth)) {
          b->Args({members, hidden, pb::kGridBatch, depth});
        }
      }
    }
  }
  b->Unit(benchmark::kMillisecond);
}

// The registered depths' shapes over the state limit, "members:4096/hidden:256/batch:128/depth:2"
// each (the JSON context's "skipped_over_1gib").
std::string skipped_shapes() {
  namespace pb = packtrain::benchmarks;
  std::string out;
  for (int64_t depth : bench_depths()) {
    for (int64_t hidden : pb::kGridHiddens) {
      for (int64_t members : pb::kGridMembers) {
        if (pb::within_state_limit(members, hidden, depth)) continue;
        if (!out.empty()) out += ',';
        out.append("members:").append(std::to_string(members)).append("/hidden:").append(std::to_string(hidden));
        out.append("/batch:").append(std::to_string(pb::kGridBatch)).append("/depth:").append(std::to_string(depth));
      }
    }
  }
  return out;
}

void PackedArgs(benchmark::internal::Benchmark* b) {
  Grid(b, 4096);
  b->UseRealTime();
}
void LoopArgs(benchmark::internal::Benchmark* b) {
  Grid(b, 64);
  b->UseRealTime();
}

// The captured families add K = 2048 at hidden 64, for the scaling target (K = 2048
// step <= 2x the K = 1 step).
void CapturedArgs(benchmark::internal::Benchmark* b) {
  Grid(b, 4096);
  for (int64_t depth : bench_depths()) b->Args({2048, 64, packtrain::benchmarks::kGridBatch, depth});
}

int64_t bench_unroll() {
  const char* env = std::getenv("PACKTRAIN_BENCH_UNROLL");
  return env != nullptr ? std::stoll(env) : packtrain::runtime::kDefaultUnroll;
}

BENCHMARK(NaiveLoop)->Apply(LoopArgs);
BENCHMARK(PackedEager)->Apply(PackedArgs);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // Both families run in this process with freed CPU memory retained, as the CLI
  // trains (runtime/measure/cpu_memory.h).
  packtrain::runtime::retain_freed_cpu_memory();
  benchmark::AddCustomContext("device", bench_device().str());
  std::string depths;
  for (int64_t depth : bench_depths()) depths.append(depths.empty() ? "" : ",").append(std::to_string(depth));
  benchmark::AddCustomContext("depths", depths);
  benchmark::AddCustomContext("skipped_over_1gib", skipped_shapes());
  benchmark::AddCustomContext("torch_threads", std::to_string(at::get_num_threads()));
  const c10::Device device = bench_device();
  if (device.is_cuda()) {
    packtrain::benchmarks::register_captured_step_benchmarks(device, bench_unroll(), CapturedArgs);
    benchmark::AddCustomContext("unroll", std::to_string(bench_unroll()));
  } else {
    std::fprintf(stderr,
                 "PackedGraph, PackedGraphUnrolled: not run (CUDA graphs need a CUDA device; this run is on %s)\n",
                 device.str().c_str());
  }
  packtrain::benchmarks::register_multitask_benchmarks(device);
  packtrain::benchmarks::register_data_parallel_benchmarks(device);
  packtrain::benchmarks::register_pipeline_benchmarks();
  if (!device.is_cuda()) {
    std::fprintf(stderr, "MultiTaskGraph, DecodeGraph: not run (CUDA graphs need a CUDA device)\n");
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
