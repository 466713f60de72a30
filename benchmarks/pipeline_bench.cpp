// MultiTaskPipeline/stages:S/micro_batches:M/replicas:R — one multi-task training
// step of a PackedTransformer (width 128, 4 blocks, 4 heads: the default multi-task
// model with 4 blocks so that 4 stages have one each; batch 32 sentences of 64
// tokens) split over S stages, each a rank with its own Gloo group over loopback,
// run as M micro-batches in the 1F1B schedule; R > 1 runs R replicas of the
// pipeline (S x R ranks, each replica on B / R of the batch, each stage's gradients
// summed over its replicas). S = 1 is the whole model in one rank (the ordinary
// step). The ranks are threads of this process (the tests' arrangement:
// the same TCP store and Gloo pairs separate processes use); each rank's per-rank
// peak RSS, as separate processes, is measured by scripts/pipeline_memory.sh.
//
// Counters: us_per_step (the step as rank 0 sees it, from its first forward to its
// optimizer update, which waits for the last stage's gradients), state_bytes_max_rank
// (the largest rank's parameters + gradients + Adam moments, summed from its
// tensors), state_bytes_whole (the same for the whole model), bubble_model =
// (S - 1) / (M + S - 1), the idle fraction the schedule implies on S devices, and
// slowest_stage_ms_{parameters,time}: the slowest stage's forward + backward per
// micro-batch under each placement, from the pieces' times measured on this machine
// (runtime/measure/layer_timing.h) — what placing by time gains where it differs;
// last_stage_first_block says where the placement put the last boundary.
//
// MultiTaskPipelinePlacement/by_time:0|1 — the same step for a large-vocabulary
// model (below) on 2 stages, placed by parameters (0) or by measured time (1).
//
// On this 2-core CPU the S ranks share two cores, so S > 1 cannot be faster than S =
// 1: what the benchmark shows here is the pipeline's overhead (send/recv, smaller
// GEMMs per micro-batch) and the bytes per rank; the speed-up needs one device per
// stage.
#include "benchmarks/pipeline_bench.h"

#include "packtrain/ensemble/multitask_step.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_transformer.h"
#include "packtrain/runtime/distributed/pipeline_groups.h"
#include "packtrain/runtime/distributed/pipeline_placement.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/measure/layer_timing.h"
#include "packtrain/runtime/trainers/multitask/multitask_pipeline.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace packtrain::benchmarks {

