// EnsembleSteps: a packed ensemble's training and evaluation, captured. Composes
// ensemble/ (model, optimizer, packed steps) with graphs/ (captured steps in one
// shared pool, device-resident batches, asynchronous readback):
//
//   train: U steps per graph replay (unrolled), each gathering its batch on the
//          device by the batcher's step counter; an epoch's remainder of fewer than
//          U steps replays a one-step graph. Losses accumulate on the device and are
//          copied back every `readback_steps` steps without waiting.
//   eval:  forward and per-member loss sums over fixed-size batches through a graph
//          cache keyed by shape (the last partial batch gets its own graph).
//
// On CPU, or with capture off, the same functions run eagerly, call for call.
#pragma once

#include "packtrain/ensemble/optimizers/packed_optimizer.h"
#include "packtrain/ensemble/packed_model.h"
#include "packtrain/ensemble/packed_step.h"
#include "packtrain/graphs/async_readback.h"
#include "packtrain/graphs/captured_step.h"
#include "packtrain/graphs/device_batcher.h"
#include "packtrain/graphs/graph_cache.h"

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <deque>
#include <functional>
#include <memory>
#include <vector>

namespace packtrain::runtime {

// Steps per replay of the unrolled training graph. Provisional: to be set from the
// PackedGraphUnrolled benchmark on a GPU (benchmarks/RESULTS.md).
inline constexpr int64_t kDefaultUnroll = 8;

struct EnsembleStepsOptions {
  /// Example: EnsembleStepsOptions().batch_size(64).unroll(16).order(graphs::BatchOrder::kBootstrap)
  TORCH_ARG(int64_t, batch_size) = 128;
  TORCH_ARG(graphs::BatchOrder, order) = graphs::BatchOrder::kShared;
  TORCH_ARG(ensemble::LossKind, loss) = ensemble::LossKind::kGaussianNLL;
  TORCH_ARG(double, min_variance) = 1e-6;
  TORCH_ARG(int64_t, unroll) = kDefaultUnroll;
  TORCH_ARG(int64_t, eval_batch_size) = 1024;
  TORCH_ARG(int64_t, readback_steps) = 0;  // copy losses back every N steps; 0: once per epoch
  TORCH_ARG(uint64_t, seed) = 0;           // the batch orders' seed
  TORCH_ARG(graphs::CaptureOptions, capture) = {};
  // Data parallel: this rank trains on its shard_index-th of shard_count equal parts
  // of every (global) batch, and gradient_hook (e.g. an all-reduce averaging the
  // flat gradients) runs between backward and the optimizer.
  TORCH_ARG(int64_t, shard_index) = 0;
  TORCH_ARG(int64_t, shard_count) = 1;
  TORCH_ARG(ensemble::GradientHook, gradient_hook) = {};
  // Called on the host after each replay (or eager step) is enqueued, with the
  // 1-based numbers of its first and last step: a data-parallel CUDA run registers
  // the replay's all-reduces with its collective deadline here.
  TORCH_ARG(std::function<void(int64_t first_step, int64_t last_step)>, after_launch) = {};

 public:
  void validate() const;
};

// Mean training losses over a run of steps, per member, on the host.
struct LossReport {
  int64_t first_step = 0;  // steps taken before this run
  int64_t steps = 0;
  at::Tensor mean;  // (K) float64, CPU
};

class EnsembleSteps {
 public:
  // `data`: {x (N, I), y (N, ...)} (any device; copied to the model's device once).
  EnsembleSteps(ensemble::PackedModel& model, ensemble::PackedOptimizer& optimizer, std::vector<at::Tensor> data,
                EnsembleStepsOptions options);
  ~EnsembleSteps();

  const EnsembleStepsOptions& options() const { return options_; }
  int64_t steps_per_epoch() const { return batcher_.batches_per_epoch(); }
  int64_t steps_taken() const { return steps_taken_; }

  // One epoch: a fresh order drawn on the device, then steps_per_epoch() steps in
  // replays of U (and single steps for the remainder). Never waits for the device.
  void run_epoch();
  // `steps` more steps of the current epoch's order (they wrap around within it).
  void run_steps(int64_t steps);
  // Draws the next epoch's order (run_epoch() = start_epoch() + run_steps(all)).
  void start_epoch();

  // Loss reports whose copies have landed (no wait), or all of them (waits).
  std::vector<LossReport> poll_losses();
  std::vector<LossReport> wait_losses();

  // Per-member mean loss over (x, y), through the eval graphs. Returns (K) float64
  // on the device (read it when you need it).
  at::Tensor evaluate(const at::Tensor& x, const at::Tensor& y);

  // Re-initializes members in place (all, or where `which` is true): weights from
  // `model_seed`, optimizer state and step counts cleared; with `order_seed`, the
  // batch orders restart too. No graph is re-captured.
  void reinitialize(uint64_t model_seed, const at::Tensor& which = {});
  void reseed_order(uint64_t order_seed) { batcher_.reseed(order_seed); }

  graphs::CapturedStep& unrolled_step() { return *unrolled_; }
  graphs::CapturedStep& single_step() { return *single_; }
  graphs::DeviceBatcher& batcher() { return batcher_; }
  const std::shared_ptr<graphs::GraphPool>& pool() const { return pool_; }

 private:
  void train_steps(int64_t count);  // the body of a captured train step
  void after_steps(int64_t count);  // readback bookkeeping

  ensemble::PackedModel* model_;
  ensemble::PackedOptimizer* optimizer_;
  EnsembleStepsOptions options_;
  graphs::DeviceBatcher batcher_;
  std::shared_ptr<graphs::GraphPool> pool_;
  at::Tensor loss_sum_;  // (K) float64 on the device, since the last readback
  at::Tensor eval_sum_;  // (K) float64 on the device
  std::unique_ptr<graphs::CapturedStep> unrolled_;
  std::unique_ptr<graphs::CapturedStep> single_;
  std::unique_ptr<graphs::GraphCache> eval_;
  graphs::AsyncReadback readback_;
  std::deque<LossReport> in_flight_;  // reports whose `mean` is still on its way
  int64_t steps_taken_ = 0;
  int64_t steps_since_readback_ = 0;
};

}  // namespace packtrain::runtime
