// Pipeline model parallelism on the CPU: placement balances the stages' parameters
// and the bytes each rank holds fall as ~1/S; a stage starts where the whole model
// does; S = 2 and S = 4 ranks train the same parameters as one process, the tied
// token embedding identical on the first and last stage after every step, and so
// do S x R ranks (R data-parallel replicas of the pipeline, each stage's replicas
// identical); a stage that stops ends its neighbour with an error naming both
// stages and the step; a stage file of a pipeline checkpoint is checked against the
// stage it records.
//
// Each rank runs in its own thread with its own ProcessGroup: a TCP store and Gloo
// over loopback, exactly as separate processes use them (the multi-process runs
// are in cli_tests: `packtrain launch --nproc 2 -- multitask train --pipeline-stages 2`).
#include "packtrain/ensemble/multitask_step.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_transformer.h"
#include "packtrain/runtime/distributed/pipeline_groups.h"
#include "packtrain/runtime/distributed/pipeline_placement.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/measure/layer_timing.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/labelled_texts.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/trainers/multitask/multitask_pipeline.h"
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"
#include "packtrain/runtime/trainers/multitask/pipeline_stage_steps.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace packtrain::runtime {
namespace {

using distributed::ProcessGroup;
using distributed::RankInfo;
using ensemble::PackedTransformer;
using ensemble::PackedTransformerOptions;
using packtrain::testing::all_close;
using packtrain::testing::all_equal;

PackedTransformerOptions model_options(c10::ScalarType dtype, int64_t layers = 4) {
  return PackedTransformerOptions().members(2).width(16).layers(layers).heads(2).max_length(16).seed(5).dtype(dtype);
}

struct Batch {
  ensemble::TextBatch text;
  at::Tensor labels;
};

// B rows of random bytes, right-padded, of random lengths 2..T.
Batch random_batch(int64_t B, int64_t T, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  Batch b;
  b.text.lengths = at::randint(2, T + 1, {B}, generator, at::kLong);
  b.text.tokens = at::randint(3, 259, {B, T}, generator, at::kLong);
  b.text.tokens.masked_fill_(at::arange(T).unsqueeze(0) >= b.text.lengths.unsqueeze(1), 0);
  b.labels = at::randint(0, 2, {B}, generator, at::kLong);
  return b;
}

// Parameters by name (copies).
using Snapshot = std::map<std::string, at::Tensor>;
Snapshot snapshot(const ensemble::PackedParameters& parameters) {
  Snapshot out;
  for (size_t i = 0; i < parameters.size(); ++i) {
    out[parameters.spec(i).name] = parameters.at(parameters.spec(i).name).detach().clone();
  }
  return out;
}

ensemble::AdamOptions adam() { return ensemble::adamw_options().lr(1e-2); }
const ensemble::TaskWeights kWeights{0.7, 1.3};

// One process: the whole model, `steps` ordinary multi-task steps; the parameters
// and losses after each.
struct Trace {
  std::vector<Snapshot> parameters;
  std::vector<ensemble::MultiTaskLosses> losses;
};
Trace one_process(const PackedTransformerOptions& options, const std::vector<Batch>& batches) {
  PackedTransformer model(options);
  ensemble::PackedAdam optimizer(model.parameters(), adam());
  Trace trace;
  for (const Batch& b : batches) {
    trace.losses.push_back(ensemble::multitask_train_step(model, optimizer, b.text, b.labels, b.text, kWeights));
    trace.parameters.push_back(snapshot(model.parameters()));
  }
  return trace;
}

// Runs `body(rank, group)` on `world` threads, each joined to one group; returns
// each rank's error message ("" when it returned normally).
std::vector<std::string> run_ranks(int64_t world, const std::function<void(int64_t, ProcessGroup&)>& body,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const int port = packtrain::testing::free_port();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        RankInfo info;
        info.rank = r;
        info.world_size = world;
        info.local_rank = r;
        info.local_world_size = world;
        info.master_port = port;
        info.source = "test threads";
        auto group = ProcessGroup::join(info, timeout);
        body(r, *group);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        if (errors[static_cast<size_t>(r)].empty()) errors[static_cast<size_t>(r)] = "(empty error)";
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

// S stages x R replicas (S x R ranks, split as a pipeline run splits them), M
// micro-batches: each rank's parameters and (last stages) losses after each step.
struct PipelineTrace {
  std::vector<std::vector<Snapshot>> parameters;               // [rank][step]
  std::vector<std::vector<ensemble::MultiTaskLosses>> losses;  // [replica][step], its last stage's
  std::vector<int64_t> peak_in_flight;                         // per rank
};
void ignore_log(const std::string&) {}

PipelineTrace pipelined(const PackedTransformerOptions& options, int64_t stages, int64_t micro_batches,
                        const std::vector<Batch>& batches, int64_t replicas = 1,
                        StageExecution execution = StageExecution::kAutograd) {
  const int64_t world = stages * replicas;
  PipelineTrace trace;
  trace.parameters.resize(static_cast<size_t>(world));
  trace.losses.resize(static_cast<size_t>(replicas));
  trace.peak_in_flight.resize(static_cast<size_t>(world));
  const int64_t B = batches.front().text.tokens.size(0), T = batches.front().text.tokens.size(1);
  const auto placement = distributed::place_pipeline(options, stages, B / (replicas * micro_batches), T);
  const std::vector<std::string> errors = run_ranks(world, [&](int64_t rank, ProcessGroup& group) {
    const distributed::PipelineGroups groups = distributed::split_pipeline_groups(group, stages);
    EXPECT_EQ(groups.stage, rank % stages);
    EXPECT_EQ(groups.replica, rank / stages);
    PackedTransformer model(options, placement[static_cast<size_t>(groups.stage)].blocks);
    ensemble::PackedAdam optimizer(model.parameters(), adam());
    MultiTaskPipeline pipeline(model, optimizer, *groups.pipeline, micro_batches, kWeights, groups.stage_replicas,
                               execution, graphs::CaptureOptions().log(ignore_log));
    EXPECT_EQ(pipeline.execution(), execution);
    for (size_t step = 0; step < batches.size(); ++step) {
      const ensemble::MultiTaskLosses losses =
          pipeline.train_step(batches[step].text, batches[step].labels, static_cast<int64_t>(step));
      trace.parameters[static_cast<size_t>(rank)].push_back(snapshot(model.parameters()));
      if (groups.stage == stages - 1) trace.losses[static_cast<size_t>(groups.replica)].push_back(losses);
    }
    trace.peak_in_flight[static_cast<size_t>(rank)] = pipeline.peak_micro_batches_in_flight();
  });
  for (int64_t r = 0; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  }
  return trace;
}

// Every rank's parameters equal the one-process model's (by name) after every
// step, to `tolerance`; the tied embedding's two copies are bitwise equal, and so
// are a stage's R replicas; every replica reports the whole batch's losses.
void expect_same_training(const PackedTransformerOptions& options, int64_t stages, int64_t micro_batches,
                          double tolerance, int64_t replicas = 1,
                          StageExecution execution = StageExecution::kAutograd) {
  std::vector<Batch> batches;
  for (uint64_t s = 0; s < 3; ++s) batches.push_back(random_batch(8, 12, 100 + s));
  const Trace reference = one_process(options, batches);
  const PipelineTrace trace = pipelined(options, stages, micro_batches, batches, replicas, execution);
  if (::testing::Test::HasFailure()) return;
  for (size_t step = 0; step < batches.size(); ++step) {
    SCOPED_TRACE("after step " + std::to_string(step));
    size_t names = 0;
    for (int64_t r = 0; r < stages * replicas; ++r) {
      for (const auto& [name, value] : trace.parameters[static_cast<size_t>(r)][step]) {
        EXPECT_TRUE(all_close(value, reference.parameters[step].at(name), tolerance)) << name << " on rank " << r;
        // Replicas of a stage: the same sum of gradients, the same update, bitwise.
        EXPECT_TRUE(all_equal(value, trace.parameters[static_cast<size_t>(r % stages)][step].at(name)))
            << name << " on rank " << r;
        names += r < stages ? 1 : 0;
      }
    }
    // Every parameter of the model is on some stage (a tied LM head's copy once more).
    const bool copy = options.tie_lm_head() && stages > 1;
    EXPECT_EQ(names, reference.parameters[step].size() + (copy ? 1 : 0));
    const Snapshot& last = trace.parameters[static_cast<size_t>(stages - 1)][step];
    if (copy) {
      EXPECT_TRUE(all_equal(trace.parameters.front()[step].at("tok_emb.weight"), last.at("tok_emb.weight")));
    } else {
      EXPECT_FALSE(last.contains("tok_emb.weight"));
    }
    for (const auto& losses : trace.losses) {
      ASSERT_EQ(losses.size(), batches.size());
      EXPECT_TRUE(all_close(losses[step].classification, reference.losses[step].classification, tolerance));
      EXPECT_TRUE(all_close(losses[step].language_model, reference.losses[step].language_model, tolerance));
    }
  }
  // 1F1B: stage s keeps at most min(M, S - s) micro-batches' activations.
  for (int64_t r = 0; r < stages * replicas; ++r) {
    const int64_t s = r % stages;
    EXPECT_EQ(trace.peak_in_flight[static_cast<size_t>(r)], std::min(micro_batches, stages - s)) << "rank " << r;
  }
}

void skip_without_gloo() {
  if (!ProcessGroup::gloo_available()) GTEST_SKIP() << "built without Gloo's headers (Debian libgloo-dev)";
}

TEST(PipelineTest, TwoStagesTrainTheSameModelAsOneProcessFloat64) {
  skip_without_gloo();
  expect_same_training(model_options(at::kDouble), 2, 4, 1e-9);
}

TEST(PipelineTest, FourStagesTrainTheSameModelAsOneProcessFloat64) {
  skip_without_gloo();
  expect_same_training(model_options(at::kDouble), 4, 4, 1e-9);
}

TEST(PipelineTest, FewerMicroBatchesThanStagesFloat64) {
  skip_without_gloo();
  expect_same_training(model_options(at::kDouble), 4, 2, 1e-9);
}

// Pipeline x data parallel: 2 stages x 2 replicas (4 ranks), and 2 x 4 with one
// micro-batch each: the one-process step on the whole batch.
TEST(PipelineTest, TwoStagesTimesTwoReplicasTrainTheSameModelAsOneProcessFloat64) {
  skip_without_gloo();
  expect_same_training(model_options(at::kDouble), 2, 2, 1e-9, /*replicas=*/2);
}

TEST(PipelineTest, TwoStagesTimesFourReplicasFloat64) {
  skip_without_gloo();
  expect_same_training(model_options(at::kDouble), 2, 1, 1e-9, /*replicas=*/4);
}

// Static steps (what a GPU captures; eager here): the forward without autograd, the
// backward recomputing it, the last stage's one step — the same training.
TEST(PipelineTest, StaticStepsTrainTheSameModelAsOneProcessFloat64) {
  skip_without_gloo();
  expect_same_training(model_options(at::kDouble), 2, 4, 1e-9, 1, StageExecution::kStatic);
  expect_same_training(model_options(at::kDouble), 4, 2, 1e-9, 1, StageExecution::kStatic);
  expect_same_training(model_options(at::kDouble), 2, 2, 1e-9, 2, StageExecution::kStatic);
  expect_same_training(model_options(at::kDouble).tie_lm_head(false), 2, 2, 1e-9, 1, StageExecution::kStatic);
}

TEST(PipelineTest, UntiedHeadFloat64) {
  skip_without_gloo();
  expect_same_training(model_options(at::kDouble).tie_lm_head(false), 2, 2, 1e-9);
}

// Float32: the pipeline sums the micro-batches' gradients where one process sums
// the whole batch's, so each gradient differs from the one-process one by rounding.
// Adam divides each gradient by its own running scale, so a relative difference e
// moves a weight by ~e x lr per step: ~1e-7 x lr for ordinary gradients, but up to
// ~1e-3 x lr where a gradient is a sum that nearly cancels (measured: 1.05e-5 on an
// MLP weight after 3 steps). 1e-4 covers that (3 steps x 1e-3 x lr 1e-2 = 3e-5,
// with room) and is still 100x below one step's change (lr), so a missed, repeated
// or wrong step fails. Attention key biases are compared separately: softmax is
// unchanged by adding the same value to every key score, so their exact gradient is
// zero and what each run gets is rounding noise, which Adam scales up to steps of
// up to lr; they are only bounded (by 1.5 x lr x steps from each other).
TEST(PipelineTest, TwoStagesTrainTheSameModelAsOneProcessFloat32) {
  skip_without_gloo();
  const PackedTransformerOptions options = model_options(at::kFloat);
  std::vector<Batch> batches;
  for (uint64_t s = 0; s < 3; ++s) batches.push_back(random_batch(8, 12, 100 + s));
  const Trace reference = one_process(options, batches);
  const PipelineTrace trace = pipelined(options, 2, 4, batches);
  if (::testing::Test::HasFailure()) return;
  const int64_t d = options.width();
  for (size_t step = 0; step < batches.size(); ++step) {
    SCOPED_TRACE("after step " + std::to_string(step));
    for (const auto& stage : trace.parameters) {
      for (const auto& [name, value] : stage[step]) {
        const at::Tensor expected = reference.parameters[step].at(name);
        if (name.ends_with(".attn.qkv.bias")) {
          // Columns [q | k | v], d each: q and v as any weight, k bounded.
          EXPECT_TRUE(all_close(value.narrow(-1, 0, d), expected.narrow(-1, 0, d), 1e-4)) << name;
          EXPECT_TRUE(all_close(value.narrow(-1, 2 * d, d), expected.narrow(-1, 2 * d, d), 1e-4)) << name;
          EXPECT_TRUE(all_close(value.narrow(-1, d, d), expected.narrow(-1, d, d), 1.5 * 1e-2 * (step + 1))) << name;
        } else {
          EXPECT_TRUE(all_close(value, expected, 1e-4)) << name;
        }
      }
    }
    EXPECT_TRUE(all_equal(trace.parameters.front()[step].at("tok_emb.weight"),
                          trace.parameters.back()[step].at("tok_emb.weight")));
  }
}

TEST(PipelineTest, StagesStartWhereTheWholeModelDoes) {
  const PackedTransformerOptions options = model_options(at::kFloat);
  const Snapshot whole = snapshot(PackedTransformer(options).parameters());
  for (const auto& p : distributed::place_pipeline(options, 3, 4, 12)) {
    const Snapshot stage = snapshot(PackedTransformer(options, p.blocks).parameters());
    for (const auto& [name, value] : stage) EXPECT_TRUE(all_equal(value, whole.at(name))) << name;
  }
}

// Scalars of all members that blocks [first, end) with their extras hold.
int64_t stage_parameters(const PackedTransformerOptions& options, int64_t first, int64_t end) {
  int64_t n = 0;
  for (const ensemble::ParameterSpec& spec : ensemble::transformer_parameters(options, {first, end})) {
    int64_t m = 1;
    for (const int64_t d : spec.shape) m *= d;
    n += m;
  }
  return n * options.members();
}

TEST(PipelinePlacementTest, ContiguousBalancedAndEveryStageHoldsABlock) {
  const PackedTransformerOptions options = model_options(at::kFloat, 8).width(64).heads(4).max_length(64);
  for (int64_t S : {1, 2, 4, 8}) {
    SCOPED_TRACE("S = " + std::to_string(S));
    const auto placement = distributed::place_pipeline(options, S, 4, 32);
    ASSERT_EQ(static_cast<int64_t>(placement.size()), S);
    int64_t next = 0, largest = 0, total = 0;
    for (const auto& p : placement) {
      EXPECT_EQ(p.blocks.first_layer, next);
      EXPECT_GT(p.blocks.end_layer, p.blocks.first_layer);
      EXPECT_EQ(p.parameters, stage_parameters(options, p.blocks.first_layer, p.blocks.end_layer));
      next = p.blocks.end_layer;
      largest = std::max(largest, p.parameters);
      total += p.parameters;
    }
    EXPECT_EQ(next, 8);
    // No other contiguous split has a smaller largest stage: moving any boundary
    // one block either way cannot lower the maximum.
    for (int64_t s = 0; s + 1 < S; ++s) {
      for (int64_t shift : {-1, 1}) {
        std::vector<int64_t> ends;
        for (const auto& p : placement) ends.push_back(p.blocks.end_layer);
        ends[static_cast<size_t>(s)] += shift;
        int64_t first = 0, worst = 0;
        bool valid = true;
        for (int64_t end : ends) {
          valid = valid && end > first;
          if (valid) worst = std::max(worst, stage_parameters(options, first, end));
          first = end;
        }
        if (valid) {
          EXPECT_GE(worst, largest) << "boundary " << s << " moved by " << shift;
        }
      }
    }
    if (S == 1) {
      EXPECT_EQ(total, PackedTransformer(options).parameters().flat().numel());
    }
  }
  EXPECT_THROW(distributed::place_pipeline(options, 0, 4, 32), std::invalid_argument);
  EXPECT_THROW(distributed::place_pipeline(options, 9, 4, 32), std::invalid_argument);
  EXPECT_DOUBLE_EQ(distributed::bubble_fraction(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(distributed::bubble_fraction(1, 8), 0.0);
}

// Placed by time, a stage costs its blocks' time plus the embedding's (first stage)
// and the heads' (last): the slowest stage is as fast as any contiguous split
// allows, heavy heads push blocks off the last stage (where balancing parameters
// would not), and a placement's boundaries give it back.
TEST(PipelinePlacementTest, ByTimeMinimizesTheSlowestStage) {
  const PackedTransformerOptions options = model_options(at::kFloat, 8);
  const LayerTimes times{0.5, 1.0, 4.0};
  const auto cost = [&](int64_t a, int64_t b) {
    return static_cast<double>(b - a) * times.block + (a == 0 ? times.embedding : 0.0) + (b == 8 ? times.heads : 0.0);
  };
  const auto two = distributed::place_pipeline_by_time(options, 2, 4, 12, times);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].blocks.first_layer, 6) << "6.5 s | 6 s is the only split whose slowest stage is below 7 s";
  EXPECT_DOUBLE_EQ(two[0].seconds, 6.5);
  EXPECT_DOUBLE_EQ(two[1].seconds, 6.0);
  EXPECT_LT(distributed::place_pipeline(options, 2, 4, 12)[1].blocks.first_layer, 6);
  // Static stage steps recompute the forward on stages before the last: stage 0's
  // blocks cost 1.5 s each (+0.75 s embeddings), so it gets fewer: 6.75 s | 8 s.
  const LayerTimes forwards{0.5, 1.0, 4.0, 0.25, 0.5};
  const auto recomputed = distributed::place_pipeline_by_time(options, 2, 4, 12, forwards, /*recompute=*/true);
  EXPECT_EQ(recomputed[1].blocks.first_layer, 4);
  EXPECT_DOUBLE_EQ(recomputed[0].seconds, 6.75);
  EXPECT_DOUBLE_EQ(recomputed[1].seconds, 8.0);
  // Three stages: no split of 8 blocks has a faster slowest stage (all 21 tried).
  const auto three = distributed::place_pipeline_by_time(options, 3, 4, 12, times);
  double slowest = 0, best = 1e9;
  for (const auto& p : three) slowest = std::max(slowest, cost(p.blocks.first_layer, p.blocks.end_layer));
  for (int64_t a = 1; a < 8; ++a) {
    for (int64_t b = a + 1; b < 8; ++b) best = std::min(best, std::max({cost(0, a), cost(a, b), cost(b, 8)}));
  }
  EXPECT_DOUBLE_EQ(slowest, best);
  // The boundaries round-trip; bad ones are refused.
  const auto again = distributed::place_pipeline_at(options, distributed::stage_boundaries(three), 4, 12);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(again[s].blocks.first_layer, three[s].blocks.first_layer);
    EXPECT_EQ(again[s].blocks.end_layer, three[s].blocks.end_layer);
    EXPECT_EQ(again[s].parameters, three[s].parameters);
  }
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{0}, {8}, {5, 3}, {4, 4}}) {
    EXPECT_THROW(distributed::place_pipeline_at(options, bad, 4, 12), std::invalid_argument);
  }
}

