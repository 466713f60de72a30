// The multi-task steps: the two graph caches (training, eval) over one pool, the
// step functions they capture, and the evaluation's fixed-size batching.
#include "packtrain/runtime/trainers/multitask_steps.h"

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
      device_(model.options().device()),
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

  std::vector<graphs::InputKind> train_inputs{{"tokens", 2, at::kLong}, {"lengths", 1, at::kLong},
                                              {"labels", 1, at::kLong}};
  if (!options_.shared_inputs()) {
    train_inputs.push_back({"lm_tokens", 2, at::kLong});
    train_inputs.push_back({"lm_lengths", 1, at::kLong});
  }
  train_ = std::make_unique<graphs::GraphCache>(
      "multitask train", device_, std::move(train_inputs),
      [this](const std::vector<at::Tensor>& in) { train_body(in); }, options_.capture(), pool_, options_.capacity());
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
  const ensemble::MultiTaskLosses losses = ensemble::multitask_train_step(
      *model_, *optimizer_, classification, in[2], lm, options_.weights(), gradient_hook_);
  classification_sum_.add_(losses.classification);
  lm_sum_.add_(losses.language_model);
}

void MultiTaskSteps::eval_body(const std::vector<at::Tensor>& in) {
  at::NoGradGuard no_grad;
  PACKTRAIN_NVTX_RANGE("eval");
  const int64_t C = model_->options().classes();
  const ensemble::TextBatch batch{in[0], in[1]};
  const at::Tensor hidden = model_->trunk(batch.tokens);  // (K, E, T, d)
  const at::Tensor probabilities = at::softmax(model_->classify(hidden, batch.lengths), -1).mean(0);  // (E, C)
  const at::Tensor predicted = probabilities.argmax(-1);                                              // (E)
  confusion_.view({-1}).index_add_(0, in[2] * C + predicted, in[3]);
  const at::Tensor count = ensemble::lm_target_count(batch);
  lm_nll_sum_.add_(ensemble::packed_lm_loss(model_->lm_logits(hidden), batch).to(at::kDouble) * count);
  lm_tokens_.add_(count);
}

void MultiTaskSteps::start_epoch() {
  classification_sum_.zero_();
  lm_sum_.zero_();
}

void MultiTaskSteps::train_step(const at::Tensor& tokens, const at::Tensor& lengths, const at::Tensor& labels,
                                const at::Tensor& lm_tokens, const at::Tensor& lm_lengths) {
  if (options_.shared_inputs()) {
    TORCH_CHECK(!lm_tokens.defined() && !lm_lengths.defined(),
                "train_step: the tasks share their inputs (shared_inputs=true), yet LM rows were given");
    train_->run({tokens, lengths, labels});
    return;
  }
  TORCH_CHECK(lm_tokens.defined() && lm_lengths.defined(),
              "train_step: the LM task reads rows of its own (shared_inputs=false): give lm_tokens and lm_lengths");
  train_->run({tokens, lengths, labels, lm_tokens, lm_lengths});
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
      eval_->run({tokens.narrow(0, first, n), lengths.narrow(0, first, n), labels.narrow(0, first, n),
                  at::ones({E}, longs)});
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
