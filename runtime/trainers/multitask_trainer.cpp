#include "packtrain/runtime/trainers/multitask_trainer.h"

#include "packtrain/base/user_error.h"
#include "packtrain/graphs/captured_step.h"
#include "packtrain/profiling/nvtx.h"
#include "packtrain/runtime/data/byte_tokenizer.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/distributed/pipeline_groups.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/trainers/multitask_pipeline.h"
#include "packtrain/runtime/trainers/multitask_steps.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>

namespace packtrain::runtime {

namespace {

constexpr const char* kMultiTaskFormat = "packtrain-multitask-1";
constexpr const char* kPipelineManifestFormat = "packtrain-multitask-pipeline-manifest-1";

// The confusion matrix (C, C) of (truth, predicted), the LM's negative log-likelihood
// sums (K) and target tokens, as the metrics a user reads.
TaskMetrics task_metrics(const at::Tensor& confusion_counts, const at::Tensor& lm_nll_sum, int64_t tokens) {
  const at::Tensor confusion = confusion_counts.to(at::kCPU, at::kDouble);
  const double total = confusion.sum().item<double>();
  const double correct = confusion.trace().item<double>();
  const at::Tensor truth = confusion.sum(1), predicted = confusion.sum(0);
  // Matthews correlation for any number of classes (Gorodkin's R_K); 0 when undefined.
  const double covariance = correct * total - (truth * predicted).sum().item<double>();
  const double spread = (total * total - (predicted * predicted).sum().item<double>()) *
                        (total * total - (truth * truth).sum().item<double>());
  TaskMetrics m;
  m.examples = static_cast<int64_t>(total);
  m.accuracy = total > 0 ? correct / total : 0;
  m.mcc = spread > 0 ? covariance / std::sqrt(spread) : 0;
  m.tokens = tokens;
  m.lm_loss = m.tokens > 0 ? (lm_nll_sum.mean().item<double>() / static_cast<double>(m.tokens)) : 0;
  m.perplexity = std::exp(m.lm_loss);
  return m;
}

std::string dtype_name(c10::ScalarType t) { return t == at::kDouble ? "float64" : "float32"; }

// Whether a JSON value may stand where the defaults hold `like`: any number for a
// fractional default, a whole number for a whole one, an array of whole numbers for
// an array (the buckets), otherwise the same JSON type.
bool same_kind(const nlohmann::json& value, const nlohmann::json& like) {
  if (like.is_number_float()) return value.is_number();
  if (like.is_number_integer()) return value.is_number_integer();
  if (like.is_array()) {
    return value.is_array() &&
           std::all_of(value.begin(), value.end(), [](const nlohmann::json& v) { return v.is_number_integer(); });
  }
  return value.type() == like.type();
}

}  // namespace

struct MultiTaskTrainer::Bucket {
  int64_t length = 0;
  at::Tensor tokens, lengths, labels;  // (N, length), (N), (N) int64 on the device
  std::vector<int64_t> index;          // row i is example index[i] of the source
  int64_t size() const { return static_cast<int64_t>(index.size()); }
};

// The captured decode step and the buffers it reads and writes, kept across
// generate() calls: one per decoding kind (greedy, or sampled with a given top-k;
// captured or not), so a later call replays its graph at once — the prompt, the
// temperature and the noise are written into the buffers, never into the graph.
struct MultiTaskTrainer::DecodeSession {
  bool sampled = false;
  ensemble::KvCache cache;
  at::Tensor token, position, step_index;  // (K, 1), (1), (1) int64
  at::Tensor generated;                    // (max_length, K) int64: the tokens drawn
  at::Tensor noise, temperature;           // sampled: (max_length, K, V) Gumbel noise, () temperature
  std::unique_ptr<graphs::CapturedStep> step;
};

void MultiTaskTrainerOptions::validate() const {
  model().validate();  // "transformer: <field> must be ..., got <value>"
  TORCH_CHECK(batch_size() > 0, "batch_size must be positive, got batch_size=", batch_size());
  TORCH_CHECK(eval_batch_size() > 0, "eval_batch_size must be positive, got eval_batch_size=", eval_batch_size());
  TORCH_CHECK(!buckets().empty(), "buckets must name at least one padded length, got buckets=[]");
  for (size_t i = 0; i < buckets().size(); ++i) {
    TORCH_CHECK(buckets()[i] >= 3, "bucket lengths must be >= 3 (BOS, a token, EOS), got buckets[", i,
                "]=", buckets()[i]);
    TORCH_CHECK(i == 0 || buckets()[i] > buckets()[i - 1], "bucket lengths must be strictly ascending, got buckets[",
                i - 1, "]=", buckets()[i - 1], " then buckets[", i, "]=", buckets()[i]);
  }
  TORCH_CHECK(buckets().back() <= model().max_length(), "the longest bucket (buckets[", buckets().size() - 1,
              "]=", buckets().back(), ") exceeds the model's max_length (model.max_length=", model().max_length(),
              ")");
  TORCH_CHECK(lr() >= 0, "lr must be >= 0, got lr=", lr());
  TORCH_CHECK(std::isfinite(lr()), "lr must be finite, got lr=", lr());
  TORCH_CHECK(weight_decay() >= 0, "weight_decay must be >= 0, got weight_decay=", weight_decay());
  TORCH_CHECK(std::isfinite(weight_decay()), "weight_decay must be finite, got weight_decay=", weight_decay());
  TORCH_CHECK(warmup_steps() >= 0, "warmup_steps must be >= 0, got warmup_steps=", warmup_steps());
  TORCH_CHECK(pipeline_stages() >= 1, "pipeline_stages must be >= 1, got pipeline_stages=", pipeline_stages());
  TORCH_CHECK(pipeline_stages() <= model().layers(), "pipeline_stages=", pipeline_stages(),
              " exceeds the model's blocks (model.layers=", model().layers(), "): each stage holds at least one");
  TORCH_CHECK(micro_batches() >= 1 && batch_size() % micro_batches() == 0, "micro_batches must divide batch_size=",
              batch_size(), ", got micro_batches=", micro_batches());
  TORCH_CHECK(pipeline_boundaries().empty() ||
                  static_cast<int64_t>(pipeline_boundaries().size()) == pipeline_stages() - 1,
              "pipeline_boundaries holds stages 1..S-1's first blocks: ", pipeline_stages() - 1, " of them for ",
              pipeline_stages(), " stages, got ", pipeline_boundaries().size());
  for (size_t i = 0; i < pipeline_boundaries().size(); ++i) {
    const int64_t b = pipeline_boundaries()[i];
    TORCH_CHECK(b >= 1 && b < model().layers() && (i == 0 || b > pipeline_boundaries()[i - 1]),
                "pipeline_boundaries must be strictly ascending blocks in [1, model.layers=", model().layers(),
                "), got pipeline_boundaries[", i, "]=", b);
  }
  TORCH_CHECK(pipeline_stages() == 1 || shared_inputs(),
              "a pipeline run reads the same sentences for both tasks (shared_inputs=true)");
  TORCH_CHECK(classification_weight() >= 0 && lm_weight() >= 0 && classification_weight() + lm_weight() > 0,
              "task weights must be >= 0 and not both 0, got classification_weight=", classification_weight(),
              ", lm_weight=", lm_weight());
}

std::string to_json(const MultiTaskTrainerOptions& o) {
  const auto& m = o.model();
  nlohmann::json j = {
      {"members", m.members()}, {"vocab", m.vocab()}, {"width", m.width()}, {"layers", m.layers()},
      {"heads", m.heads()}, {"mlp_ratio", m.mlp_ratio()}, {"max_length", m.max_length()},
      {"classes", m.classes()}, {"tie_lm_head", m.tie_lm_head()}, {"dtype", dtype_name(m.dtype())},
      {"batch_size", o.batch_size()}, {"buckets", o.buckets()}, {"lr", o.lr()}, {"weight_decay", o.weight_decay()},
      {"warmup_steps", o.warmup_steps()}, {"classification_weight", o.classification_weight()},
      {"lm_weight", o.lm_weight()}, {"balance_classes", o.balance_classes()}, {"shared_inputs", o.shared_inputs()},
      {"eval_batch_size", o.eval_batch_size()},
      {"seed", o.seed()}, {"capture", o.capture()}, {"pipeline_stages", o.pipeline_stages()},
      {"micro_batches", o.micro_batches()},
      {"pipeline_balance", distributed::kPlacementBalanceNames.name(o.pipeline_balance())},
      {"pipeline_boundaries", o.pipeline_boundaries()}};
  return j.dump();
}

MultiTaskTrainerOptions multitask_options_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TORCH_CHECK(j.is_object(), "multi-task options: not a JSON object");
  // The defaults' keys and values, each replaced by the given value where there is one.
  nlohmann::json merged = nlohmann::json::parse(to_json(MultiTaskTrainerOptions()));
  for (const auto& [key, value] : j.items()) {
    TORCH_CHECK(merged.contains(key), "multi-task options: unknown key '", key, "'");
    TORCH_CHECK(same_kind(value, merged.at(key)), "multi-task options: key '", key, "' has the wrong type: ",
                value.dump(), " (its default is ", merged.at(key).dump(), ")");
    merged[key] = value;
  }
  TORCH_CHECK(merged.at("seed").is_number_unsigned(), "multi-task options: seed must be >= 0, got seed=",
              merged.at("seed").dump());
  const std::string dtype = merged.at("dtype").get<std::string>();
  TORCH_CHECK(dtype == "float32" || dtype == "float64",
              "multi-task options: dtype must be float32 or float64, got dtype=", dtype);
  const auto i64 = [&](const char* key) { return merged.at(key).get<int64_t>(); };
  const auto f64 = [&](const char* key) { return merged.at(key).get<double>(); };
  const auto flag = [&](const char* key) { return merged.at(key).get<bool>(); };
  MultiTaskTrainerOptions o;
  o.model(ensemble::PackedTransformerOptions()
              .members(i64("members"))
              .vocab(i64("vocab"))
              .width(i64("width"))
              .layers(i64("layers"))
              .heads(i64("heads"))
              .mlp_ratio(i64("mlp_ratio"))
              .max_length(i64("max_length"))
              .classes(i64("classes"))
              .tie_lm_head(flag("tie_lm_head"))
              .dtype(dtype == "float64" ? at::kDouble : at::kFloat));
  o.batch_size(i64("batch_size")).buckets(merged.at("buckets").get<std::vector<int64_t>>());
  o.lr(f64("lr")).weight_decay(f64("weight_decay")).warmup_steps(i64("warmup_steps"));
  o.classification_weight(f64("classification_weight")).lm_weight(f64("lm_weight"));
  o.balance_classes(flag("balance_classes"));
  o.shared_inputs(flag("shared_inputs")).eval_batch_size(i64("eval_batch_size"));
  o.seed(merged.at("seed").get<uint64_t>()).capture(flag("capture"));
  o.pipeline_stages(i64("pipeline_stages")).micro_batches(i64("micro_batches"));
  o.pipeline_balance(distributed::kPlacementBalanceNames.parse(merged.at("pipeline_balance").get<std::string>()));
  o.pipeline_boundaries(merged.at("pipeline_boundaries").get<std::vector<int64_t>>());
  o.validate();
  return o;
}