// Layer timing measures every piece (positive, finite), and a block 16x wider takes
// clearly longer than a narrow one (~256x the arithmetic; asserted only 3x).
TEST(LayerTimingTest, MeasuresEachPieceAndAWiderBlockTakesLonger) {
  const PackedTransformerOptions narrow = model_options(at::kFloat).width(16).heads(2);
  const PackedTransformerOptions wide = model_options(at::kFloat).width(256).heads(4);
  // Medians of 9: a busy machine (CI beside a build) preempts single runs.
  const LayerTimes a = measure_layer_times(narrow, 8, 16, 9), b = measure_layer_times(wide, 8, 16, 9);
  for (const double t : {a.embedding, a.block, a.heads, a.embedding_forward, a.block_forward, b.embedding, b.block,
                         b.heads, b.embedding_forward, b.block_forward}) {
    EXPECT_TRUE(std::isfinite(t) && t > 0) << t;
  }
  EXPECT_LT(b.block_forward, b.block) << "a forward alone is part of forward + backward";
  EXPECT_GT(b.block, 3 * a.block) << "wide " << b.block << " s, narrow " << a.block << " s";
  EXPECT_THROW(measure_layer_times(narrow, 0, 16), std::invalid_argument);
  EXPECT_THROW(measure_layer_times(narrow, 8, 17), std::invalid_argument);
}

