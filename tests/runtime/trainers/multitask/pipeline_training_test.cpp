// Pipeline model parallelism on the CPU (placement: distributed/pipeline_placement_test.cpp;
// layer timing: measure/layer_timing_test.cpp): a stage starts where the whole model
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
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/labelled_texts.h"
#include "packtrain/runtime/distributed/pipeline_groups.h"
#include "packtrain/runtime/distributed/pipeline_placement.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/measure/layer_timing.h"
#include "packtrain/runtime/trainers/multitask/multitask_pipeline.h"
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"
#include "packtrain/runtime/trainers/multitask/pipeline_stage_steps.h"
#include "tests/runtime/distributed/pipeline_test_support.h"
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
using pipeline_testing::adam;
using pipeline_testing::model_options;
using pipeline_testing::run_ranks;

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

TEST(PipelineTest, TwoStagesTrainTheSameModelAsOneProcessFloat64) {
  PACKTRAIN_SKIP_WITHOUT_GLOO();
  expect_same_training(model_options(at::kDouble), 2, 4, 1e-9);
}

TEST(PipelineTest, FourStagesTrainTheSameModelAsOneProcessFloat64) {
  PACKTRAIN_SKIP_WITHOUT_GLOO();
  expect_same_training(model_options(at::kDouble), 4, 4, 1e-9);
}

TEST(PipelineTest, FewerMicroBatchesThanStagesFloat64) {
  PACKTRAIN_SKIP_WITHOUT_GLOO();
  expect_same_training(model_options(at::kDouble), 4, 2, 1e-9);
}

// Pipeline x data parallel: 2 stages x 2 replicas (4 ranks), and 2 x 4 with one
// micro-batch each: the one-process step on the whole batch.
TEST(PipelineTest, TwoStagesTimesTwoReplicasTrainTheSameModelAsOneProcessFloat64) {
  PACKTRAIN_SKIP_WITHOUT_GLOO();
  expect_same_training(model_options(at::kDouble), 2, 2, 1e-9, /*replicas=*/2);
}

TEST(PipelineTest, TwoStagesTimesFourReplicasFloat64) {
  PACKTRAIN_SKIP_WITHOUT_GLOO();
  expect_same_training(model_options(at::kDouble), 2, 1, 1e-9, /*replicas=*/4);
}

// Static steps (what a GPU captures; eager here): the forward without autograd, the
// backward recomputing it, the last stage's one step — the same training.
TEST(PipelineTest, StaticStepsTrainTheSameModelAsOneProcessFloat64) {
  PACKTRAIN_SKIP_WITHOUT_GLOO();
  expect_same_training(model_options(at::kDouble), 2, 4, 1e-9, 1, StageExecution::kStatic);
  expect_same_training(model_options(at::kDouble), 4, 2, 1e-9, 1, StageExecution::kStatic);
  expect_same_training(model_options(at::kDouble), 2, 2, 1e-9, 2, StageExecution::kStatic);
  expect_same_training(model_options(at::kDouble).tie_lm_head(false), 2, 2, 1e-9, 1, StageExecution::kStatic);
}

TEST(PipelineTest, UntiedHeadFloat64) {
  PACKTRAIN_SKIP_WITHOUT_GLOO();
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
  PACKTRAIN_SKIP_WITHOUT_GLOO();
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

// A stage that stops (here: returns after one step, closing its group) ends its
// neighbour within the timeout, naming the two stages and the step.
TEST(PipelineTest, AStageThatStopsEndsItsNeighbourNamingStagesAndStep) {
  PACKTRAIN_SKIP_WITHOUT_GLOO();
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
      const ensemble::TextBatch micro{b.text.tokens.narrow(0, i * rows, rows),
                                      b.text.lengths.narrow(0, i * rows, rows)};
      std::vector<at::Tensor> inputs{micro.tokens};  // each stage's input: tokens, then activations
      for (int64_t s = 0; s + 1 < S; ++s)
        inputs.push_back(stage_steps[static_cast<size_t>(s)]->forward(inputs.back()).clone());
      at::Tensor grad =
          last_steps.last(inputs.back(), micro, b.labels.narrow(0, i * rows, rows), share, lm_total).clone();
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
    EXPECT_TRUE(
        all_close(last_steps.classification_loss(), reference.losses[static_cast<size_t>(step)].classification, 1e-9));
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
  ASSERT_EQ(old.erase("checksums"), 1u);
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