MultiTaskTrainer::MultiTaskTrainer(MultiTaskTrainerOptions options, distributed::ProcessGroup* pipeline)
    : options_(std::move(options)), device_(options_.model().device()) {
  options_.validate();
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
      throw DataError(fmt::format("{} pipeline stages need a group of {} ranks (one per stage: packtrain launch "
                                  "--nproc {} -- multitask train --pipeline-stages {}); this process is not in one",
                                  S, S, S, S));
    }
    // Checked before the subgroups are set up: every rank fails alike, none waits.
    const int64_t R = pipeline->world_size() / std::max<int64_t>(S, 1), B = options_.batch_size();
    if (pipeline->world_size() % S == 0 && B % (R * options_.micro_batches()) != 0) {
      throw DataError(fmt::format("the batch of {} sentences does not split into {} replica(s) x {} micro-batches of "
                                  "equal size: run {} x R ranks with R dividing {} (or train with a --batch that is "
                                  "a multiple of {})",
                                  B, R, options_.micro_batches(), S, B / options_.micro_batches(),
                                  R * options_.micro_batches()));
    }
    pipeline_groups_ = std::make_unique<distributed::PipelineGroups>(distributed::split_pipeline_groups(*pipeline, S));
    placement_ = place_stages(model_options, *pipeline, B / (R * options_.micro_batches()));
    stage = placement_[static_cast<size_t>(pipeline_groups_->stage)].blocks;
    pipeline_group_ = pipeline_groups_->pipeline;
    replicas_group_ = pipeline_groups_->stage_replicas;
  }
  model_ = std::make_unique<ensemble::PackedTransformer>(model_options, stage);
  optimizer_ = std::make_unique<ensemble::PackedAdam>(
      model_->parameters(), ensemble::adamw_options().lr(options_.lr()).weight_decay(options_.weight_decay()));
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