// The bytes each rank holds — its stage's parameters, gradients and Adam moments,
// measured from the tensors — fall as ~1/S: the largest rank holds at most 1.3x an
// even share of the whole model's (the embeddings and heads make the end stages
// heavier; a model whose blocks dominate, as this one's 16 do, stays near 1/S).
TEST(PipelinePlacementTest, BytesPerRankFallAsOneOverS) {
  const PackedTransformerOptions options = model_options(at::kFloat, 16).width(64).heads(4).max_length(64);
  const auto held_bytes = [](PackedTransformer& model) {
    ensemble::PackedAdam optimizer(model.parameters(), adam());
    int64_t bytes = model.parameters().flat().nbytes() + model.parameters().flat_grad().nbytes();
    for (const auto& [name, t] : optimizer.state()) bytes += static_cast<int64_t>(t.nbytes());
    return bytes;
  };
  PackedTransformer whole(options);
  const int64_t one = held_bytes(whole);
  for (int64_t S : {2, 4, 8}) {
    int64_t largest = 0;
    const auto placement = distributed::place_pipeline(options, S, 4, 32);
    for (const auto& p : placement) {
      PackedTransformer stage(options, p.blocks);
      const int64_t bytes = held_bytes(stage);
      // The placement's estimate is what the tensors hold (up to Adam's step counts).
      EXPECT_NEAR(static_cast<double>(bytes), static_cast<double>(p.state_bytes), 0.01 * p.state_bytes);
      largest = std::max(largest, bytes);
    }
    EXPECT_LE(static_cast<double>(largest), 1.3 * static_cast<double>(one) / static_cast<double>(S)) << "S = " << S;
  }
}

