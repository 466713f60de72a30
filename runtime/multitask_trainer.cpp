#include "runtime/multitask_trainer.h"

#include "graphs/captured_step.h"
#include "graphs/graph_pool.h"
#include "profiling/nvtx.h"
#include "runtime/byte_tokenizer.h"
#include "runtime/checkpoint_file.h"
#include "runtime/data_error.h"
#include "runtime/distributed/process_group.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace packtrain::runtime {

namespace {

constexpr const char* kMultiTaskFormat = "packtrain-multitask-1";

void silent(const std::string&) {}

std::string dtype_name(c10::ScalarType t) { return t == at::kDouble ? "float64" : "float32"; }

}  // namespace

struct MultiTaskTrainer::Bucket {
  int64_t length = 0;
  at::Tensor tokens, lengths, labels;  // (N, length), (N), (N) int64 on the device
  std::vector<int64_t> index;          // row i is example index[i] of the source
  int64_t size() const { return static_cast<int64_t>(index.size()); }
};

void MultiTaskTrainerOptions::validate() const {
  try {
    model().validate();
  } catch (const c10::Error& e) {
    throw std::invalid_argument(e.what_without_backtrace());
  }
  const auto fail = [](const std::string& what) { throw std::invalid_argument("multi-task trainer: " + what); };
  if (batch_size() < 1) fail(fmt::format("batch_size must be >= 1, got {}", batch_size()));
  if (eval_batch_size() < 1) fail(fmt::format("eval_batch_size must be >= 1, got {}", eval_batch_size()));
  if (buckets().empty()) fail("buckets must name at least one padded length");
  for (size_t i = 0; i < buckets().size(); ++i) {
    if (buckets()[i] < 3) fail(fmt::format("bucket lengths must be >= 3, got {}", buckets()[i]));
    if (i > 0 && buckets()[i] <= buckets()[i - 1]) fail("bucket lengths must be strictly ascending");
  }
  if (buckets().back() > model().max_length()) {
    fail(fmt::format("the longest bucket ({}) exceeds the model's max_length ({})", buckets().back(),
                     model().max_length()));
  }
  if (!(lr() >= 0)) fail(fmt::format("lr must be >= 0, got {}", lr()));
  if (!(weight_decay() >= 0)) fail(fmt::format("weight_decay must be >= 0, got {}", weight_decay()));
  if (warmup_steps() < 0) fail(fmt::format("warmup_steps must be >= 0, got {}", warmup_steps()));
  if (!(classification_weight() >= 0) || !(lm_weight() >= 0) || classification_weight() + lm_weight() == 0) {
    fail("task weights must be >= 0 and not both 0");
  }
}

std::string to_json(const MultiTaskTrainerOptions& o) {
  const auto& m = o.model();
  nlohmann::json j = {
      {"members", m.members()}, {"vocab", m.vocab()}, {"width", m.width()}, {"layers", m.layers()},
      {"heads", m.heads()}, {"mlp_ratio", m.mlp_ratio()}, {"max_length", m.max_length()},
      {"classes", m.classes()}, {"tie_lm_head", m.tie_lm_head()}, {"dtype", dtype_name(m.dtype())},
      {"batch_size", o.batch_size()}, {"buckets", o.buckets()}, {"lr", o.lr()}, {"weight_decay", o.weight_decay()},
      {"warmup_steps", o.warmup_steps()}, {"classification_weight", o.classification_weight()},
      {"lm_weight", o.lm_weight()}, {"shared_inputs", o.shared_inputs()}, {"eval_batch_size", o.eval_batch_size()},
      {"seed", o.seed()}, {"capture", o.capture()}};
  return j.dump();
}