std::vector<distributed::StagePlacement> MultiTaskTrainer::place_stages(
    const ensemble::PackedTransformerOptions& model, distributed::ProcessGroup& run, int64_t rows) {
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

std::vector<MultiTaskTrainer::Bucket> MultiTaskTrainer::tokenize(const LabelledTexts& data,
                                                                  int64_t* truncated) const {
  const ByteTokenizer tokenizer;
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
    const PaddedTokens padded = pad_sequences(sequences[b], lengths[b]);
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
    throw DataError("a pipeline run is data parallel through its own group (ranks = stages x replicas, given to the "
                    "trainer): it takes no other");
  }
  if (device_.is_cuda() && group->device() != device_) {
    throw DataError(fmt::format("data-parallel training on {} needs the process group joined on that device (its "
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
  PACKTRAIN_NVTX_RANGE("epoch");
  const auto start = std::chrono::steady_clock::now();
  // The order depends on the seed and the epoch only, so a run resumed from a
  // checkpoint at an epoch boundary continues with the same batches.
  std::mt19937_64 rng(options_.seed() * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epochs_done_) + 1);
  const int64_t B = options_.batch_size();
  // One batch: a bucket and B rows of it (the last batch of a bucket wraps around to
  // its first rows, so every batch has the same static shape).
  struct Plan {
    size_t bucket;
    std::vector<int64_t> rows, lm_rows;
  };
  std::vector<Plan> plan;
  const auto order = [&](int64_t n) {
    std::vector<int64_t> p(static_cast<size_t>(n));
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
    return p;
  };
  for (size_t b = 0; b < train_buckets_.size(); ++b) {
    const int64_t n = train_buckets_[b].size();
    const std::vector<int64_t> p = order(n);
    const std::vector<int64_t> q = options_.shared_inputs() ? std::vector<int64_t>{} : order(n);
    for (int64_t first = 0; first < n; first += B) {
      Plan batch{b, {}, {}};
      for (int64_t i = 0; i < B; ++i) {
        batch.rows.push_back(p[static_cast<size_t>((first + i) % n)]);
        if (!q.empty()) batch.lm_rows.push_back(q[static_cast<size_t>((first + i) % n)]);
      }
      plan.push_back(std::move(batch));
    }
  }
  std::shuffle(plan.begin(), plan.end(), rng);
  if (pipeline_) {
    std::vector<std::pair<size_t, std::vector<int64_t>>> batches;
    for (Plan& batch : plan) batches.emplace_back(batch.bucket, std::move(batch.rows));
    MultiTaskEpochReport report = train_pipelined(batches);
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return report;
  }

  const graphs::PoolStreamScope on_trainer_stream(*steps_->pool());  // off the default stream (CUDA)
  // Each bucket's row table, in the order its batches run: one copy per bucket per
  // epoch (the steps gather the rows inside their graphs), from pinned memory on a
  // GPU so the copy does not stop the host. Data parallel: this rank's equal share of
  // every global batch.
  const int64_t world = group_ != nullptr ? group_->world_size() : 1;
  const int64_t share = B / world, first_row = group_ != nullptr ? group_->rank() * share : 0;
  std::vector<std::vector<int64_t>> rows(train_buckets_.size()), lm_rows(train_buckets_.size());
  for (const Plan& batch : plan) {
    const auto take = [&](const std::vector<int64_t>& from, std::vector<int64_t>& to) {
      to.insert(to.end(), from.begin() + first_row, from.begin() + first_row + share);
    };
    take(batch.rows, rows[batch.bucket]);
    if (!options_.shared_inputs()) take(batch.lm_rows, lm_rows[batch.bucket]);
  }
  const auto tables = [&](const std::vector<std::vector<int64_t>>& per_bucket) {
    std::vector<at::Tensor> out;
    for (const std::vector<int64_t>& r : per_bucket) {
      at::Tensor table = at::tensor(r, at::kLong).view({-1, share});
      out.push_back(device_.is_cuda() ? table.pin_memory() : table);
    }
    return out;
  };
  steps_->start_epoch(tables(rows), options_.shared_inputs() ? std::vector<at::Tensor>{} : tables(lm_rows));
  for (const Plan& batch : plan) {
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
  MultiTaskEpochReport report;
  report.epoch = epochs_done_;
  report.steps = static_cast<int64_t>(plan.size());
  const double steps = static_cast<double>(std::max<int64_t>(report.steps, 1));
  report.classification_loss = steps_->classification_loss_sum().mean().item<double>() / steps;
  report.lm_loss = steps_->lm_loss_sum().mean().item<double>() / steps;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

TaskMetrics MultiTaskTrainer::evaluate(const LabelledTexts& data) {
  int64_t truncated = 0;
  const std::vector<Bucket> buckets = tokenize(data, &truncated);
  if (pipeline_) return evaluate_pipelined(buckets);
  const graphs::PoolStreamScope on_trainer_stream(*steps_->pool());
  steps_->start_evaluation();
  for (const Bucket& b : buckets) steps_->evaluate(b.tokens, b.lengths, b.labels);
  return task_metrics(steps_->confusion(), steps_->lm_nll_sum(), steps_->lm_tokens().item<int64_t>());
}

MultiTaskEpochReport MultiTaskTrainer::train_pipelined(const std::vector<std::pair<size_t, std::vector<int64_t>>>& plan) {
  const int64_t K = model_->members();
  // Per-member loss sums (K) of each task, complete on the last stage.
  at::Tensor sums = at::zeros({2, K}, at::TensorOptions().dtype(at::kDouble).device(device_));
  for (const auto& [bucket, rows] : plan) {
    const Bucket& b = train_buckets_[bucket];
    at::Tensor index = at::tensor(rows, at::kLong);  // pinned on a GPU: the copy does not stop the host
    index = device_.is_cuda() ? index.pin_memory().to(device_, /*non_blocking=*/true) : index;
    const ensemble::TextBatch batch{b.tokens.index_select(0, index), b.lengths.index_select(0, index)};
    const ensemble::MultiTaskLosses losses = pipeline_->train_step(batch, b.labels.index_select(0, index), steps_done_ + 1);
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
  MultiTaskEpochReport report;
  report.epoch = epochs_done_;
  report.steps = static_cast<int64_t>(plan.size());
  const double steps = static_cast<double>(std::max<int64_t>(report.steps, 1));
  report.classification_loss = sums[0].mean().item<double>() / steps;
  report.lm_loss = sums[1].mean().item<double>() / steps;
  return report;
}

TaskMetrics MultiTaskTrainer::evaluate_pipelined(const std::vector<Bucket>& buckets) {
  const int64_t C = options_.model().classes(), K = model_->members(), E = options_.eval_batch_size();
  const auto reals = at::TensorOptions().dtype(at::kDouble).device(device_);
  // The last stage's counts, sent to every rank in one broadcast: confusion (C*C),
  // LM NLL sums (K), target tokens (1).
  at::Tensor counts = at::zeros({C * C + K + 1}, reals);
  at::NoGradGuard no_grad;
  // With replicas, replica r evaluates every R-th batch from the r-th.
  const int64_t R = pipeline_replicas(), replica = pipeline_groups_->replica;
  int64_t batch_number = 0;
  for (const Bucket& b : buckets) {
    for (int64_t first = 0; first < b.size(); first += E) {
      if (batch_number++ % R != replica) continue;
      const int64_t n = std::min(E, b.size() - first);
      const ensemble::TextBatch batch{b.tokens.narrow(0, first, n), b.lengths.narrow(0, first, n)};
      const at::Tensor hidden = pipeline_->forward(batch.tokens);
      if (!hidden.defined()) continue;
      const at::Tensor predicted = at::softmax(model_->classify(hidden, batch.lengths), -1).mean(0).argmax(-1);
      counts.narrow(0, 0, C * C).index_add_(0, b.labels.narrow(0, first, n) * C + predicted,
                                            at::ones({n}, reals));
      const at::Tensor targets = ensemble::lm_target_count(batch);
      counts.narrow(0, C * C, K).add_(ensemble::packed_lm_loss(model_->lm_logits(hidden), batch).to(at::kDouble) *
                                      targets.to(at::kDouble));
      counts.narrow(0, C * C + K, 1).add_(targets.to(at::kDouble));
    }
  }
  if (replicas_group_ != nullptr) {
    replicas_group_->all_reduce_sum_(counts, "evaluation all-reduce");
    replicas_group_->wait_device("evaluation all-reduce");
  }
  pipeline_group_->broadcast_(counts, pipeline_group_->world_size() - 1, "evaluation broadcast");
  return task_metrics(counts.narrow(0, 0, C * C).view({C, C}), counts.narrow(0, C * C, K),
                      static_cast<int64_t>(counts[C * C + K].item<double>()));
}

at::Tensor MultiTaskTrainer::score(const std::vector<std::string>& texts) {
  if (pipeline_) {
    throw DataError("score and generate need the whole model: load the pipeline run's checkpoint in one process "
                    "(packtrain multitask score CHECKPOINT assembles its stages)");
  }
  LabelledTexts data;
  data.texts = texts;
  data.labels.assign(texts.size(), 0);
  data.source = "score";
  int64_t truncated = 0;
  const std::vector<Bucket> buckets = tokenize(data, &truncated);
  at::Tensor out = at::zeros({static_cast<int64_t>(texts.size()), options_.model().classes()}, at::kDouble);
  at::NoGradGuard no_grad;
  const int64_t E = options_.eval_batch_size();
  for (const Bucket& b : buckets) {
    for (int64_t first = 0; first < b.size(); first += E) {
      const int64_t n = std::min(E, b.size() - first);
      const at::Tensor tokens = b.tokens.narrow(0, first, n);
      const at::Tensor probabilities =
          at::softmax(model_->classify(model_->trunk(tokens), b.lengths.narrow(0, first, n)), -1).mean(0);
      const at::Tensor host = probabilities.to(at::kCPU, at::kDouble);
      for (int64_t i = 0; i < n; ++i) out[b.index[static_cast<size_t>(first + i)]].copy_(host[i]);
    }
  }
  return out;
}

MultiTaskTrainer::DecodeSession& MultiTaskTrainer::decode_session(const GenerateOptions& g) {
  const int64_t max_length = options_.model().max_length(), V = options_.model().vocab(), K = model_->members();
  const bool sampled = g.temperature > 0;
  const int64_t top_k = sampled && g.top_k > 0 && g.top_k < V ? g.top_k : 0;
  std::unique_ptr<DecodeSession>& slot = decode_sessions_[{sampled, top_k, g.capture}];
  if (slot) return *slot;
  auto s = std::make_unique<DecodeSession>();
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  const auto reals = at::TensorOptions().dtype(options_.model().dtype()).device(device_);
  s->sampled = sampled;
  s->cache = model_->make_cache(1);
  s->token = at::zeros({K, 1}, longs);
  s->position = at::zeros({1}, longs);
  s->step_index = at::zeros({1}, longs);
  s->generated = at::full({max_length, K}, ByteTokenizer::kEos, longs);
  if (sampled) {
    s->noise = at::zeros({max_length, K, V}, reals);
    s->temperature = at::ones({}, reals);
  }
  DecodeSession* d = s.get();
  const auto body = [this, d, K, V, top_k](const std::vector<at::Tensor>&) {
    const at::Tensor hidden = model_->decode_step(d->token, d->position, d->cache);  // (K, 1, d)
    at::Tensor logits = model_->lm_logits(hidden.unsqueeze(2)).view({K, V});
    at::Tensor next;
    if (!d->sampled) {
      next = logits.argmax(-1);
    } else {
      at::Tensor z = logits / d->temperature;
      if (top_k > 0) {
        const at::Tensor kth = std::get<0>(z.topk(top_k, -1)).narrow(-1, top_k - 1, 1);
        z = z.masked_fill(z < kth, -std::numeric_limits<double>::infinity());
      }
      next = (z + d->noise.index_select(0, d->step_index).view({K, V})).argmax(-1);
    }
    d->generated.index_copy_(0, d->step_index, next.view({1, K}));
    d->token.copy_(next.view({K, 1}));
    d->position.add_(1);
    d->step_index.add_(1);
  };
  // An eager decode step (CPU, capture off, a failed capture) says why in the log, once.
  s->step = std::make_unique<graphs::CapturedStep>("decode", device_, std::vector<graphs::StaticInput>{}, body,
                                                   graphs::CaptureOptions().capture(g.capture).log(options_.log()));
  slot = std::move(s);
  return *slot;
}

int64_t MultiTaskTrainer::decode_graphs_captured() const {
  int64_t n = 0;
  for (const auto& [key, session] : decode_sessions_) n += session->step->captures();
  return n;
}

std::vector<std::string> MultiTaskTrainer::generate(const std::string& prompt, const GenerateOptions& g) {
  if (pipeline_) {
    throw DataError("score and generate need the whole model: load the pipeline run's checkpoint in one process "
                    "(packtrain multitask generate CHECKPOINT assembles its stages)");
  }
  if (g.max_new_tokens < 1) throw UserError("generate: max_new_tokens must be >= 1");
  if (!(g.temperature >= 0)) throw UserError("generate: temperature must be >= 0");
  if (g.top_k < 0) throw UserError("generate: top_k must be >= 0");
  const ByteTokenizer tokenizer;
  const int64_t max_length = options_.model().max_length(), V = options_.model().vocab(), K = model_->members();
  std::vector<int64_t> ids;
  try {
    ids = tokenizer.encode_prompt(prompt, max_length);
  } catch (const c10::Error& e) {
    throw UserError(e.what_without_backtrace());
  }
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t steps = std::min(g.max_new_tokens, max_length - n + 1);
  at::NoGradGuard no_grad;
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  DecodeSession& session = decode_session(g);
  // The prompt but its last token fills the cache; the last one is the first input
  // of the sampling steps. (Cache entries past the position are masked: no reset.)
  for (int64_t i = 0; i + 1 < n; ++i) {
    session.position.fill_(i);
    model_->decode_step(at::full({K, 1}, ids[static_cast<size_t>(i)], longs), session.position, session.cache);
  }
  session.token.fill_(ids.back());
  session.position.fill_(n - 1);
  session.step_index.zero_();
  session.generated.fill_(ByteTokenizer::kEos);
  if (session.sampled) {
    // Gumbel-max: argmax(logits / T + Gumbel noise) samples softmax(logits / T).
    auto generator = at::make_generator<at::CPUGeneratorImpl>(g.seed);
    const at::Tensor u = at::rand({steps, K, V}, generator, at::kDouble).clamp_min(1e-300);
    session.noise.narrow(0, 0, steps).copy_(-(-u.log()).log());
    session.temperature.fill_(g.temperature);
  }
  graphs::CapturedStep& decode = *session.step;
  const bool was_warming_up = decode.mode() == graphs::StepMode::kWarmingUp;
  {
    PACKTRAIN_NVTX_RANGE("generate");
    for (int64_t i = 0; i < steps; ++i) decode.run();
  }
  if (was_warming_up && decode.mode() == graphs::StepMode::kWarmingUp) {
    // Not a fallback, but no graph either: every call was an eager warm-up call.
    const graphs::CaptureOptions capture;
    options_.log()(fmt::format("step 'decode' ran eagerly: {} new tokens are fewer than the {} calls a graph needs "
                               "({} warm-up calls, then the capture)",
                               steps, capture.warmup_steps() + 1, capture.warmup_steps()));
  }
  const at::Tensor generated = session.generated.narrow(0, 0, steps);
  last_decode_mode_ = graphs::to_string(decode.mode());
  const at::Tensor host = generated.cpu();
  const auto tokens = host.accessor<int64_t, 2>();
  std::vector<std::string> out;
  for (int64_t k = 0; k < K; ++k) {
    std::vector<int64_t> member;
    for (int64_t i = 0; i < steps; ++i) member.push_back(tokens[i][k]);
    out.push_back(tokenizer.decode(member));
  }
  return out;
}

MultiTaskTrainer::ScoredGeneration MultiTaskTrainer::score_and_generate(const std::string& text,
                                                                        const GenerateOptions& options) {
  return {score({text})[0], generate(text, options)};
}

namespace {
// A trainer's checkpoint payload (the whole model's, or one pipeline stage's).
c10::impl::GenericDict trainer_payload(const MultiTaskTrainerOptions& options, const std::string& extra,
                                       const ensemble::PackedTransformer& model, const ensemble::PackedAdam& optimizer,
                                       int64_t epochs, int64_t steps) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("format", std::string(kMultiTaskFormat));
  d.insert("options", to_json(options));
  d.insert("extra", extra);
  d.insert("params", model.parameters().flat().to(at::kCPU).clone());
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, tensor] : optimizer.state()) state.insert(name, tensor.to(at::kCPU).clone());
  d.insert("optimizer", state);
  d.insert("epochs", epochs);
  d.insert("steps", steps);
  d.insert("first_layer", model.stage().first_layer);
  d.insert("end_layer", model.stage().end_layer);
  return d;
}

c10::impl::GenericDict checkpoint_dict(const std::filesystem::path& path, const char* what) {
  const c10::IValue payload = load_checkpoint(path);
  if (!payload.isGenericDict() || !payload.toGenericDict().contains("format") ||
      !payload.toGenericDict().at("format").isString()) {
    throw DataError(path.string() + ": not a packtrain " + what);
  }
  return payload.toGenericDict();
}

MultiTaskTrainerOptions options_of(const c10::impl::GenericDict& d, const std::filesystem::path& path) {
  try {
    return multitask_options_from_json(d.at("options").toStringRef());
  } catch (const c10::Error& e) {
    throw DataError(path.string() + ": unreadable options: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw DataError(path.string() + ": unreadable options: " + e.what());
  }
}

// Copies the tensors of `from` (laid out as `layout`) into `to` by parameter name.
void copy_by_name(const ensemble::PackedParameters& layout, const at::Tensor& from,
                  const ensemble::PackedParameters& target, at::Tensor to) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < target.size(); ++i) index[target.spec(i).name] = i;
  const std::vector<at::Tensor> sources = layout.blocks(from), targets = target.blocks(to);
  for (size_t i = 0; i < layout.size(); ++i) {
    at::Tensor destination = targets.at(index.at(layout.spec(i).name));
    destination.copy_(sources[i]);
  }
}

// A pipeline stage's file, beside its manifest: "<manifest>.stage<s>-of-<S>.step<N>".
std::string stage_file_name(const std::filesystem::path& manifest, int64_t stage, int64_t stages, int64_t steps) {
  return fmt::format("{}.stage{}-of-{}.step{}", manifest.filename().string(), stage, stages, steps);
}

// The 16 hex digits a manifest records of a stage file's checksum.
std::string checksum_hex(uint64_t checksum) { return fmt::format("{:016x}", checksum); }
}  // namespace

MultiTaskCheckpoint MultiTaskCheckpoint::read(const std::filesystem::path& path) {
  MultiTaskCheckpoint checkpoint;
  checkpoint.path_ = path;
  const c10::impl::GenericDict top = checkpoint_dict(path, "multi-task checkpoint");
  checkpoint.payload_ = std::make_shared<const c10::IValue>(top);
  const std::string format = top.at("format").toStringRef();
  if (format == kMultiTaskFormat) return checkpoint;
  if (format != kPipelineManifestFormat) throw DataError(path.string() + ": not a packtrain multi-task checkpoint");

  const auto bad = [&](const std::string& problem) {
    return DataError(path.string() + ": bad pipeline checkpoint manifest: " + problem);
  };
  int64_t S = 0;
  std::vector<std::string> names, checksums;  // checksums: none in manifests of earlier versions
  try {
    S = top.at("stages").toInt();
    names = nlohmann::json::parse(top.at("files").toStringRef()).get<std::vector<std::string>>();
    if (top.contains("checksums")) {
      checksums = nlohmann::json::parse(top.at("checksums").toStringRef()).get<std::vector<std::string>>();
    }
  } catch (const c10::Error& e) {
    throw bad(e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw bad(e.what());
  }
  if (S < 1 || static_cast<int64_t>(names.size()) != S || (!checksums.empty() && checksums.size() != names.size())) {
    throw bad(fmt::format("{} stages, {} stage files and {} checksums", S, names.size(), checksums.size()));
  }
  const std::filesystem::path dir = path.parent_path();
  for (int64_t s = 0; s < S; ++s) {
    const std::string& name = names[static_cast<size_t>(s)];
    // Stage files are written beside their manifest: a manifest never points elsewhere.
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        std::count(names.begin(), names.end(), name) != 1) {
      throw bad(fmt::format("stage {}'s file '{}' is not a file name of its own in the manifest's directory", s, name));
    }
    const std::filesystem::path file = dir / name;
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) {
      throw DataError(fmt::format("{}: stage {}'s file {} is missing (a pipeline checkpoint is the manifest and its "
                                  "{} stage files, side by side)",
                                  path.string(), s, file.string(), S));
    }
    if (!checksums.empty()) {
      const std::string actual = checksum_hex(checkpoint_checksum(file));
      if (actual != checksums[static_cast<size_t>(s)]) {
        throw DataError(fmt::format("{}: not the stage {} file that {} committed (its checksum is {}, the manifest's "
                                    "{}): was it replaced, or another stage's file copied over it?",
                                    file.string(), s, path.string(), actual, checksums[static_cast<size_t>(s)]));
      }
    }
    checkpoint.stage_files_.push_back(file);
  }
  return checkpoint;
}