// S x R ranks split into each replica's pipeline and each stage's replicas: a
// reduction over either group sums just its ranks; a group's errors name it and the
// rank in the whole run; a run whose size is no multiple of S is refused on every rank.
TEST(PipelineGroupsTest, SubgroupsReduceOverTheirRanksAndNameThemselvesInErrors) {
  skip_without_gloo();
  const std::vector<std::string> errors = run_ranks(
      6,
      [&](int64_t rank, ProcessGroup& group) {
        const distributed::PipelineGroups g = distributed::split_pipeline_groups(group, 3);
        EXPECT_EQ(g.stages, 3);
        EXPECT_EQ(g.replicas, 2);
        at::Tensor along = at::full({2}, static_cast<double>(rank), at::kDouble), across = along.clone();
        g.pipeline->all_reduce_sum_(along, "pipeline sum");
        g.stage_replicas->all_reduce_sum_(across, "replica sum");
        const int64_t s = rank % 3, r = rank / 3;
        EXPECT_EQ(along[0].item<double>(), static_cast<double>(3 * r * 3 + 0 + 1 + 2)) << "rank " << rank;
        EXPECT_EQ(across[1].item<double>(), static_cast<double>(s + (s + 3))) << "rank " << rank;
        EXPECT_EQ(g.pipeline->rank(), s);
        EXPECT_EQ(g.stage_replicas->rank(), r);
        if (rank == 1) {  // stage 1's replica 1 (rank 4) never answers
          at::Tensor t = at::zeros({1}, at::kDouble);
          g.stage_replicas->recv_(t, 1, 7, "a message from replica 1", 3);
        }
      },
      std::chrono::seconds(2));
  EXPECT_THAT(errors[1], ::testing::HasSubstr("a message from replica 1 at step 3 failed on rank 0 of 2 of stage 1's "
                                              "replicas (rank 1 of 6)"));
  for (size_t r : {0, 2, 3, 4, 5}) EXPECT_EQ(errors[r], "") << "rank " << r;

  const std::vector<std::string> refused =
      run_ranks(3, [&](int64_t, ProcessGroup& group) { distributed::split_pipeline_groups(group, 2); });
  for (const std::string& e : refused) {
    EXPECT_THAT(e, ::testing::HasSubstr("2 pipeline stages need a multiple of 2 ranks")) << e;
    EXPECT_THAT(e, ::testing::HasSubstr("this run has 3")) << e;
  }
}

