// MultiTaskTrainer's evaluation (one process or pipelined) and scoring.
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"

#include "multitask_trainer_internal.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/distributed/pipeline_groups.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/trainers/multitask/multitask_pipeline.h"
#include "packtrain/runtime/trainers/multitask/multitask_steps.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

namespace packtrain::runtime {

namespace {

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

}  // namespace

TaskMetrics MultiTaskTrainer::evaluate(const LabelledTexts& data) {
  int64_t truncated = 0;
  const std::vector<Bucket> buckets = tokenize(data, &truncated);
  if (pipeline_) return evaluate_pipelined(buckets);
  const graphs::PoolStreamScope on_trainer_stream(*steps_->pool());
  steps_->start_evaluation();
  for (const Bucket& b : buckets) steps_->evaluate(b.tokens, b.lengths, b.labels);
  return task_metrics(steps_->confusion(), steps_->lm_nll_sum(), steps_->lm_tokens().item<int64_t>());
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
      counts.narrow(0, 0, C * C).index_add_(0, b.labels.narrow(0, first, n) * C + predicted, at::ones({n}, reals));
      const at::Tensor targets = ensemble::lm_target_count(batch);
      counts.narrow(0, C * C, K)
          .add_(ensemble::packed_lm_loss(model_->lm_logits(hidden), batch).to(at::kDouble) * targets.to(at::kDouble));
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

at::Tensor MultiTaskTrainer::score(const std::vector<std::string>& texts) { return member_scores(texts).mean(0); }

at::Tensor MultiTaskTrainer::member_scores(const std::vector<std::string>& texts) {
  if (pipeline_) {
    throw DataError(
        "score and generate need the whole model: load the pipeline run's checkpoint in one process "
        "(packtrain multitask score CHECKPOINT assembles its stages)");
  }
  LabelledTexts data;
  data.texts = texts;
  data.labels.assign(texts.size(), 0);
  data.source = "score";
  int64_t truncated = 0;
  const std::vector<Bucket> buckets = tokenize(data, &truncated);
  const int64_t K = options_.model().members();
  at::Tensor out = at::zeros({K, static_cast<int64_t>(texts.size()), options_.model().classes()}, at::kDouble);
  at::NoGradGuard no_grad;
  const int64_t E = options_.eval_batch_size();
  for (const Bucket& b : buckets) {
    for (int64_t first = 0; first < b.size(); first += E) {
      const int64_t n = std::min(E, b.size() - first);
      const at::Tensor tokens = b.tokens.narrow(0, first, n);
      const at::Tensor probabilities =
          at::softmax(model_->classify(model_->trunk(tokens), b.lengths.narrow(0, first, n)), -1);  // (K, n, C)
      const at::Tensor rows = at::tensor(std::vector<int64_t>(b.index.begin() + first, b.index.begin() + first + n));
      out.index_copy_(1, rows, probabilities.to(at::kCPU, at::kDouble));
    }
  }
  return out;
}

}  // namespace packtrain::runtime
