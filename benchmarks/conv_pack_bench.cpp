// packtrain_bench: how to pack convolutional members (ensemble/packed_cnn.h),
// float32, forward + backward of the whole member network (two conv blocks of 32 and
// 64 channels, kernel 3, a 64-wide head), B = 128 rows per member (the peers' batch):
//   ConvPackGrouped      - PackedCNN's forward: every convolution one grouped
//                          convolution over the K members' channels (a shared batch's
//                          first one ungrouped, to K*Cout channels).
//   ConvPackGroupedTuned - the same, cuDNN's algorithms chosen by timing them during
//                          the warm-up (cudnn benchmark mode; GPU only).
//   ConvPackMemberLoop   - the same network member by member: K standalone members
//                          (torch::nn Conv2d/Conv1d, MaxPool, Linear; each its own
//                          weights), so K separate at::conv2d / conv1d calls per layer.
// Two more forms computed the same numbers and were dropped (benchmarks/RESULTS.md,
// 2026-11-27): im2col (at::im2col) + one batched GEMM per layer, 2.2-2.5x slower than
// grouped on the CPU and 7-11x slower on an H100; and PackedCNN with each member's
// convolution on its own slice of member-major activations (K plain convolutions,
// ReLU and pooling batched), 1.2-1.5x slower than grouped on this CPU at 1 and 2 threads.
// Device: CUDA when available (or PACKTRAIN_BENCH_DEVICE=cpu|cuda), else CPU. On a
// GPU each form's step is captured once as a CUDA graph (graphs::CapturedStep) and
// replayed, as the trainer's is, so launches do not hide the kernels' cost.
// Args: shape 0 = optical digits (1, 8, 8), 1 = MNIST-1D (1, 40); members K (512 on a
// GPU only, and not for the member loop); shared 1 = one batch (B, I) for all
// members, 0 = per-member batches (K, B, I).
// items_per_second: member-rows (K * B) per second.
#include "packtrain/ensemble/packed_cnn.h"
#include "packtrain/graphs/captured_step.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <memory>

#include <string>
#include <vector>

namespace {

using namespace packtrain::ensemble;

constexpr int64_t kRows = 128;

c10::Device bench_device() {
  const char* env = std::getenv("PACKTRAIN_BENCH_DEVICE");
  if (env != nullptr) return c10::Device(env);
  return at::hasCUDA() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
}

PackedCNNOptions bench_options(int64_t shape, int64_t members) {
  return PackedCNNOptions(shape == 0 ? std::vector<int64_t>{1, 8, 8} : std::vector<int64_t>{1, 40}, 10)
      .members(members)
      .channels({32, 64})
      .kernel_size(3)
      .hidden(64)
      .depth(1)
      .seed(1)
      .device(bench_device());
}

// The member loop: K standalone members (pack.standalone_member: torch::nn Conv2d /
// Conv1d, MaxPool, Linear modules, each with its own parameters), run one by one.
struct MemberLoop {
  explicit MemberLoop(const PackedCNN& pack) {
    for (int64_t k = 0; k < pack.members(); ++k) members.push_back(pack.standalone_member(k));
  }
  at::Tensor forward(const at::Tensor& x) const {
    std::vector<at::Tensor> outputs;
    for (size_t k = 0; k < members.size(); ++k) {
      outputs.push_back(members[k].forward(x.dim() == 2 ? x : x[static_cast<int64_t>(k)]));
    }
    return at::stack(outputs);  // (K, B, O)
  }
  void zero_grad() const {
    for (const StandaloneMember& m : members) m.module->zero_grad();
  }
  std::vector<StandaloneMember> members;
};

enum class Form { kGrouped, kGroupedTuned, kMemberLoop };

template <Form kForm>
void ConvPack(benchmark::State& state) {
  const int64_t shape = state.range(0), members = state.range(1);
  const bool shared = state.range(2) != 0;
  const c10::Device device = bench_device();
  if (!device.is_cuda() && (members > 64 || kForm == Form::kGroupedTuned)) {
    state.SkipWithError("a GPU-only row (K = 512, or cuDNN's benchmark mode)");
    return;
  }
  if (kForm == Form::kMemberLoop && members > 64) {
    state.SkipWithError("512 standalone members: minutes to capture, and 6x slower than grouped at K = 64");
    return;
  }
  PackedCNN pack(bench_options(shape, members));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t I = pack.options().in_features();
  const at::Tensor x = (shared ? at::randn({kRows, I}, gen) : at::randn({members, kRows, I}, gen)).to(device);
  const MemberLoop loop(pack);
  const bool packed = kForm != Form::kMemberLoop;
  const auto step = [&](const at::Tensor& input) {
    if (packed)
      pack.parameters().zero_grad();
    else
      loop.zero_grad();
    const at::Tensor out = packed ? pack.forward(input) : loop.forward(input);
    torch::autograd::backward({out.square().mean()});
  };
  // Every form computes the same function (checked once, outside the timing).
  if (!at::allclose(pack.forward(x), loop.forward(x), 1e-4, 1e-5)) {
    state.SkipWithError("the packed and member-loop forwards differ");
    return;
  }
  at::Context& context = at::globalContext();
  const bool tuned_before = context.benchmarkCuDNN();
  if (kForm == Form::kGroupedTuned) context.setBenchmarkCuDNN(true);  // chosen while warming up
  packtrain::graphs::CapturedStep captured(
      "conv pack", device, {{"x", x.sizes().vec(), x.scalar_type()}},
      [&](const std::vector<at::Tensor>& in) { step(in[0]); },
      packtrain::graphs::CaptureOptions().log([](const std::string&) {}));
  captured.run({x});  // warm-up (and capture, on a GPU, after the warm-up calls)
  for (int i = 0; i < 4; ++i) captured.run();
  if (device.is_cuda()) torch::cuda::synchronize();
  for (auto _ : state) {
    captured.run();
    if (device.is_cuda()) torch::cuda::synchronize();
  }
  context.setBenchmarkCuDNN(tuned_before);
  state.SetItemsProcessed(state.iterations() * members * kRows);
  state.SetLabel(std::string(shape == 0 ? "digits 1x8x8" : "mnist1d 1x40") + (shared ? " shared" : " per-member") +
                 (device.is_cuda() ? " cuda graph" : " cpu"));
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "members", "shared"});
  for (int64_t shape : {0, 1}) {
    for (int64_t members : {8, 64, 512}) {
      for (int64_t shared : {0, 1}) b->Args({shape, members, shared});
    }
  }
}

void ConvPackGrouped(benchmark::State& state) { ConvPack<Form::kGrouped>(state); }
void ConvPackGroupedTuned(benchmark::State& state) { ConvPack<Form::kGroupedTuned>(state); }
void ConvPackMemberLoop(benchmark::State& state) { ConvPack<Form::kMemberLoop>(state); }

BENCHMARK(ConvPackGrouped)->Apply(Shapes)->Unit(benchmark::kMillisecond)->MinTime(0.5)->UseRealTime();
BENCHMARK(ConvPackGroupedTuned)->Apply(Shapes)->Unit(benchmark::kMillisecond)->MinTime(0.5)->UseRealTime();
BENCHMARK(ConvPackMemberLoop)->Apply(Shapes)->Unit(benchmark::kMillisecond)->MinTime(0.5)->UseRealTime();

}  // namespace