// A stage that stops (here: returns after one step, closing its group) ends its
// neighbour within the timeout, naming the two stages and the step.
TEST(PipelineTest, AStageThatStopsEndsItsNeighbourNamingStagesAndStep) {
  skip_without_gloo();
  const PackedTransformerOptions options = model_options(at::kFloat);
  const Batch batch = random_batch(4, 8, 7);
  const auto placement = distributed::place_pipeline(options, 2, 2, 8);
  const auto started = std::chrono::steady_clock::now();
  const std::vector<std::string> errors = run_ranks(
      2,
      [&](int64_t rank, ProcessGroup& group) {
        PackedTransformer model(options, placement[static_cast<size_t>(rank)].blocks);
        ensemble::PackedAdam optimizer(model.parameters(), adam());
        MultiTaskPipeline pipeline(model, optimizer, group, 2, kWeights);
        for (int64_t step = 0; step < (rank == 1 ? 1 : 3); ++step) pipeline.train_step(batch.text, batch.labels, step);
      },
      std::chrono::seconds(3));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(errors[1], "");
  // Stage 0 fails on its first transfer of step 1 that meets the closed connection:
  // posting the activations to stage 1 (Gloo throws there once the peer is gone) or
  // waiting for stage 1's gradients — either way named, with the step and rank.
  EXPECT_TRUE(std::regex_search(errors[0], std::regex("(activations from stage 0 to stage 1|activation gradients "
                                                      "from stage 1 to stage 0) at step 1 failed on rank 0 of 2")))
      << errors[0];
  EXPECT_LT(seconds, 30.0);
}