namespace {

constexpr int64_t kBatch = 32, kTokens = 64, kStepsPerIteration = 4, kIterations = 8, kWarmupSteps = 2;

ensemble::PackedTransformerOptions bench_model() {
  return ensemble::PackedTransformerOptions().width(128).layers(4).heads(4).max_length(kTokens).seed(1);
}

// A port for this process's store (one group at a time; the pid keeps two
// benchmark runs on one machine apart).
int store_port(int64_t stages) {
  return 40000 + static_cast<int>(::getpid() % 10000) * 2 + static_cast<int>(stages % 2);
}

int64_t held_bytes(ensemble::PackedTransformer& model, const ensemble::PackedAdam& optimizer) {
  int64_t bytes = static_cast<int64_t>(model.parameters().flat().nbytes() + model.parameters().flat_grad().nbytes());
  for (const auto& [name, t] : optimizer.state()) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

// The step of `options` over S stages x R replicas, M micro-batches, the blocks
// placed by `balance` (by time: from pieces measured first, as a run measures them).
void run_pipeline(benchmark::State& state, const ensemble::PackedTransformerOptions& options, int64_t S, int64_t M,
                  int64_t R, runtime::distributed::PlacementBalance balance) {
  const int64_t world = S * R;
  using runtime::distributed::ProcessGroup;
  if (!ProcessGroup::gloo_available()) {
    state.SkipWithError("this build has no Gloo");
    return;
  }
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  const ensemble::TextBatch batch{at::randint(3, 259, {kBatch, kTokens}, generator, at::kLong),
                                  at::full({kBatch}, kTokens, at::kLong)};
  const at::Tensor labels = at::randint(0, 2, {kBatch}, generator, at::kLong);
  // The slowest stage per micro-batch under either placement, from measured pieces.
  const runtime::LayerTimes times = runtime::measure_layer_times(options, kBatch / (R * M), kTokens);
  const auto by_parameters = runtime::distributed::place_pipeline(options, S, kBatch / (R * M), kTokens);
  const auto by_time = runtime::distributed::place_pipeline_by_time(options, S, kBatch / (R * M), kTokens, times);
  const auto& placement = balance == runtime::distributed::PlacementBalance::kTime ? by_time : by_parameters;
  const int port = store_port(S);
  const int64_t total_steps = kWarmupSteps + kIterations * kStepsPerIteration;

  std::vector<int64_t> bytes(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  double timed_seconds = 0;
  // Each rank: join, build its stage, run `total_steps`; rank 0 (this thread) times them.
  const auto rank_body = [&](int64_t rank, benchmark::State* timed) {
    try {
      runtime::distributed::RankInfo info;
      info.rank = rank;
      info.world_size = world;
      info.master_port = port;
      info.source = "benchmark threads";
      auto group = ProcessGroup::join(info, std::chrono::seconds(120));
      const runtime::distributed::PipelineGroups groups = runtime::distributed::split_pipeline_groups(*group, S);
      ensemble::PackedTransformer model(options, placement[static_cast<size_t>(groups.stage)].blocks);
      ensemble::PackedAdam optimizer(model.parameters(), ensemble::adamw_options().lr(1e-3));
      runtime::MultiTaskPipeline pipeline(model, optimizer, *groups.pipeline, M, ensemble::TaskWeights{},
                                          groups.stage_replicas);
      bytes[static_cast<size_t>(rank)] = held_bytes(model, optimizer);
      int64_t step = 0;
      for (; step < kWarmupSteps; ++step) pipeline.train_step(batch, labels, step);
      if (timed == nullptr) {
        for (; step < total_steps; ++step) pipeline.train_step(batch, labels, step);
      } else {
        for (auto _ : *timed) {
          const auto start = std::chrono::steady_clock::now();
          for (int64_t i = 0; i < kStepsPerIteration; ++i, ++step) pipeline.train_step(batch, labels, step);
          const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          timed_seconds += seconds;
          timed->SetIterationTime(seconds);
        }
      }
      group->barrier();
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  };
  std::vector<std::thread> others;
  for (int64_t r = 1; r < world; ++r) others.emplace_back(rank_body, r, nullptr);
  rank_body(0, &state);
  for (std::thread& t : others) t.join();
  for (int64_t r = 0; r < world; ++r) {
    if (!errors[static_cast<size_t>(r)].empty()) {
      state.SkipWithError(("rank " + std::to_string(r) + ": " + errors[static_cast<size_t>(r)]).c_str());
      return;
    }
  }
  ensemble::PackedTransformer whole(options);
  ensemble::PackedAdam whole_optimizer(whole.parameters(), ensemble::adamw_options().lr(1e-3));
  const double steps = static_cast<double>(state.iterations() * kStepsPerIteration);
  state.counters["us_per_step"] = steps > 0 ? timed_seconds * 1e6 / steps : 0;
  state.counters["state_bytes_max_rank"] = static_cast<double>(*std::max_element(bytes.begin(), bytes.end()));
  state.counters["state_bytes_whole"] = static_cast<double>(held_bytes(whole, whole_optimizer));
  state.counters["bubble_model"] = runtime::distributed::bubble_fraction(S, M);
  const auto slowest_ms = [&](const std::vector<runtime::distributed::StagePlacement>& stages) {
    double worst = 0;
    for (const auto& p : stages) worst = std::max(worst, runtime::distributed::stage_seconds(options, p.blocks, times));
    return worst * 1e3;
  };
  state.counters["slowest_stage_ms_parameters"] = slowest_ms(by_parameters);
  state.counters["slowest_stage_ms_time"] = slowest_ms(by_time);
  state.counters["last_stage_first_block"] = static_cast<double>(placement.back().blocks.first_layer);
  state.SetItemsProcessed(static_cast<int64_t>(steps) * kBatch);
  state.SetLabel("cpu, " + std::to_string(world) + " rank thread(s), 1F1B, by " +
                 std::string(runtime::distributed::kPlacementBalanceNames.name(balance)));
}

void run_pipeline_step(benchmark::State& state) {
  run_pipeline(state, bench_model(), state.range(0), state.range(1), state.range(2),
               runtime::distributed::PlacementBalance::kParameters);
}

// A GPT-2-like vocabulary (16,384 tokens, tied head) on 8 blocks, 2 stages: the
// token embedding's lookup is cheap and the LM head's product is not, so equal
// parameters (the embedding and the head's tied copy weigh the same) leave the last
// stage the slow one; placing by time moves blocks to the first.
void run_pipeline_placement(benchmark::State& state) {
  run_pipeline(state, bench_model().layers(8).vocab(16384), 2, 4, 1,
               static_cast<runtime::distributed::PlacementBalance>(state.range(0)));
}

}  // namespace

void register_pipeline_benchmarks() {
  benchmark::RegisterBenchmark("MultiTaskPipeline", run_pipeline_step)
      ->ArgNames({"stages", "micro_batches", "replicas"})
      ->Args({1, 1, 1})
      ->Args({2, 4, 1})
      ->Args({4, 4, 1})
      ->Args({4, 8, 1})
      ->Args({2, 4, 2})
      ->Iterations(kIterations)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("MultiTaskPipelinePlacement", run_pipeline_placement)
      ->ArgNames({"by_time"})
      ->Args({0})
      ->Args({1})
      ->Iterations(kIterations)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

}  // namespace packtrain::benchmarks
