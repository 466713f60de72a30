// The workload packtrain exists for: 10 ensembles of 5 small regressors (50 models),
// retrained from scratch for 100 epochs every active-learning round, on concrete.
//   ActiveLearning/Packed       - run_active_learning: all 50 members in one pack,
//                                 re-initialized in place each round (G=10, M=5, no baseline);
//   ActiveLearning/LoopPerModel - what users write today: 50 standalone
//                                 torch::nn::Sequential models, each with its own
//                                 torch::optim::AdamW, trained one after another on its
//                                 run's labelled rows in mini-batches of the same size,
//                                 then the same spread scoring and acquisition.
// Both take the same member-steps (checked; the run fails otherwise). Rounds: 3, or
// PACKTRAIN_BENCH_AL_ROUNDS. items_per_second counts member-epochs (one model
// training one epoch); seconds_per_round is wall time per round.
#include "packtrain/ensemble/pack.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/runtime/data/standardizer.h"
#include "packtrain/runtime/data/uci_dataset.h"
#include "packtrain/runtime/trainers/uncertainty/active_learning.h"

#include <ATen/Context.h>
#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace packtrain;

constexpr int64_t kRuns = 10, kMembers = 5, kEpochs = 100, kBatch = 32, kHidden = 64;
// 128 + 64 per round: epochs of 4, 6, 8 ... batches; three repetitions of the pair
// take under a minute on a 2-core CPU.
constexpr int64_t kInitial = 128, kAcquire = 64;
constexpr double kLr = 1e-3, kWeightDecay = 1e-4;

int64_t bench_rounds() {
  const char* env = std::getenv("PACKTRAIN_BENCH_AL_ROUNDS");
  return env != nullptr ? std::stoll(env) : 3;
}

c10::Device al_device() {
  const char* env = std::getenv("PACKTRAIN_BENCH_DEVICE");
  if (env != nullptr) return c10::Device(env);
  return at::hasCUDA() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
}

std::filesystem::path data_dir() {
  const char* env = std::getenv("PACKTRAIN_DATA_DIR");
  return std::filesystem::path(env != nullptr ? env : PACKTRAIN_SOURCE_DATA_DIR) / "concrete";
}

struct Workload {
  at::Tensor pool_x, pool_y, test_x, test_y;  // float64, CPU, original units
};

const Workload& workload() {
  static const Workload w = [] {
    const runtime::RegressionData d = runtime::load_uci(data_dir());
    const runtime::SplitIndices s = runtime::load_uci_split(data_dir(), 0, d.features.size(0));
    const at::Tensor train = at::tensor(s.train, at::kLong), test = at::tensor(s.test, at::kLong);
    return Workload{d.features.index_select(0, train), d.targets.index_select(0, train),
                    d.features.index_select(0, test), d.targets.index_select(0, test)};
  }();
  return w;
}

runtime::ActiveLearningOptions loop_options() {
  return runtime::ActiveLearningOptions()
      .initial(kInitial)
      .acquire(kAcquire)
      .rounds(bench_rounds())
      .ensembles(kRuns)
      .random_baseline(false);
}

// Member-steps of a run whose rounds trained on `labelled` rows each: an epoch
// drops the last partial batch, in the pack and in the loop alike.
int64_t member_steps(const std::vector<int64_t>& labelled) {
  int64_t steps = 0;
  for (const int64_t n : labelled) steps += n / kBatch * kEpochs * kRuns * kMembers;
  return steps;
}

void report(benchmark::State& state, double seconds, int64_t steps, const char* name) {
  const int64_t rounds = bench_rounds();
  const int64_t expected = member_steps([&] {
    std::vector<int64_t> n;
    for (int64_t r = 0; r < rounds; ++r) n.push_back(kInitial + r * kAcquire);
    return n;
  }());
  if (steps != expected) {
    state.SkipWithError(
        (std::string(name) + ": " + std::to_string(steps) + " member-steps, expected " + std::to_string(expected))
            .c_str());
    return;
  }
  state.SetItemsProcessed(state.iterations() * kRuns * kMembers * kEpochs * rounds);
  state.counters["seconds_per_round"] = seconds / static_cast<double>(state.iterations() * rounds);
  state.counters["member_steps"] = static_cast<double>(steps);
  state.SetLabel(al_device().str());
}

void Packed(benchmark::State& state) {
  const Workload& w = workload();
  runtime::EnsembleTrainerOptions options;
  options.members(kMembers)
      .hidden(kHidden)
      .depth(1)
      .head(runtime::Head::kMean)
      .lr(kLr)
      .weight_decay(kWeightDecay)
      .epochs(kEpochs)
      .batch_size(kBatch)
      .order(graphs::BatchOrder::kPerMember)
      .device(al_device())
      .log([](const std::string&) {});
  double seconds = 0;
  int64_t steps = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const runtime::ActiveLearningResult r =
        runtime::run_active_learning(options, w.pool_x, w.pool_y, w.test_x, w.test_y, loop_options());
    if (al_device().is_cuda()) torch::cuda::synchronize();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<int64_t> labelled;
    for (const runtime::LearningCurvePoint& p : r.curve) labelled.push_back(p.labelled);
    steps = member_steps(labelled);
    benchmark::DoNotOptimize(r.curve.back().acquired);
  }
  report(state, seconds, steps, "Packed");
}