// A pipeline's static stage steps on one device, S stages in this process (no
// transfers: the tensors are handed over directly, the tied embedding's gradients
// summed by hand): the same parameters as one process after every step. On a GPU
// every step (each earlier stage's forward and backward — a middle stage's take and
// return activations — and the last stage's step) is captured after its warm-up and
// replayed: the code a GPU pipeline runs on each rank.
void expect_stages_in_one_process_train_the_same_model(c10::Device device, int64_t S) {
  const PackedTransformerOptions options = model_options(at::kDouble).device(device);
  const int64_t M = 2, steps = 6;  // 3 warm-up calls, the capture, replays
  std::vector<Batch> batches;
  for (uint64_t s = 0; s < steps; ++s) {
    Batch b = random_batch(8, 12, 200 + s);
    batches.push_back({{b.text.tokens.to(device), b.text.lengths.to(device)}, b.labels.to(device)});
  }
  const Trace reference = one_process(options, batches);
  const auto placement = distributed::place_pipeline(options, S, 8 / M, 12);
  std::vector<std::unique_ptr<PackedTransformer>> stages;
  std::vector<std::unique_ptr<ensemble::PackedAdam>> adams;
  std::vector<std::unique_ptr<PipelineStageSteps>> stage_steps;
  const graphs::CaptureOptions capture = graphs::CaptureOptions().log(ignore_log);
  for (int64_t s = 0; s < S; ++s) {
    stages.push_back(std::make_unique<PackedTransformer>(options, placement[static_cast<size_t>(s)].blocks));
    adams.push_back(std::make_unique<ensemble::PackedAdam>(stages.back()->parameters(), adam()));
    stage_steps.push_back(std::make_unique<PipelineStageSteps>(*stages.back(), kWeights, capture));
  }
  PipelineStageSteps& last_steps = *stage_steps.back();
  const auto tied = [](PackedTransformer& m) {
    for (size_t i = 0; i < m.parameters().size(); ++i) {
      if (m.parameters().spec(i).name == "tok_emb.weight") return m.parameters().blocks(m.parameters().flat_grad())[i];
    }
    return at::Tensor();
  };
  const auto real = stages.front()->parameters().flat().options();
  for (int64_t step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Batch& b = batches[static_cast<size_t>(step)];
    for (auto& stage : stages) stage->parameters().zero_grad();
    last_steps.zero_losses();
    const at::Tensor lm_total = ensemble::lm_target_count(b.text).to(at::kDouble).reshape({1});
    const at::Tensor share = at::full({1}, 1.0 / M, real);
    for (int64_t i = 0; i < M; ++i) {
      const int64_t rows = 8 / M;
      const ensemble::TextBatch micro{b.text.tokens.narrow(0, i * rows, rows), b.text.lengths.narrow(0, i * rows, rows)};
      std::vector<at::Tensor> inputs{micro.tokens};  // each stage's input: tokens, then activations
      for (int64_t s = 0; s + 1 < S; ++s) inputs.push_back(stage_steps[static_cast<size_t>(s)]->forward(inputs.back()).clone());
      at::Tensor grad = last_steps.last(inputs.back(), micro, b.labels.narrow(0, i * rows, rows), share, lm_total).clone();
      for (int64_t s = S - 2; s >= 0; --s) {
        const at::Tensor dx = stage_steps[static_cast<size_t>(s)]->backward(inputs[static_cast<size_t>(s)], grad);
        if (s == 0) {
          EXPECT_FALSE(dx.defined()) << "stage 0 has no input gradient";
        } else {
          ASSERT_TRUE(dx.defined()) << "stage " << s << " returns its input's gradient";
          grad = dx.clone();
        }
      }
    }
    at::Tensor a = tied(*stages.front()), c = tied(*stages.back());
    const at::Tensor sum = a + c;
    a.copy_(sum);
    c.copy_(sum);
    for (auto& optimizer : adams) optimizer->step();
    const Snapshot& expected = reference.parameters[static_cast<size_t>(step)];
    for (auto& stage : stages) {
      for (const auto& [name, value] : snapshot(stage->parameters())) {
        EXPECT_TRUE(all_close(value, expected.at(name), 1e-9)) << name;
      }
    }
    EXPECT_TRUE(all_close(last_steps.classification_loss(), reference.losses[static_cast<size_t>(step)].classification,
                          1e-9));
    EXPECT_TRUE(all_close(last_steps.lm_loss(), reference.losses[static_cast<size_t>(step)].language_model, 1e-9));
  }
  int64_t step_kinds = 0, captured = 0;
  for (auto& st : stage_steps) {
    step_kinds += st->steps();
    captured += st->captured();
  }
  EXPECT_EQ(step_kinds, 2 * (S - 1) + 1) << "a forward and a backward per earlier stage, one step for the last";
  EXPECT_EQ(captured, device.is_cuda() ? 2 * (S - 1) + 1 : 0);
}

