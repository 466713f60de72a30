// packtrain_bench: how to pack convolutional members (ensemble/packed_cnn.h), on the
// CPU, float32, forward + backward of the whole member network (two conv blocks of
// 32 and 64 channels, kernel 3, a 64-wide head), B = 64 rows per member:
//   ConvPackGrouped     - PackedCNN's forward: every convolution one grouped
//                         convolution over the K members' channels (a shared batch's
//                         first one ungrouped, to K*Cout channels).
//   ConvPackMemberLoop  - the same network member by member: K standalone members
//                         (torch::nn Conv2d/Conv1d, MaxPool, Linear; each its own
//                         weights), so K separate at::conv2d / conv1d calls per layer.
// Args: shape 0 = optical digits (1, 8, 8), 1 = MNIST-1D (1, 40); members K;
// shared 1 = one batch (B, I) for all members, 0 = per-member batches (K, B, I).
// items_per_second: member-rows (K * B) per second.
#include "packtrain/ensemble/packed_cnn.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

namespace {

using namespace packtrain::ensemble;

constexpr int64_t kRows = 64;

PackedCNNOptions bench_options(int64_t shape, int64_t members) {
  return PackedCNNOptions(shape == 0 ? std::vector<int64_t>{1, 8, 8} : std::vector<int64_t>{1, 40}, 10)
      .members(members)
      .channels({32, 64})
      .kernel_size(3)
      .hidden(64)
      .depth(1)
      .seed(1);
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

template <bool kGrouped>
void ConvPack(benchmark::State& state) {
  const int64_t shape = state.range(0), members = state.range(1);
  const bool shared = state.range(2) != 0;
  PackedCNN pack(bench_options(shape, members));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t I = pack.options().in_features();
  const at::Tensor x = shared ? at::randn({kRows, I}, gen) : at::randn({members, kRows, I}, gen);
  const MemberLoop loop(pack);
  const auto step = [&] {
    if (kGrouped)
      pack.parameters().zero_grad();
    else
      loop.zero_grad();
    const at::Tensor out = kGrouped ? pack.forward(x) : loop.forward(x);
    torch::autograd::backward({out.square().mean()});
  };
  // Both forms compute the same function (checked once, outside the timing).
  if (!at::allclose(pack.forward(x), loop.forward(x), 1e-4, 1e-5)) {
    state.SkipWithError("the grouped and member-loop forwards differ");
    return;
  }
  step();  // warm up
  for (auto _ : state) step();
  state.SetItemsProcessed(state.iterations() * members * kRows);
  state.SetLabel(std::string(shape == 0 ? "digits 1x8x8" : "mnist1d 1x40") + (shared ? " shared" : " per-member"));
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "members", "shared"});
  for (int64_t shape : {0, 1}) {
    for (int64_t members : {8, 64}) {
      for (int64_t shared : {0, 1}) b->Args({shape, members, shared});
    }
  }
}

void ConvPackGrouped(benchmark::State& state) { ConvPack<true>(state); }
void ConvPackMemberLoop(benchmark::State& state) { ConvPack<false>(state); }

BENCHMARK(ConvPackGrouped)->Apply(Shapes)->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(ConvPackMemberLoop)->Apply(Shapes)->Unit(benchmark::kMillisecond)->MinTime(0.5);

}  // namespace
