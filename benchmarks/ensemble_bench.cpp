// packtrain_bench: member-steps per second of K small regressors trained
//   NaiveLoop    - K standalone LibTorch models, each with its own torch::optim::AdamW,
//                  one step each in a loop (what users write today);
//   PackedEager  - one PackedMLP of K members and one PackedAdam (AdamW), eager:
//                  ensemble::packed_train_step (on CPU its fused member-wise step);
//   PackedGraph, PackedGraphUnrolled - the packed step captured as a CUDA graph
//                  (benchmarks/captured_step_bench.cpp; CUDA only).
// Workload: I=8 inputs, 1 output, hidden layers of width `hidden` (one by default:
// the Deep Ensembles UCI regressor; PACKTRAIN_BENCH_DEPTH=2 for two), ReLU, MSE,
// AdamW lr 1e-3, float32, one fixed batch already on the device.
// items_per_second counts member-steps (one member doing one optimizer step).
// Device: CUDA when available (or PACKTRAIN_BENCH_DEVICE=cpu|cuda), else CPU.
// Members 1..4096 at hidden 64 and batch 128, plus a wider model (hidden 512);
// PACKTRAIN_BENCH_UNROLL sets U for PackedGraphUnrolled (default: the trainer's).
#include "benchmarks/bench_workload.h"
#include "benchmarks/captured_step_bench.h"
#include "benchmarks/data_parallel_bench.h"
#include "benchmarks/multitask_bench.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/pack.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_step.h"
#include "packtrain/runtime/profile/cpu_memory.h"
#include "packtrain/runtime/trainers/ensemble_steps.h"

#include <ATen/Context.h>
#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace {

using namespace packtrain::ensemble;

int64_t bench_depth() {
  const char* env = std::getenv("PACKTRAIN_BENCH_DEPTH");
  return env != nullptr ? std::stoll(env) : 1;
}

c10::Device bench_device() {
  const char* env = std::getenv("PACKTRAIN_BENCH_DEVICE");
  if (env != nullptr) return c10::Device(env);
  return at::hasCUDA() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
}

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

PackedMLPOptions workload(int64_t members, int64_t hidden, c10::Device device) {
  return packtrain::benchmarks::workload_options(members, hidden, bench_depth(), device);
}

// Host time to issue a step (before waiting for the device); a step of all K members.
struct HostClock {
  std::chrono::steady_clock::time_point t0;
  double total_us = 0;
  void start() { t0 = std::chrono::steady_clock::now(); }
  void stop() { total_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count(); }
};

void NaiveLoop(benchmark::State& state) {
  const int64_t members = state.range(0), hidden = state.range(1), batch = state.range(2);
  const c10::Device device = bench_device();
  const auto options = workload(members, hidden, device);
  std::vector<torch::nn::Sequential> models;
  std::vector<std::unique_ptr<torch::optim::AdamW>> optimizers;
  for (int64_t k = 0; k < members; ++k) {
    models.push_back(make_standalone_mlp(options, k));
    optimizers.push_back(std::make_unique<torch::optim::AdamW>(models.back()->parameters(),
                                                               torch::optim::AdamWOptions(packtrain::benchmarks::kWorkloadLr)));
  }
  const auto data = packtrain::benchmarks::fixed_batch(batch, device);
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
  const int64_t members = state.range(0), hidden = state.range(1), batch = state.range(2);
  const c10::Device device = bench_device();
  PackedMLP model(workload(members, hidden, device));
  PackedAdam optimizer(model.parameters(), adamw_options().lr(packtrain::benchmarks::kWorkloadLr));
  const auto data = packtrain::benchmarks::fixed_batch(batch, device);
  HostClock host;
  for (auto _ : state) {
    host.start();
    packed_train_step(model, optimizer, data.x, data.y, LossKind::kMSE);
    host.stop();
    synchronize(device);
  }
  state.SetItemsProcessed(state.iterations() * members);
  state.counters["host_us_per_step"] = host.total_us / static_cast<double>(state.iterations());
  state.SetLabel(device.str());
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"members", "hidden", "batch"});
  for (int64_t members : {1, 8, 64, 512, 4096}) b->Args({members, 64, 128});
  b->Args({64, 512, 128});  // the wider model
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

// The captured families add K = 2048, for the scaling target (K = 2048 step <= 2x
// the K = 1 step).
void CapturedArgs(benchmark::internal::Benchmark* b) {
  Args(b);
  b->Args({2048, 64, 128});
}

int64_t bench_unroll() {
  const char* env = std::getenv("PACKTRAIN_BENCH_UNROLL");
  return env != nullptr ? std::stoll(env) : packtrain::runtime::kDefaultUnroll;
}

BENCHMARK(NaiveLoop)->Apply(Args);
BENCHMARK(PackedEager)->Apply(Args);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // Both families run in this process with freed CPU memory retained, as the CLI
  // trains (runtime/cpu_memory.h).
  packtrain::runtime::retain_freed_cpu_memory();
  benchmark::AddCustomContext("device", bench_device().str());
  benchmark::AddCustomContext("depth", std::to_string(bench_depth()));
  benchmark::AddCustomContext("torch_threads", std::to_string(at::get_num_threads()));
  const c10::Device device = bench_device();
  if (device.is_cuda()) {
    packtrain::benchmarks::register_captured_step_benchmarks(device, bench_depth(), bench_unroll(), CapturedArgs);
    benchmark::AddCustomContext("unroll", std::to_string(bench_unroll()));
  } else {
    std::fprintf(stderr, "PackedGraph, PackedGraphUnrolled: not run (CUDA graphs need a CUDA device; this run is on %s)\n",
                 device.str().c_str());
  }
  packtrain::benchmarks::register_multitask_benchmarks(device);
  packtrain::benchmarks::register_data_parallel_benchmarks(device);
  if (!device.is_cuda()) {
    std::fprintf(stderr, "MultiTaskGraph, DecodeGraph: not run (CUDA graphs need a CUDA device)\n");
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