std::string MultiTaskCheckpoint::extra() const {
  const c10::impl::GenericDict top = payload_->toGenericDict();
  if (top.contains("extra")) return top.at("extra").toStringRef();
  const c10::impl::GenericDict first = checkpoint_dict(stage_files_.at(0), "multi-task stage checkpoint");
  if (!first.contains("extra")) throw DataError(stage_files_.at(0).string() + ": no run description");
  return first.at("extra").toStringRef();
}

void MultiTaskTrainer::save(const std::filesystem::path& path, const std::string& extra) const {
  PACKTRAIN_NVTX_RANGE("checkpoint");
  if (pipeline_) {
    save_stage(path, extra);
    return;
  }
  save_checkpoint(path, trainer_payload(options_, extra, *model_, *optimizer_, epochs_done_, steps_done_));
}

void MultiTaskTrainer::save_stage(const std::filesystem::path& path, const std::string& extra) const {
  // A stage's replicas hold the same weights (checked every epoch): replica 0's stages save them.
  if (pipeline_groups_->replica != 0) return;
  const int64_t s = pipeline_group_->rank(), S = pipeline_group_->world_size();
  const auto name = [&](int64_t stage) { return stage_file_name(path, stage, S, steps_done_); };
  const std::filesystem::path file = path.parent_path() / name(s);
  c10::impl::GenericDict d = trainer_payload(options_, extra, *model_, *optimizer_, epochs_done_, steps_done_);
  d.insert("stage", s);
  d.insert("stages", S);
  save_checkpoint(file, d);
  pipeline_group_->barrier();  // every stage's file is committed
  if (s == 0) {
    std::vector<std::string> files, checksums;
    for (int64_t t = 0; t < S; ++t) {
      files.push_back(name(t));
      checksums.push_back(checksum_hex(checkpoint_checksum(path.parent_path() / name(t))));
    }
    c10::impl::GenericDict m(c10::StringType::get(), c10::AnyType::get());
    m.insert("format", std::string(kPipelineManifestFormat));
    m.insert("stages", S);
    m.insert("files", nlohmann::json(files).dump());
    m.insert("checksums", nlohmann::json(checksums).dump());
    m.insert("extra", extra);
    m.insert("epochs", epochs_done_);
    m.insert("steps", steps_done_);
    save_checkpoint(path, m);
  }
  pipeline_group_->barrier();  // the manifest names the new files: the old ones can go
  // The stage file this run committed last under this manifest (a run resumed into
  // another file leaves the one it resumed whole).
  if (!committed_stage_file_.empty() && committed_stage_file_ != file && committed_manifest_ == path) {
    std::error_code ignored;
    std::filesystem::remove(committed_stage_file_, ignored);
  }
  committed_stage_file_ = file;
  committed_manifest_ = path;
}