MultiTaskTrainerOptions multitask_options_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  MultiTaskTrainerOptions o;
  ensemble::PackedTransformerOptions m;
  for (const auto& [key, value] : j.items()) {
    if (key == "members") m.members(value.get<int64_t>());
    else if (key == "vocab") m.vocab(value.get<int64_t>());
    else if (key == "width") m.width(value.get<int64_t>());
    else if (key == "layers") m.layers(value.get<int64_t>());
    else if (key == "heads") m.heads(value.get<int64_t>());
    else if (key == "mlp_ratio") m.mlp_ratio(value.get<int64_t>());
    else if (key == "max_length") m.max_length(value.get<int64_t>());
    else if (key == "classes") m.classes(value.get<int64_t>());
    else if (key == "tie_lm_head") m.tie_lm_head(value.get<bool>());
    else if (key == "dtype") m.dtype(value.get<std::string>() == "float64" ? at::kDouble : at::kFloat);
    else if (key == "batch_size") o.batch_size(value.get<int64_t>());
    else if (key == "buckets") o.buckets(value.get<std::vector<int64_t>>());
    else if (key == "lr") o.lr(value.get<double>());
    else if (key == "weight_decay") o.weight_decay(value.get<double>());
    else if (key == "warmup_steps") o.warmup_steps(value.get<int64_t>());
    else if (key == "classification_weight") o.classification_weight(value.get<double>());
    else if (key == "lm_weight") o.lm_weight(value.get<double>());
    else if (key == "shared_inputs") o.shared_inputs(value.get<bool>());
    else if (key == "eval_batch_size") o.eval_batch_size(value.get<int64_t>());
    else if (key == "seed") o.seed(value.get<uint64_t>());
    else if (key == "capture") o.capture(value.get<bool>());
    else throw std::invalid_argument("multi-task options: unknown key '" + key + "'");
  }
  o.model(m);
  return o;
}

MultiTaskTrainer::MultiTaskTrainer(MultiTaskTrainerOptions options)
    : options_(std::move(options)), device_(options_.model().device()) {
  options_.validate();
  // "cuda" means the first device: graph caches and pools compare devices with their index.
  if (device_.is_cuda() && device_.index() < 0) {
    device_ = c10::Device(c10::kCUDA, 0);
    options_.model(ensemble::PackedTransformerOptions(options_.model()).device(device_));
  }
  ensemble::PackedTransformerOptions model_options = options_.model();
  model_options.seed(options_.seed()).device(device_);
  model_ = std::make_unique<ensemble::PackedTransformer>(model_options);
  optimizer_ = std::make_unique<ensemble::PackedAdam>(
      model_->parameters(), ensemble::adamw_options().lr(options_.lr()).weight_decay(options_.weight_decay()));
  if (options_.warmup_steps() > 0) {
    optimizer_->set_schedule(
        ensemble::LrSchedule().kind(ensemble::LrScheduleKind::kLinearWarmup).warmup_steps(options_.warmup_steps()));
  }
  pool_ = std::make_shared<graphs::GraphPool>(device_);
  const int64_t K = model_->members(), C = options_.model().classes();
  const auto doubles = at::TensorOptions().dtype(at::kDouble).device(device_);
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  classification_sum_ = at::zeros({K}, doubles);
  lm_sum_ = at::zeros({K}, doubles);
  confusion_ = at::zeros({C, C}, longs);
  lm_nll_sum_ = at::zeros({K}, doubles);
  lm_tokens_ = at::zeros({}, longs);
  const graphs::CaptureOptions capture = graphs::CaptureOptions().capture(options_.capture()).log(silent);

  std::vector<graphs::InputKind> train_inputs{{"tokens", 2, at::kLong}, {"lengths", 1, at::kLong},
                                              {"labels", 1, at::kLong}};
  if (!options_.shared_inputs()) {
    train_inputs.push_back({"lm_tokens", 2, at::kLong});
    train_inputs.push_back({"lm_lengths", 1, at::kLong});
  }
  train_cache_ = std::make_unique<graphs::GraphCache>(
      "multitask train", device_, train_inputs,
      [this](const std::vector<at::Tensor>& in) {
        const ensemble::TextBatch classification{in[0], in[1]};
        // The same TextBatch object when the tasks share their texts: one trunk forward.
        const ensemble::TextBatch lm = options_.shared_inputs() ? classification : ensemble::TextBatch{in[3], in[4]};
        const ensemble::MultiTaskLosses losses = ensemble::multitask_train_step(
            *model_, *optimizer_, classification, in[2], lm,
            {options_.classification_weight(), options_.lm_weight()},
            group_ == nullptr ? ensemble::GradientHook() : ensemble::GradientHook([this] {
              at::Tensor gradients = model_->parameters().flat_grad();
              group_->all_reduce_mean_(gradients, "gradient all-reduce", steps_done_ + 1);
            }));
        classification_sum_.add_(losses.classification);
        lm_sum_.add_(losses.language_model);
      },
      capture, pool_, /*capacity=*/8);

  // Eval batches are always eval_batch_size rows: a bucket's last batch is filled
  // with rows of weight 0 (length 1: no LM targets, no confusion count), so each
  // bucket has one eval graph whatever the data set's size.
  eval_cache_ = std::make_unique<graphs::GraphCache>(
      "multitask eval", device_,
      std::vector<graphs::InputKind>{
          {"tokens", 2, at::kLong}, {"lengths", 1, at::kLong}, {"labels", 1, at::kLong}, {"weights", 1, at::kLong}},
      [this, C](const std::vector<at::Tensor>& in) {
        at::NoGradGuard no_grad;
        PACKTRAIN_NVTX_RANGE("eval");
        const ensemble::TextBatch batch{in[0], in[1]};
        const at::Tensor hidden = model_->trunk(batch.tokens);
        const at::Tensor probabilities = at::softmax(model_->classify(hidden, batch.lengths), -1).mean(0);
        const at::Tensor predicted = probabilities.argmax(-1);
        confusion_.view({-1}).index_add_(0, in[2] * C + predicted, in[3]);
        const at::Tensor count = ensemble::lm_target_count(batch);
        lm_nll_sum_.add_(ensemble::packed_lm_loss(model_->lm_logits(hidden), batch).to(at::kDouble) * count);
        lm_tokens_.add_(count);
      },
      capture, pool_, /*capacity=*/8);
}

