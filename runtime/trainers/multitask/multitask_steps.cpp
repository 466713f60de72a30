// The multi-task steps: the two graph caches (training, eval) over one pool, the
// step functions they capture, and the evaluation's fixed-size batching.
#include "packtrain/runtime/trainers/multitask/multitask_steps.h"

#include "packtrain/profiling/nvtx.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace packtrain::runtime {

void MultiTaskStepsOptions::validate() const {
  TORCH_CHECK(eval_batch_size() > 0, "eval_batch_size must be positive, got eval_batch_size=", eval_batch_size());
  TORCH_CHECK(capacity() >= 1, "capacity must be >= 1, got capacity=", capacity());
  TORCH_CHECK(weights().classification >= 0 && weights().language_model >= 0 &&
                  weights().classification + weights().language_model > 0,
              "task weights must be >= 0 and not both 0, got weights.classification=", weights().classification,
              ", weights.language_model=", weights().language_model);
}

MultiTaskSteps::MultiTaskSteps(ensemble::PackedTransformer& model, ensemble::PackedOptimizer& optimizer,
                               MultiTaskStepsOptions options)
    : model_(&model),
      optimizer_(&optimizer),
      options_((options.validate(), std::move(options))),
      device_(graphs::indexed_device(model.options().device())),
      pool_(std::make_shared<graphs::GraphPool>(device_)) {
  TORCH_CHECK(&optimizer.parameters() == &model.parameters(),
              "MultiTaskSteps: the optimizer does not hold this model's parameters");
  const int64_t K = model.members(), C = model.options().classes();
  const auto doubles = at::TensorOptions().dtype(at::kDouble).device(device_);
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  classification_sum_ = at::zeros({K}, doubles);
  lm_sum_ = at::zeros({K}, doubles);
  confusion_ = at::zeros({C, C}, longs);
  lm_nll_sum_ = at::zeros({K}, doubles);
  lm_tokens_ = at::zeros({}, longs);

  eval_ = std::make_unique<graphs::GraphCache>(
      "multitask eval", device_,
      std::vector<graphs::InputKind>{
          {"tokens", 2, at::kLong}, {"lengths", 1, at::kLong}, {"labels", 1, at::kLong}, {"weights", 1, at::kLong}},
      [this](const std::vector<at::Tensor>& in) { eval_body(in); }, options_.capture(), pool_, options_.capacity());
}

MultiTaskSteps::~MultiTaskSteps() = default;

void MultiTaskSteps::train_body(const std::vector<at::Tensor>& in) {
  const ensemble::TextBatch classification{in[0], in[1]};
  // The same TextBatch object when the tasks share their texts: one trunk forward.
  const ensemble::TextBatch lm = options_.shared_inputs() ? classification : ensemble::TextBatch{in[3], in[4]};
  const ensemble::MultiTaskLosses losses = ensemble::multitask_train_step(*model_, *optimizer_, classification, in[2],
                                                                          lm, options_.weights(), gradient_hook_);
  classification_sum_.add_(losses.classification);
  lm_sum_.add_(losses.language_model);
}

void MultiTaskSteps::eval_body(const std::vector<at::Tensor>& in) {
  at::NoGradGuard no_grad;
  PACKTRAIN_NVTX_RANGE("eval");
  const int64_t C = model_->options().classes();
  const ensemble::TextBatch batch{in[0], in[1]};
  const at::Tensor hidden = model_->trunk(batch.tokens);                                              // (K, E, T, d)
  const at::Tensor probabilities = at::softmax(model_->classify(hidden, batch.lengths), -1).mean(0);  // (E, C)
  const at::Tensor predicted = probabilities.argmax(-1);                                              // (E)
  confusion_.view({-1}).index_add_(0, in[2] * C + predicted, in[3]);
  const at::Tensor count = ensemble::lm_target_count(batch);
  lm_nll_sum_.add_(ensemble::packed_lm_loss(model_->lm_logits(hidden), batch).to(at::kDouble) * count);
  lm_tokens_.add_(count);
}

void MultiTaskSteps::set_training_data(const std::vector<TrainingBucket>& data) {
  bool same = data.size() == buckets_.size();
  for (size_t b = 0; same && b < data.size(); ++b) {
    same = data[b].tokens.sizes() == buckets_[b].tokens.sizes() && data[b].labels.sizes() == buckets_[b].labels.sizes();
  }
  if (!same) {
    buckets_.clear();  // other shapes: new buffers, and the graphs that read the old ones go
    buckets_.resize(data.size());
  }
  for (size_t b = 0; b < data.size(); ++b) {
    const TrainingBucket& d = data[b];
    TORCH_CHECK(d.tokens.dim() == 2 && d.lengths.dim() == 1 && d.labels.dim() == 1 &&
                    d.lengths.size(0) == d.tokens.size(0) && d.labels.size(0) == d.tokens.size(0),
                "set_training_data: bucket ", b, ": expected tokens (N, T), lengths (N) and labels (N), got ",
                d.tokens.sizes(), ", ", d.lengths.sizes(), " and ", d.labels.sizes());
    Bucket& bucket = buckets_[b];
    if (!same) {
      bucket.tokens = d.tokens.to(device_, at::kLong).contiguous();
      bucket.lengths = d.lengths.to(device_, at::kLong).contiguous();
      bucket.labels = d.labels.to(device_, at::kLong).contiguous();
      bucket.counter = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(device_));
    } else {
      bucket.tokens.copy_(d.tokens);
      bucket.lengths.copy_(d.lengths);
      bucket.labels.copy_(d.labels);
    }
  }
}