// --- the per-model loop ---------------------------------------------------------

struct Scaled {
  at::Tensor pool_x, pool_y, test_x;  // float32 on the device, standardized
  runtime::Standardizer y_scale;
};

Scaled standardize(const Workload& w, const std::vector<int64_t>& fit_rows, c10::Device device) {
  const at::Tensor rows = at::tensor(fit_rows, at::kLong);
  const runtime::Standardizer xs = runtime::Standardizer::fit(w.pool_x.index_select(0, rows));
  const runtime::Standardizer ys = runtime::Standardizer::fit(w.pool_y.index_select(0, rows));
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  return {xs.transform(w.pool_x).to(f32), ys.transform(w.pool_y).to(f32), xs.transform(w.test_x).to(f32), ys};
}

// Trains one fresh model on `rows` for kEpochs; returns its predictions on the pool
// and the test set (standardized units) and counts its steps.
std::pair<at::Tensor, at::Tensor> train_one(const Scaled& d, const at::Tensor& rows, uint64_t seed, int64_t member,
                                            int64_t& steps) {
  const auto mlp = ensemble::PackedMLPOptions(d.pool_x.size(1), 1)
                       .members(kRuns * kMembers)
                       .hidden(kHidden)
                       .depth(1)
                       .seed(seed)
                       .device(d.pool_x.device());
  torch::nn::Sequential model = ensemble::make_standalone_mlp(mlp, member);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));
  const int64_t n = rows.size(0);
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    const at::Tensor order = rows.index_select(0, torch::randperm(n, rows.options()));
    for (int64_t b = 0; b + kBatch <= n; b += kBatch) {
      const at::Tensor batch = order.narrow(0, b, kBatch);
      optimizer.zero_grad();
      torch::mse_loss(model->forward(d.pool_x.index_select(0, batch)), d.pool_y.index_select(0, batch)).backward();
      optimizer.step();
      ++steps;
    }
  }
  torch::NoGradGuard no_grad;
  return {model->forward(d.pool_x).reshape({-1}), model->forward(d.test_x).reshape({-1})};
}

// The whole loop; returns the member-steps it took.
int64_t per_model_active_learning(const Workload& w, c10::Device device) {
  const runtime::ActiveLearningOptions o = loop_options();
  std::vector<int64_t> initial(static_cast<size_t>(w.pool_x.size(0)));
  std::iota(initial.begin(), initial.end(), 0);
  std::mt19937_64 rng(o.seed());
  std::shuffle(initial.begin(), initial.end(), rng);
  initial.resize(static_cast<size_t>(o.initial()));
  std::vector<runtime::PoolPartition> runs(kRuns, runtime::PoolPartition(w.pool_x.size(0), initial));
  const Scaled d = standardize(w, initial, device);
  int64_t steps = 0;
  for (int64_t round = 0; round < o.rounds(); ++round) {
    for (int64_t g = 0; g < kRuns; ++g) {
      const at::Tensor rows = at::tensor(runs[g].labelled(), at::TensorOptions().dtype(at::kLong).device(device));
      std::vector<at::Tensor> pool, test;
      for (int64_t m = 0; m < kMembers; ++m) {
        auto [p, t] = train_one(d, rows, 1000 + static_cast<uint64_t>(round), g * kMembers + m, steps);
        pool.push_back(p);
        test.push_back(t);
      }
      const double y_mean = d.y_scale.mean.item<double>(), y_std = d.y_scale.std.item<double>();
      const at::Tensor test_mean = at::stack(test).mean(0).to(at::kDouble).cpu() * y_std + y_mean;
      benchmark::DoNotOptimize((test_mean - w.test_y.reshape({-1})).square().mean().sqrt().item<double>());
      if (round + 1 < o.rounds()) runs[g].acquire_top(at::stack(pool).std(0, false).to(at::kDouble).cpu(), o.acquire());
    }
  }
  return steps;
}

void LoopPerModel(benchmark::State& state) {
  const Workload& w = workload();
  double seconds = 0;
  int64_t steps = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    steps = per_model_active_learning(w, al_device());
    if (al_device().is_cuda()) torch::cuda::synchronize();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  report(state, seconds, steps, "LoopPerModel");
}

BENCHMARK(Packed)->Name("ActiveLearning/Packed")->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK(LoopPerModel)->Name("ActiveLearning/LoopPerModel")->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

}  // namespace
