// MultiTaskSteps: a PackedTransformer's multi-task training and evaluation steps,
// captured. Owns the shared graph pool and two graphs::GraphCache (training, eval),
// one graph per length bucket's static shape; on CPU, or with capture off, the same
// step functions run eagerly, call for call, and the cache says why in the log.
//
//   train: one multi-task step (ensemble/multitask_step.h) on R rows of one bucket,
//          gathered inside the bucket's graph from the bucket's data on the device
//          by the epoch's row table and a device counter (as graphs::DeviceBatcher
//          does for tabular data): a step is one replay, no copies around it. The
//          per-member task losses accumulate on the device.
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

  // The training data the steps gather from, one entry per length bucket, int64 on
  // the device: tokens (N_b, T_b), lengths (N_b), labels (N_b). Kept by the steps
  // (their graphs read it in place): data of the same shapes is copied into it and
  // the graphs stay; other shapes drop them.
  struct TrainingBucket {
    at::Tensor tokens, lengths, labels;
  };
  void set_training_data(const std::vector<TrainingBucket>& buckets);
  // Starts an epoch: zeroes the training loss sums, rewinds the counters and loads
  // each bucket's row table — rows[b] (S_b, R) int64 (host or device): row numbers
  // of bucket b for its S_b steps of R rows, in the order they run; without shared
  // inputs lm_rows[b] likewise for the LM task. One copy per table.
  void start_epoch(const std::vector<at::Tensor>& rows, const std::vector<at::Tensor>& lm_rows = {});
  // One training step on bucket b's next R rows, through the bucket's graph.
  void train_step(size_t bucket);
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
  size_t training_graphs() const;
  size_t evaluation_graphs() const { return eval_->size(); }
  graphs::GraphCache& eval_cache() { return *eval_; }
  const std::shared_ptr<graphs::GraphPool>& pool() const { return pool_; }

 private:
  // A bucket's data, its epoch row tables and counter (static buffers its graph
  // reads), and its step, made at its first training step.
  struct Bucket {
    at::Tensor tokens, lengths, labels;
    at::Tensor rows, lm_rows;  // (S_b, R) int64
    at::Tensor counter;        // () int64: steps taken this epoch
    std::unique_ptr<graphs::CapturedStep> step;
  };
  graphs::CapturedStep& bucket_step(size_t b);
  // The step functions the graphs capture. Training inputs: {tokens, lengths,
  // labels[, lm_tokens, lm_lengths]} (gathered in the bucket's step); eval {tokens,
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
  std::vector<Bucket> buckets_;
  std::unique_ptr<graphs::GraphCache> eval_;
};

}  // namespace packtrain::runtime