namespace {
// Copies an epoch's row table into a bucket's static one (reallocated, and the
// bucket's graph dropped, only when its shape changes).
bool load_table(at::Tensor& table, const at::Tensor& rows, const c10::Device& device) {
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == at::kLong,
              "start_epoch: a row table must be (steps, rows) "
              "int64, got ",
              rows.sizes(), " ", rows.scalar_type());
  if (table.defined() && table.sizes() == rows.sizes()) {
    table.copy_(rows, /*non_blocking=*/rows.is_pinned());
    return false;
  }
  table = rows.to(device).contiguous().clone();
  return true;
}
}  // namespace

void MultiTaskSteps::start_epoch(const std::vector<at::Tensor>& rows, const std::vector<at::Tensor>& lm_rows) {
  TORCH_CHECK(rows.size() == buckets_.size(), "start_epoch: ", rows.size(), " row tables for ", buckets_.size(),
              " buckets");
  TORCH_CHECK(options_.shared_inputs() ? lm_rows.empty() : lm_rows.size() == buckets_.size(),
              options_.shared_inputs() ? "start_epoch: the tasks share their inputs, yet LM row tables were given"
                                       : "start_epoch: the LM task reads rows of its own: give a table per bucket");
  classification_sum_.zero_();
  lm_sum_.zero_();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bool changed = load_table(bucket.rows, rows[b], device_);
    if (!options_.shared_inputs()) changed = load_table(bucket.lm_rows, lm_rows[b], device_) || changed;
    if (changed) bucket.step.reset();
    bucket.counter.zero_();
  }
}

graphs::CapturedStep& MultiTaskSteps::bucket_step(size_t b) {
  TORCH_CHECK(b < buckets_.size(), "train_step: bucket ", b, " of ", buckets_.size());
  Bucket& bucket = buckets_[b];
  TORCH_CHECK(bucket.rows.defined(), "train_step: no row table for bucket ", b, " (call start_epoch first)");
  if (bucket.step) return *bucket.step;
  const std::string name = "multitask train (length " + std::to_string(bucket.tokens.size(1)) + ")";
  graphs::CaptureOptions capture = options_.capture();
  if (b >= options_.capacity()) {
    // Beyond the graphs this run keeps: eager, and the log says why (once).
    const graphs::GraphLog log = capture.log();
    const std::string why = "step '" + name + "' runs eagerly: " + std::to_string(options_.capacity()) +
                            " training graphs are kept (capacity), this is bucket " + std::to_string(b + 1);
    capture.capture(false).log([log, why](const std::string&) {
      if (log) log(why);
    });
  }
  Bucket* d = &bucket;
  bucket.step = std::make_unique<graphs::CapturedStep>(
      name, device_, std::vector<graphs::StaticInput>{},
      [this, d](const std::vector<at::Tensor>&) {
        // The step's rows: row (counter mod S_b) of the epoch's table; then counter + 1.
        const at::Tensor at_step = d->counter.remainder(d->rows.size(0)).view({1});
        const at::Tensor rows = d->rows.index_select(0, at_step).view({-1});
        std::vector<at::Tensor> in{d->tokens.index_select(0, rows), d->lengths.index_select(0, rows),
                                   d->labels.index_select(0, rows)};
        if (!options_.shared_inputs()) {
          const at::Tensor lm = d->lm_rows.index_select(0, at_step).view({-1});
          in.push_back(d->tokens.index_select(0, lm));
          in.push_back(d->lengths.index_select(0, lm));
        }
        d->counter.add_(1);
        train_body(in);
      },
      capture, pool_);
  return *bucket.step;
}

void MultiTaskSteps::train_step(size_t bucket) { bucket_step(bucket).run(); }

size_t MultiTaskSteps::training_graphs() const {
  size_t n = 0;
  for (const Bucket& b : buckets_) n += b.step ? 1 : 0;
  return n;
}

void MultiTaskSteps::start_evaluation() {
  confusion_.zero_();
  lm_nll_sum_.zero_();
  lm_tokens_.zero_();
}

void MultiTaskSteps::evaluate(const at::Tensor& tokens, const at::Tensor& lengths, const at::Tensor& labels) {
  TORCH_CHECK(tokens.dim() == 2 && lengths.dim() == 1 && labels.dim() == 1 && lengths.size(0) == tokens.size(0) &&
                  labels.size(0) == tokens.size(0),
              "evaluate: expected tokens (N, T), lengths (N) and labels (N), got ", tokens.sizes(), ", ",
              lengths.sizes(), " and ", labels.sizes());
  const int64_t N = tokens.size(0), E = options_.eval_batch_size();
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  for (int64_t first = 0; first < N; first += E) {
    const int64_t n = std::min(E, N - first);
    if (n == E) {
      eval_->run(
          {tokens.narrow(0, first, n), lengths.narrow(0, first, n), labels.narrow(0, first, n), at::ones({E}, longs)});
      continue;
    }
    // The last batch wraps around to the bucket's first rows; those extra rows get
    // weight 0 and length 1 (no LM targets, no confusion count).
    const at::Tensor rows = at::arange(first, first + E, longs).remainder(N);  // (E)
    const at::Tensor real = at::arange(E, longs) < n;                          // (E) bool
    eval_->run({tokens.index_select(0, rows), at::where(real, lengths.index_select(0, rows), 1),
                labels.index_select(0, rows), real.to(at::kLong)});
  }
}

}  // namespace packtrain::runtime
