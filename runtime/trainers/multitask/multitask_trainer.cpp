// MultiTaskTrainer: construction (placement of a pipeline's stages), tokenizing into
// length buckets, data-parallel setup and training epochs. Evaluation, decoding and
// checkpoints: multitask_trainer_{evaluation,decoding,checkpoint}.cpp; options:
// multitask_trainer_options.cpp.
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"

#include "multitask_trainer_internal.h"
#include "packtrain/base/user_error.h"
#include "packtrain/graphs/captured_step.h"
#include "packtrain/profiling/nvtx.h"
#include "packtrain/runtime/data/byte_tokenizer.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/text_tokenizer.h"
#include "packtrain/runtime/distributed/pipeline_groups.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/trainers/multitask/multitask_pipeline.h"
#include "packtrain/runtime/trainers/multitask/multitask_steps.h"
#include "packtrain/runtime/trainers/multitask/pretrained_trunk.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>

namespace packtrain::runtime {

namespace {

// One batch of an epoch: a bucket and B rows of it (the last batch of a bucket wraps
// around to its first rows, so every batch has the same static shape), and the LM
// task's own rows where the tasks do not share inputs.
struct PlannedBatch {
  size_t bucket;
  std::vector<int64_t> rows, lm_rows;
};

// An epoch's batches of B rows over buckets of the given sizes, in the order they
// run, drawn from `rng`.
std::vector<PlannedBatch> plan_epoch(const std::vector<int64_t>& bucket_sizes, int64_t B, bool shared_inputs,
                                     std::mt19937_64& rng) {
  std::vector<PlannedBatch> plan;
  const auto order = [&](int64_t n) {
    std::vector<int64_t> p(static_cast<size_t>(n));
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
    return p;
  };
  for (size_t b = 0; b < bucket_sizes.size(); ++b) {
    const int64_t n = bucket_sizes[b];
    const std::vector<int64_t> p = order(n);
    const std::vector<int64_t> q = shared_inputs ? std::vector<int64_t>{} : order(n);
    for (int64_t first = 0; first < n; first += B) {
      PlannedBatch batch{b, {}, {}};
      for (int64_t i = 0; i < B; ++i) {
        batch.rows.push_back(p[static_cast<size_t>((first + i) % n)]);
        if (!q.empty()) batch.lm_rows.push_back(q[static_cast<size_t>((first + i) % n)]);
      }
      plan.push_back(std::move(batch));
    }
  }
  std::shuffle(plan.begin(), plan.end(), rng);
  return plan;
}

// Each bucket's row table (batches, share) in the order its batches run: rows
// [first_row, first_row + share) of each batch's rows (or LM rows), from pinned
// memory on a GPU so the copy does not stop the host.
std::vector<at::Tensor> row_tables(const std::vector<PlannedBatch>& plan, size_t buckets, bool lm, int64_t first_row,
                                   int64_t share, bool pinned) {
  std::vector<std::vector<int64_t>> per_bucket(buckets);
  for (const PlannedBatch& batch : plan) {
    const std::vector<int64_t>& from = lm ? batch.lm_rows : batch.rows;
    std::vector<int64_t>& to = per_bucket[batch.bucket];
    to.insert(to.end(), from.begin() + first_row, from.begin() + first_row + share);
  }
  std::vector<at::Tensor> out;
  for (const std::vector<int64_t>& r : per_bucket) {
    at::Tensor table = at::tensor(r, at::kLong).view({-1, share});
    out.push_back(pinned ? table.pin_memory() : table);
  }
  return out;
}

// An epoch's report: the means over its steps of the per-member loss sums (K).
MultiTaskEpochReport epoch_report(int64_t epoch, int64_t steps, const at::Tensor& classification_sum,
                                  const at::Tensor& lm_sum) {
  MultiTaskEpochReport report;
  report.epoch = epoch;
  report.steps = steps;
  const double divisor = static_cast<double>(std::max<int64_t>(steps, 1));
  report.classification_loss = classification_sum.mean().item<double>() / divisor;
  report.lm_loss = lm_sum.mean().item<double>() / divisor;
  return report;
}

}  // namespace

MultiTaskTrainer::MultiTaskTrainer(MultiTaskTrainerOptions options, distributed::ProcessGroup* pipeline)
    : options_(with_trunk_shape(std::move(options))), device_(options_.model().device()) {
  options_.validate();
  // A trunk's tokenizer ids are checked against its config's vocabulary as they are read.
  tokenizer_ = options_.trunk().empty()
                   ? make_byte_text_tokenizer()
                   : make_checkpoint_text_tokenizer(
                         options_.trunk(), options_.model().vocab(),
                         options_.model().rms_norm() ? TokenizerFamily::kSentencePiece : TokenizerFamily::kGpt2);
  if (!options_.trunk().empty()) trunk_record_ = trunk_record_json(options_.trunk());
  if (tokenizer_->vocab() > options_.model().vocab()) {
    throw DataError(fmt::format("the tokenizer in '{}' has {} tokens, more than the model's vocabulary of {}",
                                options_.trunk(), tokenizer_->vocab(), options_.model().vocab()));
  }
  if (!options_.log()) options_.log(graphs::log_to_stderr);  // never silent, as in graphs/
  // "cuda" means the first device: graph caches and pools compare devices with their index.
  if (device_.is_cuda() && device_.index() < 0) {
    device_ = c10::Device(c10::kCUDA, 0);
    options_.model(ensemble::PackedTransformerOptions(options_.model()).device(device_));
  }
  ensemble::PackedTransformerOptions model_options = options_.model();
  model_options.seed(options_.seed()).device(device_);
  ensemble::TransformerStage stage;
  if (options_.pipeline_stages() > 1) {
    const int64_t S = options_.pipeline_stages();
    if (pipeline == nullptr) {
      throw DataError(
          fmt::format("{} pipeline stages need a group of {} ranks (one per stage: packtrain launch "
                      "--nproc {} -- multitask train --pipeline-stages {}); this process is not in one",
                      S, S, S, S));
    }
    // Checked before the subgroups are set up: every rank fails alike, none waits.
    const int64_t R = pipeline->world_size() / std::max<int64_t>(S, 1), B = options_.batch_size();
    if (pipeline->world_size() % S == 0 && B % (R * options_.micro_batches()) != 0) {
      throw DataError(
          fmt::format("the batch of {} sentences does not split into {} replica(s) x {} micro-batches of "
                      "equal size: run {} x R ranks with R dividing {} (or train with a --batch that is "
                      "a multiple of {})",
                      B, R, options_.micro_batches(), S, B / options_.micro_batches(), R * options_.micro_batches()));
    }
    pipeline_groups_ = std::make_unique<distributed::PipelineGroups>(distributed::split_pipeline_groups(*pipeline, S));
    placement_ = place_stages(model_options, *pipeline, B / (R * options_.micro_batches()));
    stage = placement_[static_cast<size_t>(pipeline_groups_->stage)].blocks;
    pipeline_group_ = pipeline_groups_->pipeline;
    replicas_group_ = pipeline_groups_->stage_replicas;
  }
  model_ = std::make_unique<ensemble::PackedTransformer>(model_options, stage);
  model_->set_precision(options_.precision());
  if (!options_.trunk().empty()) load_pretrained_weights(options_.trunk(), *model_);  // every member's trunk
  optimizer_ = std::make_unique<ensemble::PackedAdam>(
      model_->parameters(), ensemble::adamw_options().lr(options_.lr()).weight_decay(options_.weight_decay()));
  if (!options_.member_lrs().empty()) {
    optimizer_->set_lr(at::tensor(options_.member_lrs(), at::kDouble).to(device_));
  }
  if (options_.warmup_steps() > 0) {
    optimizer_->set_schedule(
        ensemble::LrSchedule().kind(ensemble::LrScheduleKind::kLinearWarmup).warmup_steps(options_.warmup_steps()));
  }
  // Only a balanced run weights its rows: otherwise no tensor, and the loss is the plain mean.
  if (options_.balance_classes()) {
    class_weights_ = at::ones({options_.model().classes()}, model_->parameters().flat().options());
  }
  const ensemble::TaskWeights weights{options_.classification_weight(), options_.lm_weight(), class_weights_};
  steps_ = std::make_unique<MultiTaskSteps>(
      *model_, *optimizer_,
      MultiTaskStepsOptions()
          .weights(weights)
          .shared_inputs(options_.shared_inputs())
          .eval_batch_size(options_.eval_batch_size())
          .capture(graphs::CaptureOptions().capture(options_.capture()).log(options_.log()))
          .capacity(8));
  if (pipeline_group_ != nullptr) {
    // On a GPU each stage's micro-batch steps are captured (static steps; the backward
    // recomputes the stage's forward); the CPU keeps the forward's autograd graph.
    pipeline_ = std::make_unique<MultiTaskPipeline>(
        *model_, *optimizer_, *pipeline_group_, options_.micro_batches(), weights, replicas_group_,
        device_.is_cuda() ? StageExecution::kStatic : StageExecution::kAutograd,
        graphs::CaptureOptions().capture(options_.capture()).log(options_.log()));
  }
  if (replicas_group_ != nullptr) {  // every replica of a stage starts from replica 0's weights
    at::Tensor flat = model_->parameters().flat();
    replicas_group_->broadcast_(flat, 0, "initial-weights broadcast");
  }
}

int64_t MultiTaskTrainer::pipeline_replicas() const {
  return pipeline_groups_ != nullptr ? pipeline_groups_->replicas : 1;
}

MultiTaskTrainer::~MultiTaskTrainer() = default;

std::vector<distributed::StagePlacement> MultiTaskTrainer::place_stages(const ensemble::PackedTransformerOptions& model,
                                                                        distributed::ProcessGroup& run, int64_t rows) {
  const int64_t S = options_.pipeline_stages(), tokens = options_.buckets().back();
  std::vector<distributed::StagePlacement> placement;
  if (!options_.pipeline_boundaries().empty()) {
    placement = distributed::place_pipeline_at(model, options_.pipeline_boundaries(), rows, tokens);
  } else if (options_.pipeline_balance() == distributed::PlacementBalance::kTime) {
    // Measured once, on rank 0: every rank must place the blocks alike. A failed
    // measurement is sent as NaN, so every rank stops with its reason, none waits.
    at::Tensor seconds = at::full({5}, std::numeric_limits<double>::quiet_NaN(), at::kDouble);
    std::string failure;
    if (run.rank() == 0) {
      try {
        if (!options_.layer_timer()) {
          throw std::invalid_argument(
              "pipeline balance 'time' needs MultiTaskTrainerOptions::layer_timer "
              "(runtime/measure/layer_timing.h: measure_layer_times)");
        }
        const distributed::LayerTimes t = options_.layer_timer()(model, rows, tokens);
        seconds = at::tensor({t.embedding, t.block, t.heads, t.embedding_forward, t.block_forward}, at::kDouble);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    run.broadcast_(seconds, 0, "layer-time broadcast");
    const auto value = [&](int64_t i) { return seconds[i].item<double>(); };
    if (std::isnan(value(0))) {
      throw DataError("--pipeline-balance time: rank 0 could not time the layers" +
                      (failure.empty() ? std::string(" (see its error)") : ": " + failure));
    }
    const distributed::LayerTimes t{value(0), value(1), value(2), value(3), value(4)};
    // A GPU runs static stage steps, whose backward recomputes the forward (as built below).
    placement = distributed::place_pipeline_by_time(model, S, rows, tokens, t, /*recompute=*/device_.is_cuda());
  } else {
    placement = distributed::place_pipeline(model, S, rows, tokens);
  }
  options_.pipeline_boundaries(distributed::stage_boundaries(placement));
  return placement;
}

std::vector<MultiTaskTrainer::Bucket> MultiTaskTrainer::tokenize(const LabelledTexts& data, int64_t* truncated) const {
  const TextTokenizer& tokenizer = *tokenizer_;
  const std::vector<int64_t>& lengths = options_.buckets();
  std::vector<std::vector<std::vector<int64_t>>> sequences(lengths.size());
  std::vector<std::vector<int64_t>> labels(lengths.size()), index(lengths.size());
  *truncated = 0;
  for (size_t i = 0; i < data.texts.size(); ++i) {
    bool cut = false;
    std::vector<int64_t> ids = tokenizer.encode(data.texts[i], lengths.back(), &cut);
    *truncated += cut ? 1 : 0;
    const auto b = static_cast<size_t>(
        std::lower_bound(lengths.begin(), lengths.end(), static_cast<int64_t>(ids.size())) - lengths.begin());
    if (data.labels[i] < 0 || data.labels[i] >= options_.model().classes()) {
      throw DataError(fmt::format("{}: example {} has label {}, the model has {} classes", data.source, i + 1,
                                  data.labels[i], options_.model().classes()));
    }
    sequences[b].push_back(std::move(ids));
    labels[b].push_back(data.labels[i]);
    index[b].push_back(static_cast<int64_t>(i));
  }
  std::vector<Bucket> out;
  for (size_t b = 0; b < lengths.size(); ++b) {
    if (sequences[b].empty()) continue;
    const PaddedTokens padded = pad_sequences(sequences[b], lengths[b], tokenizer.pad());
    out.push_back({lengths[b], padded.tokens.to(device_), padded.lengths.to(device_),
                   at::tensor(labels[b], at::kLong).to(device_), index[b]});
  }
  return out;
}

int64_t MultiTaskTrainer::set_training_data(const LabelledTexts& train) {
  int64_t truncated = 0;
  train_buckets_ = tokenize(train, &truncated);
  training_examples_ = static_cast<int64_t>(train.size());
  if (options_.balance_classes()) {
    // N / (C n_c): the weights average 1 over the training rows; an absent class keeps 1.
    const int64_t C = options_.model().classes();
    std::vector<double> counts(static_cast<size_t>(C), 0.0), weights(static_cast<size_t>(C), 1.0);
    for (const int64_t label : train.labels) counts.at(static_cast<size_t>(label)) += 1;
    for (int64_t c = 0; c < C; ++c) {
      const double n = counts[static_cast<size_t>(c)];
      if (n > 0) weights[static_cast<size_t>(c)] = static_cast<double>(train.size()) / (static_cast<double>(C) * n);
    }
    at::NoGradGuard no_grad;
    class_weights_.copy_(at::tensor(weights, at::kDouble));
  }
  if (pipeline_) return truncated;  // the pipeline gathers each batch's rows itself
  std::vector<MultiTaskSteps::TrainingBucket> data;
  for (const Bucket& b : train_buckets_) data.push_back({b.tokens, b.lengths, b.labels});
  steps_->set_training_data(data);
  return truncated;
}

int64_t MultiTaskTrainer::steps_per_epoch() const {
  int64_t steps = 0;
  for (const Bucket& b : train_buckets_) steps += (b.size() + options_.batch_size() - 1) / options_.batch_size();
  return steps;
}

size_t MultiTaskTrainer::training_graphs() const { return steps_->training_graphs(); }
size_t MultiTaskTrainer::evaluation_graphs() const { return steps_->evaluation_graphs(); }

void MultiTaskTrainer::set_process_group(distributed::ProcessGroup* group) {
  if (group == nullptr) {
    group_ = nullptr;
    steps_->set_gradient_hook({});
    return;
  }
  if (pipeline_) {
    throw DataError(
        "a pipeline run is data parallel through its own group (ranks = stages x replicas, given to the "
        "trainer): it takes no other");
  }
  if (device_.is_cuda() && group->device() != device_) {
    throw DataError(
        fmt::format("data-parallel training on {} needs the process group joined on that device (its "
                    "gradients go over NCCL there); it was joined on {}",
                    device_.str(), group->device().str()));
  }
  if (options_.batch_size() % group->world_size() != 0) {
    throw DataError(fmt::format("the global batch {} does not split into {} equal per-rank batches",
                                options_.batch_size(), group->world_size()));
  }
  group_ = group;
  steps_->set_gradient_hook([this] {
    at::Tensor gradients = model_->parameters().flat_grad();
    group_->all_reduce_mean_(gradients, "gradient all-reduce", steps_done_ + 1);
  });
  at::Tensor flat = model_->parameters().flat();
  group_->broadcast_(flat, 0, "initial-weights broadcast");
}

MultiTaskEpochReport MultiTaskTrainer::train_epoch() {
  if (train_buckets_.empty()) throw std::logic_error("train_epoch: no training data (call set_training_data)");
  if (options_.patience() > 0 && validation_.texts.empty()) {  // refused before the epoch, not after it
    throw UserError(
        fmt::format("early stopping (patience={}) watches the members' loss on validation sentences: none were given "
                    "(set_validation_data; the CLI's --dev, Python's fit(validation=...))",
                    options_.patience()));
  }
  MultiTaskEpochReport report = run_epoch();
  watch_validation(report);
  return report;
}

MultiTaskEpochReport MultiTaskTrainer::run_epoch() {
  PACKTRAIN_NVTX_RANGE("epoch");
  const auto start = std::chrono::steady_clock::now();
  // The order depends on the seed and the epoch only, so a run resumed from a
  // checkpoint at an epoch boundary continues with the same batches.
  std::mt19937_64 rng(options_.seed() * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epochs_done_) + 1);
  const int64_t B = options_.batch_size();
  std::vector<int64_t> bucket_sizes;
  for (const Bucket& b : train_buckets_) bucket_sizes.push_back(b.size());
  std::vector<PlannedBatch> plan = plan_epoch(bucket_sizes, B, options_.shared_inputs(), rng);
  if (pipeline_) {
    std::vector<std::pair<size_t, std::vector<int64_t>>> batches;
    for (PlannedBatch& batch : plan) batches.emplace_back(batch.bucket, std::move(batch.rows));
    MultiTaskEpochReport report = train_pipelined(batches);
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return report;
  }

  const graphs::PoolStreamScope on_trainer_stream(*steps_->pool());  // off the default stream (CUDA)
  // The steps gather each batch's rows inside their graphs from one row table per
  // bucket, copied once per epoch. Data parallel: this rank's equal share of every
  // global batch.
  const int64_t world = group_ != nullptr ? group_->world_size() : 1;
  const int64_t share = B / world, first_row = group_ != nullptr ? group_->rank() * share : 0;
  const size_t buckets = train_buckets_.size();
  steps_->start_epoch(row_tables(plan, buckets, /*lm=*/false, first_row, share, device_.is_cuda()),
                      options_.shared_inputs()
                          ? std::vector<at::Tensor>{}
                          : row_tables(plan, buckets, /*lm=*/true, first_row, share, device_.is_cuda()));
  for (const PlannedBatch& batch : plan) {
    steps_->train_step(batch.bucket);
    // Data parallel on CUDA: the step's all-reduce (in its graph) gets the group's deadline.
    if (group_ != nullptr) group_->watch_device("gradient all-reduce", steps_done_ + 1, steps_done_ + 1);
    ++steps_done_;
  }
  if (group_ != nullptr) {
    // In place: the handles share the steps' accumulators.
    at::Tensor classification_sum = steps_->classification_loss_sum(), lm_sum = steps_->lm_loss_sum();
    group_->all_reduce_mean_(classification_sum, "training-loss all-reduce", steps_done_);
    group_->all_reduce_mean_(lm_sum, "training-loss all-reduce", steps_done_);
    group_->wait_device("training-loss all-reduce");  // CUDA: before the reads below
    if (group_->world_size() > 1) {
      group_->check_same(model_->parameters().flat(), "parameters",
                         fmt::format("after step {} (epoch {})", steps_done_, epochs_done_ + 1));
    }
  }
  ++epochs_done_;
  MultiTaskEpochReport report = epoch_report(epochs_done_, static_cast<int64_t>(plan.size()),
                                             steps_->classification_loss_sum(), steps_->lm_loss_sum());
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

MultiTaskEpochReport MultiTaskTrainer::train_pipelined(
    const std::vector<std::pair<size_t, std::vector<int64_t>>>& plan) {
  const int64_t K = model_->members();
  // Per-member loss sums (K) of each task, complete on the last stage.
  at::Tensor sums = at::zeros({2, K}, at::TensorOptions().dtype(at::kDouble).device(device_));
  for (const auto& [bucket, rows] : plan) {
    const Bucket& b = train_buckets_[bucket];
    at::Tensor index = at::tensor(rows, at::kLong);  // pinned on a GPU: the copy does not stop the host
    index = device_.is_cuda() ? index.pin_memory().to(device_, /*non_blocking=*/true) : index;
    const ensemble::TextBatch batch{b.tokens.index_select(0, index), b.lengths.index_select(0, index)};
    const ensemble::MultiTaskLosses losses =
        pipeline_->train_step(batch, b.labels.index_select(0, index), steps_done_ + 1);
    if (losses.classification.defined()) {
      sums[0].add_(losses.classification.to(at::kDouble));
      sums[1].add_(losses.language_model.to(at::kDouble));
    }
    ++steps_done_;
  }
  pipeline_group_->broadcast_(sums, pipeline_group_->world_size() - 1, "training-loss broadcast");
  if (replicas_group_ != nullptr) {
    replicas_group_->wait_device("gradient all-reduce");
    replicas_group_->check_same(model_->parameters().flat(), "parameters of a stage's replicas",
                                fmt::format("after step {} (epoch {})", steps_done_, epochs_done_ + 1));
  }
  ++epochs_done_;
  return epoch_report(epochs_done_, static_cast<int64_t>(plan.size()), sums[0], sums[1]);
}

}  // namespace packtrain::runtime