class PipelineStageStepsTest : public packtrain::testing::DeviceTest {};

TEST_P(PipelineStageStepsTest, TwoStagesInOneProcessTrainTheSameModel) {
  expect_stages_in_one_process_train_the_same_model(device(), 2);
}

// A middle stage: activations in, activations out, its input's gradient returned.
TEST_P(PipelineStageStepsTest, ThreeStagesWithAMiddleStageInOneProcessTrainTheSameModel) {
  expect_stages_in_one_process_train_the_same_model(device(), 3);
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(PipelineStageStepsTest);

// A pipeline checkpoint whose manifest records no checksums (as manifests did before
// this version) still loads in one process, and a stage file copied over another
// is still refused, by the stage the file records.
TEST(PipelineCheckpoint, AnOldManifestLoadsAndAStageFileCopiedOverAnotherIsRefusedByItsRecord) {
  packtrain::testing::ScopedTempDir dir("packtrain-pipeline-checkpoint");
  const std::filesystem::path manifest = dir.path() / "p.ckpt";
  LabelledTexts train;
  train.source = "synthetic";
  for (int i = 0; i < 8; ++i) {
    train.texts.push_back(i % 2 == 1 ? "yes the cat sat" : "no a dog ran");
    train.labels.push_back(i % 2);
  }
  const std::vector<std::string> errors = run_ranks(2, [&](int64_t, ProcessGroup& group) {
    MultiTaskTrainer trainer(MultiTaskTrainerOptions()
                                 .model(PackedTransformerOptions().width(16).layers(2).heads(2).max_length(16))
                                 .batch_size(4)
                                 .buckets({16})
                                 .pipeline_stages(2)
                                 .log([](const std::string&) {}),
                             &group);
    trainer.set_training_data(train);
    trainer.train_epoch();
    trainer.save(manifest);
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  c10::impl::GenericDict old = load_checkpoint(manifest).toGenericDict();
  old.erase("checksums");
  save_checkpoint(manifest, old);
  std::vector<std::filesystem::path> stages;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().filename().string().rfind("p.ckpt.stage", 0) == 0) stages.push_back(entry.path());
  }
  std::sort(stages.begin(), stages.end());
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_NO_THROW(MultiTaskTrainer::load(manifest, c10::Device(c10::kCPU)));
  std::filesystem::copy_file(stages[0], stages[1], std::filesystem::copy_options::overwrite_existing);
  try {
    MultiTaskTrainer::load(manifest, c10::Device(c10::kCPU));
    ADD_FAILURE() << "a stage file copied over another was loaded";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(stages[1].string() + ": holds stage 0 of 2, but " + manifest.string() +
                                               " names it as stage 1 of 2"));
  }
}

}  // namespace
}  // namespace packtrain::runtime
