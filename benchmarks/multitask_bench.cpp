// Multi-task transformer steps and decoding (issue: multi-task runtime), steps/s:
//   MultiTaskTwoForward - the two-model approach: the shared trunk runs once per head
//                         (two forwards), summed loss, one backward, AdamW; eager;
//   MultiTaskShared     - ensemble::multitask_train_step: one trunk forward, eager;
//   MultiTaskGraph      - the same step captured as a CUDA graph and replayed (CUDA only);
// and decoding at batch 1 (tokens/s, items_per_second): DecodeEager, DecodeGraph
// (CUDA only) through MultiTaskTrainer::generate, greedy, 120 new tokens a call.
// Shape: 4 layers, width 256, 8 heads, sequence 64, batch 32 (PACKTRAIN_BENCH_MT_*
// overrides: LAYERS, WIDTH, SEQ, BATCH). Both tasks read the same texts.
#include "benchmarks/multitask_bench.h"

#include "packtrain/ensemble/multitask_step.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/graphs/captured_step.h"
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace packtrain::benchmarks {

namespace {

int64_t env_or(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::stoll(v) : fallback;
}

struct Shape {
  int64_t layers = env_or("PACKTRAIN_BENCH_MT_LAYERS", 4), width = env_or("PACKTRAIN_BENCH_MT_WIDTH", 256);
  int64_t seq = env_or("PACKTRAIN_BENCH_MT_SEQ", 64), batch = env_or("PACKTRAIN_BENCH_MT_BATCH", 32);
};

ensemble::PackedTransformerOptions model_options(const Shape& s, c10::Device device) {
  return ensemble::PackedTransformerOptions()
      .width(s.width)
      .layers(s.layers)
      .heads(8)
      .max_length(std::max<int64_t>(s.seq, 128))
      .device(device);
}

struct Inputs {
  ensemble::TextBatch batch;
  at::Tensor labels;
};

Inputs inputs(const Shape& s, c10::Device device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor tokens = at::randint(0, 256, {s.batch, s.seq}, gen, at::kLong);
  const at::Tensor lengths = at::randint(s.seq / 2, s.seq + 1, {s.batch}, gen, at::kLong);
  return {{tokens.to(device), lengths.to(device)}, at::randint(0, 2, {s.batch}, gen, at::kLong).to(device)};
}

void sync(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

void two_forward_step(ensemble::PackedTransformer& model, ensemble::PackedAdam& optimizer, const Inputs& in) {
  model.parameters().zero_grad();
  const at::Tensor cls =
      ensemble::packed_cross_entropy_loss(model.classify(model.trunk(in.batch.tokens), in.batch.lengths), in.labels);
  const at::Tensor lm = ensemble::packed_lm_loss(model.lm_logits(model.trunk(in.batch.tokens)), in.batch);
  torch::autograd::backward({(cls + lm).sum()});
  optimizer.step();
}

void run_step(benchmark::State& state, c10::Device device, const std::string& kind) {
  const Shape s;
  ensemble::PackedTransformer model(model_options(s, device));
  ensemble::PackedAdam optimizer(model.parameters(), ensemble::adamw_options().lr(1e-4));
  const Inputs in = inputs(s, device);
  std::unique_ptr<graphs::CapturedStep> graph;
  const auto shared = [&] { ensemble::multitask_train_step(model, optimizer, in.batch, in.labels, in.batch, {}); };
  if (kind == "graph") {
    graph = std::make_unique<graphs::CapturedStep>("multitask", device, std::vector<graphs::StaticInput>{},
                                                   [&](const std::vector<at::Tensor>&) { shared(); });
    while (graph->mode() == graphs::StepMode::kWarmingUp) graph->run();
    if (graph->mode() != graphs::StepMode::kGraph) {
      state.SkipWithError(("not captured: " + graph->eager_reason()).c_str());
      return;
    }
  }
  for (int i = 0; i < 2; ++i)
    kind == "two" ? two_forward_step(model, optimizer, in) : (graph ? graph->run() : shared());
  sync(device);
  for (auto _ : state) {
    if (kind == "two") {
      two_forward_step(model, optimizer, in);
    } else if (graph) {
      graph->run();
    } else {
      shared();
    }
    sync(device);
  }
  state.SetItemsProcessed(state.iterations());  // steps
  state.SetLabel(device.str() + ", " + std::to_string(s.layers) + " layers, width " + std::to_string(s.width) +
                 ", seq " + std::to_string(s.seq) + ", batch " + std::to_string(s.batch));
}

void run_decode(benchmark::State& state, c10::Device device, bool capture) {
  const Shape s;
  runtime::MultiTaskTrainer trainer(
      runtime::MultiTaskTrainerOptions().model(model_options(s, device)).buckets({128}).capture(capture));
  runtime::GenerateOptions g;
  g.max_new_tokens = 120;
  g.temperature = 0;
  g.capture = capture;
  trainer.generate("a", g);  // warm-up
  if (capture && trainer.last_decode_mode() != "graph") {
    state.SkipWithError("decode step not captured");
    return;
  }
  int64_t tokens = 0;
  for (auto _ : state) {
    trainer.generate("a", g);
    tokens += g.max_new_tokens;
  }
  state.SetItemsProcessed(tokens);
  state.SetLabel(device.str() + ", batch 1, " + trainer.last_decode_mode());
}

}  // namespace

void register_multitask_benchmarks(c10::Device device) {
  const auto unit = [](benchmark::internal::Benchmark* b) { b->Unit(benchmark::kMillisecond)->UseRealTime(); };
  unit(benchmark::RegisterBenchmark("MultiTaskTwoForward", [=](benchmark::State& s) { run_step(s, device, "two"); }));
  unit(benchmark::RegisterBenchmark("MultiTaskShared", [=](benchmark::State& s) { run_step(s, device, "shared"); }));
  unit(benchmark::RegisterBenchmark("DecodeEager", [=](benchmark::State& s) { run_decode(s, device, false); }));
  if (device.is_cuda()) {
    unit(benchmark::RegisterBenchmark("MultiTaskGraph", [=](benchmark::State& s) { run_step(s, device, "graph"); }));
    unit(benchmark::RegisterBenchmark("DecodeGraph", [=](benchmark::State& s) { run_decode(s, device, true); }));
  }
}

}  // namespace packtrain::benchmarks
