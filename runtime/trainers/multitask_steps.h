// MultiTaskSteps: a PackedTransformer's multi-task training and evaluation steps,
// captured. Owns the shared graph pool and two graphs::GraphCache (training, eval),
// one graph per length bucket's static shape; on CPU, or with capture off, the same
// step functions run eagerly, call for call, and the cache says why in the log.
//
//   train: one multi-task step (ensemble/multitask_step.h) on B rows of one bucket;
//          the per-member task losses accumulate on the device.
//   eval:  one bucket's rows in batches of exactly eval_batch_size rows (the last
//          one filled with rows of weight 0), so each bucket has one eval graph;
//          a confusion matrix and LM loss sums accumulate on the device.
#pragma once

#include "packtrain/ensemble/multitask_step.h"
#include "packtrain/ensemble/optimizers/packed_optimizer.h"
#include "packtrain/ensemble/packed_step.h"
#include "packtrain/ensemble/packed_transformer.h"
#include "packtrain/graphs/captured_step.h"
#include "packtrain/graphs/graph_cache.h"
#include "packtrain/graphs/graph_pool.h"

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace packtrain::runtime {

struct MultiTaskStepsOptions {
  /// Example: MultiTaskStepsOptions().shared_inputs(false).capture(graphs::CaptureOptions().log(my_log))
  TORCH_ARG(ensemble::TaskWeights, weights) = {};
  // true: both tasks read the same rows (one trunk forward); false: the LM task reads
  // rows of its own (two more inputs per training step, still one backward).
  TORCH_ARG(bool, shared_inputs) = true;
  TORCH_ARG(int64_t, eval_batch_size) = 64;
  // Whether to capture, warm-up calls, and where fallbacks to eager are logged.
  TORCH_ARG(graphs::CaptureOptions, capture) = {};
  // Shapes (buckets) each cache captures; further shapes run eagerly, logged once each.
  TORCH_ARG(size_t, capacity) = 8;

 public:
  // Throws c10::Error naming the offending field and value.
  void validate() const;
};

class MultiTaskSteps {
 public:
  // The model and optimizer must outlive the steps (the graphs hold their tensors).
  MultiTaskSteps(ensemble::PackedTransformer& model, ensemble::PackedOptimizer& optimizer,
                 MultiTaskStepsOptions options);
  ~MultiTaskSteps();
  MultiTaskSteps(const MultiTaskSteps&) = delete;
  MultiTaskSteps& operator=(const MultiTaskSteps&) = delete;

  const MultiTaskStepsOptions& options() const { return options_; }
  c10::Device device() const { return device_; }

  // Runs between backward and the optimizer in every training step (data parallel:
  // the flat gradients' all-reduce); empty: none. Set it before the first training
  // step: a captured graph keeps the hook it was captured with.
  void set_gradient_hook(ensemble::GradientHook hook) { gradient_hook_ = std::move(hook); }

  // Zeroes the training loss sums (call at the start of an epoch).
  void start_epoch();
  // One training step on B rows of one bucket of padded length T, all int64 on the
  // device: tokens (B, T), lengths (B), labels (B); without shared inputs also the
  // LM task's lm_tokens (B, T) and lm_lengths (B). Through the bucket's graph.
  void train_step(const at::Tensor& tokens, const at::Tensor& lengths, const at::Tensor& labels,
                  const at::Tensor& lm_tokens = {}, const at::Tensor& lm_lengths = {});
  // Per-member task losses summed over the steps since start_epoch(): (K) float64
  // on the device (handles to the accumulators: an in-place all-reduce updates them).
  const at::Tensor& classification_loss_sum() const { return classification_sum_; }
  const at::Tensor& lm_loss_sum() const { return lm_sum_; }

  // Zeroes the evaluation accumulators.
  void start_evaluation();
  // Adds one bucket's N rows, int64 on the device: tokens (N, T), lengths (N),
  // labels (N); in batches of eval_batch_size rows through the bucket's eval graph.
  void evaluate(const at::Tensor& tokens, const at::Tensor& lengths, const at::Tensor& labels);
  // Since start_evaluation(), on the device: (C, C) int64 counts of (true class,
  // predicted class) of the members' mean probabilities; (K) float64 LM negative
  // log-likelihood sums; () int64 LM target tokens.
  const at::Tensor& confusion() const { return confusion_; }
  const at::Tensor& lm_nll_sum() const { return lm_nll_sum_; }
  const at::Tensor& lm_tokens() const { return lm_tokens_; }

  // Step graphs made so far (one per bucket seen) for training and for evaluation.
  size_t training_graphs() const { return train_->size(); }
  size_t evaluation_graphs() const { return eval_->size(); }
  graphs::GraphCache& train_cache() { return *train_; }
  graphs::GraphCache& eval_cache() { return *eval_; }
  const std::shared_ptr<graphs::GraphPool>& pool() const { return pool_; }

 private:
  // The step functions the caches capture. Inputs in the caches' order:
  // train {tokens, lengths, labels[, lm_tokens, lm_lengths]}, eval {tokens,
  // lengths, labels, weights}.
  void train_body(const std::vector<at::Tensor>& in);
  void eval_body(const std::vector<at::Tensor>& in);

  ensemble::PackedTransformer* model_;
  ensemble::PackedOptimizer* optimizer_;
  MultiTaskStepsOptions options_;
  c10::Device device_;
  ensemble::GradientHook gradient_hook_;
  std::shared_ptr<graphs::GraphPool> pool_;
  at::Tensor classification_sum_, lm_sum_;         // (K) float64: this epoch's training losses
  at::Tensor confusion_, lm_nll_sum_, lm_tokens_;  // (C, C) int64, (K) float64, () int64
  std::unique_ptr<graphs::GraphCache> train_;
  std::unique_ptr<graphs::GraphCache> eval_;
};

}  // namespace packtrain::runtime