std::vector<std::filesystem::path> MultiTaskTrainer::stage_files_to_write(const std::filesystem::path& path,
                                                                          int64_t epochs) const {
  const int64_t per_epoch = steps_per_epoch();
  if (pipeline_ == nullptr || per_epoch <= 0 || epochs <= epochs_done_) return {};
  const int64_t S = pipeline_group_->world_size();
  const std::string prefix = path.filename().string() + ".stage";
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  // The directory, not every save's names: a run of many epochs lists no more than is there.
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    long long stage = -1, stages = -1, steps = -1;
    if (std::sscanf(name.c_str() + prefix.size(), "%lld-of-%lld.step%lld", &stage, &stages, &steps) != 3) continue;
    if (stages != S || stage < 0 || stage >= S || name != stage_file_name(path, stage, S, steps)) continue;
    const int64_t after = steps - steps_done_;  // saves come after each epoch, per_epoch steps apart
    if (after > 0 && after % per_epoch == 0 && after / per_epoch <= epochs - epochs_done_) {
      out.push_back(path.parent_path() / name);
    }
  }
  return out;
}

std::unique_ptr<MultiTaskTrainer> MultiTaskTrainer::load(const std::filesystem::path& path, c10::Device device,
                                                         std::string* extra, graphs::GraphLog log,
                                                         distributed::ProcessGroup* pipeline) {
  return load(MultiTaskCheckpoint::read(path), device, extra, std::move(log), pipeline);
}