MultiTaskTrainer::~MultiTaskTrainer() = default;

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
  return truncated;
}

int64_t MultiTaskTrainer::steps_per_epoch() const {
  int64_t steps = 0;
  for (const Bucket& b : train_buckets_) steps += (b.size() + options_.batch_size() - 1) / options_.batch_size();
  return steps;
}

size_t MultiTaskTrainer::training_graphs() const { return train_cache_->size(); }
size_t MultiTaskTrainer::evaluation_graphs() const { return eval_cache_->size(); }

void MultiTaskTrainer::set_process_group(distributed::ProcessGroup* group) {
  if (group == nullptr) {
    group_ = nullptr;
    return;
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
  at::Tensor flat = model_->parameters().flat();
  group_->broadcast_(flat, 0, "initial-weights broadcast");
}

void MultiTaskTrainer::run_train_batch(const Bucket& bucket, const at::Tensor& rows, const at::Tensor& lm_rows) {
  std::vector<at::Tensor> inputs{bucket.tokens.index_select(0, rows), bucket.lengths.index_select(0, rows),
                                 bucket.labels.index_select(0, rows)};
  if (!options_.shared_inputs()) {
    inputs.push_back(bucket.tokens.index_select(0, lm_rows));
    inputs.push_back(bucket.lengths.index_select(0, lm_rows));
  }
  train_cache_->run(inputs);
  // Data parallel on CUDA: the step's all-reduce (in its graph) gets the group's deadline.
  if (group_ != nullptr) group_->watch_device("gradient all-reduce", steps_done_ + 1, steps_done_ + 1);
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

  // Every step's rows go to the device in one copy per epoch: a copy per step from
  // pageable host memory would make the host wait for the device at every step.
  std::vector<int64_t> all_rows, all_lm_rows;
  for (const Plan& batch : plan) {
    all_rows.insert(all_rows.end(), batch.rows.begin(), batch.rows.end());
    all_lm_rows.insert(all_lm_rows.end(), batch.lm_rows.begin(), batch.lm_rows.end());
  }
  const auto steps_in_plan = static_cast<int64_t>(plan.size());
  const at::Tensor rows = at::tensor(all_rows, at::kLong).view({steps_in_plan, B}).to(device_);
  const at::Tensor lm_rows =
      all_lm_rows.empty() ? at::Tensor() : at::tensor(all_lm_rows, at::kLong).view({steps_in_plan, B}).to(device_);
  classification_sum_.zero_();
  lm_sum_.zero_();
  // Data parallel: this rank's equal share of every global batch.
  const int64_t world = group_ != nullptr ? group_->world_size() : 1;
  const int64_t share = B / world, first_row = group_ != nullptr ? group_->rank() * share : 0;
  for (int64_t i = 0; i < steps_in_plan; ++i) {
    run_train_batch(train_buckets_[plan[static_cast<size_t>(i)].bucket], rows[i].narrow(0, first_row, share),
                    lm_rows.defined() ? lm_rows[i].narrow(0, first_row, share) : at::Tensor());
    ++steps_done_;
  }
  if (group_ != nullptr) {
    group_->all_reduce_mean_(classification_sum_, "training-loss all-reduce", steps_done_);
    group_->all_reduce_mean_(lm_sum_, "training-loss all-reduce", steps_done_);
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
  report.classification_loss = classification_sum_.mean().item<double>() / steps;
  report.lm_loss = lm_sum_.mean().item<double>() / steps;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

TaskMetrics MultiTaskTrainer::evaluate(const LabelledTexts& data) {
  int64_t truncated = 0;
  const std::vector<Bucket> buckets = tokenize(data, &truncated);
  confusion_.zero_();
  lm_nll_sum_.zero_();
  lm_tokens_.zero_();
  const int64_t E = options_.eval_batch_size();
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  for (const Bucket& b : buckets) {
    for (int64_t first = 0; first < b.size(); first += E) {
      const int64_t n = std::min(E, b.size() - first);
      if (n == E) {
        eval_cache_->run({b.tokens.narrow(0, first, n), b.lengths.narrow(0, first, n), b.labels.narrow(0, first, n),
                          at::ones({E}, longs)});
        continue;
      }
      const at::Tensor rows = at::arange(first, first + E, longs).remainder(b.size());
      const at::Tensor real = at::arange(E, longs) < n;
      eval_cache_->run({b.tokens.index_select(0, rows), at::where(real, b.lengths.index_select(0, rows), 1),
                        b.labels.index_select(0, rows), real.to(at::kLong)});
    }
  }
  const at::Tensor confusion = confusion_.to(at::kCPU, at::kDouble);
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
  m.tokens = lm_tokens_.item<int64_t>();
  m.lm_loss = m.tokens > 0 ? (lm_nll_sum_.mean().item<double>() / static_cast<double>(m.tokens)) : 0;
  m.perplexity = std::exp(m.lm_loss);
  return m;
}

at::Tensor MultiTaskTrainer::score(const std::vector<std::string>& texts) {
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

std::vector<std::string> MultiTaskTrainer::generate(const std::string& prompt, const GenerateOptions& g) {
  if (g.max_new_tokens < 1) throw std::invalid_argument("generate: max_new_tokens must be >= 1");
  if (!(g.temperature >= 0)) throw std::invalid_argument("generate: temperature must be >= 0");
  if (g.top_k < 0) throw std::invalid_argument("generate: top_k must be >= 0");
  const ByteTokenizer tokenizer;
  const int64_t max_length = options_.model().max_length(), V = options_.model().vocab(), K = model_->members();
  std::vector<int64_t> ids;
  try {
    ids = tokenizer.encode_prompt(prompt, max_length);
  } catch (const c10::Error& e) {
    throw std::invalid_argument(e.what_without_backtrace());
  }
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t steps = std::min(g.max_new_tokens, max_length - n + 1);
  at::NoGradGuard no_grad;
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  ensemble::KvCache cache = model_->make_cache(1);
  // The prompt but its last token fills the cache; the last one is the first input
  // of the sampling steps.
  at::Tensor position = at::zeros({1}, longs);
  for (int64_t i = 0; i + 1 < n; ++i) {
    position.fill_(i);
    model_->decode_step(at::full({K, 1}, ids[static_cast<size_t>(i)], longs), position, cache);
  }
  at::Tensor token = at::full({K, 1}, ids.back(), longs);
  position.fill_(n - 1);
  at::Tensor step_index = at::zeros({1}, longs);
  at::Tensor generated = at::full({steps, K}, ByteTokenizer::kEos, longs);
  at::Tensor noise;
  if (g.temperature > 0) {
    // Gumbel-max: argmax(logits / T + Gumbel noise) samples softmax(logits / T).
    auto generator = at::make_generator<at::CPUGeneratorImpl>(g.seed);
    const at::Tensor u = at::rand({steps, K, V}, generator, at::kDouble).clamp_min(1e-300);
    noise = (-(-u.log()).log()).to(device_, options_.model().dtype());
  }
  const auto step = [&](const std::vector<at::Tensor>&) {
    const at::Tensor hidden = model_->decode_step(token, position, cache);  // (K, 1, d)
    at::Tensor logits = model_->lm_logits(hidden.unsqueeze(2)).view({K, V});
    at::Tensor next;
    if (g.temperature <= 0) {
      next = logits.argmax(-1);
    } else {
      at::Tensor z = logits / g.temperature;
      if (g.top_k > 0 && g.top_k < V) {
        const at::Tensor kth = std::get<0>(z.topk(g.top_k, -1)).narrow(-1, g.top_k - 1, 1);
        z = z.masked_fill(z < kth, -std::numeric_limits<double>::infinity());
      }
      next = (z + noise.index_select(0, step_index).view({K, V})).argmax(-1);
    }
    generated.index_copy_(0, step_index, next.view({1, K}));
    token.copy_(next.view({K, 1}));
    position.add_(1);
    step_index.add_(1);
  };
  graphs::CapturedStep decode("decode", device_, {}, step,
                              graphs::CaptureOptions().capture(g.capture).log(silent));
  {
    PACKTRAIN_NVTX_RANGE("generate");
    for (int64_t i = 0; i < steps; ++i) decode.run();
  }
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

void MultiTaskTrainer::save(const std::filesystem::path& path, const std::string& extra) const {
  PACKTRAIN_NVTX_RANGE("checkpoint");
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("format", std::string(kMultiTaskFormat));
  d.insert("options", to_json(options_));
  d.insert("extra", extra);
  d.insert("params", model_->parameters().flat().to(at::kCPU).clone());
  c10::impl::GenericDict optimizer(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, tensor] : optimizer_->state()) optimizer.insert(name, tensor.to(at::kCPU).clone());
  d.insert("optimizer", optimizer);
  d.insert("epochs", epochs_done_);
  d.insert("steps", steps_done_);
  save_checkpoint(path, d);
}

std::unique_ptr<MultiTaskTrainer> MultiTaskTrainer::load(const std::filesystem::path& path, c10::Device device,
                                                         std::string* extra) {
  const c10::IValue payload = load_checkpoint(path);
  if (!payload.isGenericDict() || !payload.toGenericDict().contains("format") ||
      !payload.toGenericDict().at("format").isString() ||
      payload.toGenericDict().at("format").toStringRef() != kMultiTaskFormat) {
    throw DataError(path.string() + ": not a packtrain multi-task checkpoint");
  }
  const c10::impl::GenericDict d = payload.toGenericDict();
  MultiTaskTrainerOptions options;
  try {
    options = multitask_options_from_json(d.at("options").toStringRef());
    options.model(ensemble::PackedTransformerOptions(options.model()).device(device));
  } catch (const std::exception& e) {
    throw DataError(path.string() + ": unreadable options: " + e.what());
  }
  auto trainer = std::make_unique<MultiTaskTrainer>(options);
  at::NoGradGuard no_grad;
  const at::Tensor params = d.at("params").toTensor();
  if (params.numel() != trainer->model_->parameters().flat().numel()) {
    throw DataError(fmt::format("{}: {} parameters stored, the model described has {}", path.string(),
                                params.numel(), trainer->model_->parameters().flat().numel()));
  }
  trainer->model_->parameters().flat().copy_(params);
  const c10::impl::GenericDict optimizer = d.at("optimizer").toGenericDict();
  for (const auto& [name, tensor] : trainer->optimizer_->state()) {
    if (!optimizer.contains(name)) throw DataError(path.string() + ": optimizer state '" + name + "' missing");
    const at::Tensor stored = optimizer.at(name).toTensor();
    if (stored.sizes() != tensor.sizes()) throw DataError(path.string() + ": optimizer state '" + name + "' mismatched");
    at::Tensor target = tensor;
    target.copy_(stored);
  }
  trainer->epochs_done_ = d.at("epochs").toInt();
  trainer->steps_done_ = d.at("steps").toInt();
  if (extra != nullptr) *extra = d.at("extra").toStringRef();
  return trainer;
}

}  // namespace packtrain::runtime