std::unique_ptr<MultiTaskTrainer> MultiTaskTrainer::load(const MultiTaskCheckpoint& checkpoint, c10::Device device,
                                                         std::string* extra, graphs::GraphLog log,
                                                         distributed::ProcessGroup* pipeline) {
  const std::filesystem::path& path = checkpoint.path();
  const c10::impl::GenericDict top = checkpoint.payload_->toGenericDict();
  const std::string format = top.at("format").toStringRef();
  const auto with_device = [&](MultiTaskTrainerOptions options) {
    options.model(ensemble::PackedTransformerOptions(options.model()).device(device)).log(log);
    return options;
  };
  // Parameters and optimizer state of `d` into `trainer`, whose layout must match.
  const auto restore = [&](MultiTaskTrainer& trainer, const c10::impl::GenericDict& d,
                           const std::filesystem::path& file) {
    at::NoGradGuard no_grad;
    const at::Tensor params = d.at("params").toTensor();
    if (params.numel() != trainer.model_->parameters().flat().numel()) {
      throw DataError(fmt::format("{}: {} parameters stored, the model described has {}", file.string(),
                                  params.numel(), trainer.model_->parameters().flat().numel()));
    }
    trainer.model_->parameters().flat().copy_(params);
    const c10::impl::GenericDict optimizer = d.at("optimizer").toGenericDict();
    for (const auto& [name, tensor] : trainer.optimizer_->state()) {
      if (!optimizer.contains(name)) throw DataError(file.string() + ": optimizer state '" + name + "' missing");
      const at::Tensor stored = optimizer.at(name).toTensor();
      if (stored.sizes() != tensor.sizes()) throw DataError(file.string() + ": optimizer state '" + name + "' mismatched");
      at::Tensor target = tensor;
      target.copy_(stored);
    }
    trainer.epochs_done_ = d.at("epochs").toInt();
    trainer.steps_done_ = d.at("steps").toInt();
    if (extra != nullptr) *extra = d.at("extra").toStringRef();
  };
  if (format == kMultiTaskFormat) {
    auto trainer = std::make_unique<MultiTaskTrainer>(with_device(options_of(top, path)));
    restore(*trainer, top, path);
    return trainer;
  }

  // A pipeline run's manifest: its stage files, all of the save it names.
  // Its stage files, each found (and matched with its checksum) by MultiTaskCheckpoint::read.
  const int64_t S = static_cast<int64_t>(checkpoint.stage_files().size()), steps = top.at("steps").toInt();
  const auto stage_dict = [&](int64_t s) {
    const std::filesystem::path& file = checkpoint.stage_files().at(static_cast<size_t>(s));
    c10::impl::GenericDict d = checkpoint_dict(file, "multi-task stage checkpoint");
    if (d.at("format").toStringRef() != kMultiTaskFormat || d.at("steps").toInt() != steps) {
      throw DataError(fmt::format("{}: not stage {} of the save at step {} that {} names", file.string(), s, steps,
                                  path.string()));
    }
    // The file's own record: a stage file renamed, or copied over another, holds another stage.
    if (!d.contains("stage") || !d.contains("stages")) {
      throw DataError(fmt::format("{}: not a pipeline stage file (it records no stage), yet {} names it as stage {}",
                                  file.string(), path.string(), s));
    }
    if (d.at("stage").toInt() != s || d.at("stages").toInt() != S) {
      throw DataError(fmt::format("{}: holds stage {} of {}, but {} names it as stage {} of {}: was it renamed, or "
                                  "copied over another stage's file?",
                                  file.string(), d.at("stage").toInt(), d.at("stages").toInt(), path.string(), s, S));
    }
    return std::make_pair(file, d);
  };
  if (pipeline != nullptr) {
    if (pipeline->world_size() % S != 0) {
      throw DataError(fmt::format("{}: a pipeline run of {} stages resumes on {} ranks (or a multiple: stages x "
                                  "replicas), not {} (or in one process, which assembles the stages)",
                                  path.string(), S, S, pipeline->world_size()));
    }
    const auto [file, d] = stage_dict(pipeline->rank() % S);
    auto trainer = std::make_unique<MultiTaskTrainer>(with_device(options_of(d, file)), pipeline);
    restore(*trainer, d, file);
    trainer->committed_stage_file_ = file;
    trainer->committed_manifest_ = path;
    return trainer;
  }
  // One process: the whole model, each stage's parameters and optimizer state copied in by name.
  const auto [first_file, first] = stage_dict(0);
  const MultiTaskTrainerOptions options =
      with_device(options_of(first, first_file)).pipeline_stages(1).pipeline_boundaries({});
  auto trainer = std::make_unique<MultiTaskTrainer>(options);
  at::NoGradGuard no_grad;
  ensemble::PackedParameters& whole = trainer->model_->parameters();
  const std::vector<std::pair<std::string, at::Tensor>> state = trainer->optimizer_->state();
  for (int64_t s = 0; s < S; ++s) {
    const auto [file, d] = stage_dict(s);
    const ensemble::TransformerStage blocks{d.at("first_layer").toInt(), d.at("end_layer").toInt()};
    const ensemble::PackedParameters layout(options.model().members(),
                                            ensemble::transformer_parameters(options.model(), blocks),
                                            c10::TensorOptions().dtype(options.model().dtype()));
    const at::Tensor params = d.at("params").toTensor();
    if (params.numel() != layout.flat().numel()) {
      throw DataError(fmt::format("{}: {} parameters stored, stage {} of the model described has {}", file.string(),
                                  params.numel(), s, layout.flat().numel()));
    }
    copy_by_name(layout, params.to(layout.flat().dtype()), whole, whole.flat());
    const c10::impl::GenericDict optimizer = d.at("optimizer").toGenericDict();
    for (const auto& [name, tensor] : state) {
      if (!optimizer.contains(name)) throw DataError(file.string() + ": optimizer state '" + name + "' missing");
      const at::Tensor stored = optimizer.at(name).toTensor();
      at::Tensor target = tensor;
      if (stored.numel() == layout.flat().numel() && tensor.numel() == whole.flat().numel()) {
        copy_by_name(layout, stored.to(tensor.scalar_type()), whole, target);  // in the parameters' layout
      } else if (s == 0) {
        if (stored.sizes() != tensor.sizes()) throw DataError(file.string() + ": optimizer state '" + name + "' mismatched");
        target.copy_(stored);  // per member: the same on every stage
      }
    }
  }
  trainer->epochs_done_ = first.at("epochs").toInt();
  trainer->steps_done_ = first.at("steps").toInt();
  if (extra != nullptr) *extra = first.at("extra").toStringRef();
  return trainer;
}

}  // namespace packtrain::runtime
