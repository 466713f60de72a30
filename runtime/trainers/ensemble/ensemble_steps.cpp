#include "packtrain/runtime/trainers/ensemble/ensemble_steps.h"

#include "packtrain/profiling/nvtx.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace packtrain::runtime {

void EnsembleStepsOptions::validate() const {
  TORCH_CHECK(batch_size() > 0, "batch size must be positive, got ", batch_size());
  TORCH_CHECK(unroll() > 0, "unroll must be positive, got ", unroll());
  TORCH_CHECK(eval_batch_size() > 0, "eval batch size must be positive, got ", eval_batch_size());
  TORCH_CHECK(readback_steps() >= 0, "readback steps must be >= 0, got ", readback_steps());
  TORCH_CHECK(shard_count() >= 1 && shard_index() >= 0 && shard_index() < shard_count(), "shard ", shard_index(),
              " of ", shard_count(), " does not exist");
  TORCH_CHECK(batch_size() % shard_count() == 0, "the global batch (", batch_size(), ") must divide into ",
              shard_count(), " equal per-rank batches");
  TORCH_CHECK(min_variance() >= 0, "min variance must be >= 0, got ", min_variance());
}

EnsembleSteps::EnsembleSteps(ensemble::PackedModel& model, ensemble::PackedOptimizer& optimizer,
                             std::vector<at::Tensor> data, EnsembleStepsOptions options)
    : model_(&model),
      optimizer_(&optimizer),
      options_((options.validate(), options)),
      batcher_(std::move(data), model.device(), model.members(), options.batch_size(), options.order(), options.seed()),
      pool_(std::make_shared<graphs::GraphPool>(batcher_.device())) {
  TORCH_CHECK(&optimizer.parameters() == &model.parameters(),
              "EnsembleSteps: the optimizer does not hold this model's parameters");
  TORCH_CHECK(batcher_.data().size() == 2, "EnsembleSteps: expected data {x, y}, got ", batcher_.data().size(),
              " tensors");
  if (options_.shard_count() > 1) {  // dropout: this rank's rows of the global batch (train_steps)
    const int64_t rows = options_.batch_size() / options_.shard_count();
    model.dropout_rows(options_.shard_index() * rows, options_.batch_size());
  }
  const c10::Device device = batcher_.device();
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device);
  loss_sum_ = at::zeros({model.members()}, f64);
  eval_sum_ = at::zeros({model.members()}, f64);
  const int64_t U = options_.unroll();
  unrolled_ = std::make_unique<graphs::CapturedStep>(
      "train x" + std::to_string(U), device, std::vector<graphs::StaticInput>{},
      [this, U](const std::vector<at::Tensor>&) { train_steps(U); }, options_.capture(), pool_);
  single_ = U == 1 ? nullptr
                   : std::make_unique<graphs::CapturedStep>(
                         "train x1", device, std::vector<graphs::StaticInput>{},
                         [this](const std::vector<at::Tensor>&) { train_steps(1); }, options_.capture(), pool_);
  const at::Tensor& x = batcher_.data()[0];
  const at::Tensor& y = batcher_.data()[1];
  eval_ = std::make_unique<graphs::GraphCache>(
      "eval", device, std::vector<graphs::InputKind>{{"x", x.dim(), x.scalar_type()}, {"y", y.dim(), y.scalar_type()}},
      [this](const std::vector<at::Tensor>& in) {
        const bool was_training = model_->is_training();
        model_->train(false);
        const at::Tensor losses =
            ensemble::packed_eval_losses(*model_, in[0], in[1], options_.loss(), options_.min_variance());
        eval_sum_.add_(losses * static_cast<double>(in[0].size(0)));
        model_->train(was_training);
      },
      options_.capture(), pool_);
}

EnsembleSteps::~EnsembleSteps() = default;

void EnsembleSteps::train_steps(int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    std::vector<at::Tensor> batch = batcher_.next_batch();
    if (options_.shard_count() > 1) {
      // Rows are dim 0 of a shared batch, dim 1 of per-member batches (K, B, ...).
      const int64_t dim = options_.order() == graphs::BatchOrder::kShared ? 0 : 1;
      const int64_t rows = options_.batch_size() / options_.shard_count();
      for (at::Tensor& t : batch) t = t.narrow(dim, options_.shard_index() * rows, rows).contiguous();
    }
    const at::Tensor losses = ensemble::packed_train_step(*model_, *optimizer_, batch[0], batch[1], options_.loss(),
                                                          options_.min_variance(), options_.gradient_hook());
    loss_sum_.add_(losses);
  }
}

void EnsembleSteps::run_epoch() {
  PACKTRAIN_NVTX_RANGE("epoch");
  start_epoch();
  run_steps(steps_per_epoch());
}

void EnsembleSteps::start_epoch() { batcher_.start_epoch(); }

void EnsembleSteps::run_steps(int64_t steps) {
  TORCH_CHECK(steps >= 0, "run_steps: steps must be >= 0, got ", steps);
  const int64_t U = options_.unroll();
  for (int64_t done = 0; done < steps;) {
    if (steps - done >= U) {
      unrolled_->run();
      after_steps(U);
      done += U;
    } else {
      (single_ ? single_ : unrolled_)->run();
      after_steps(1);
      done += 1;
    }
  }
}

void EnsembleSteps::after_steps(int64_t count) {
  if (options_.after_launch()) options_.after_launch()(steps_taken_ + 1, steps_taken_ + count);
  steps_taken_ += count;
  steps_since_readback_ += count;
  const int64_t every = options_.readback_steps() > 0 ? options_.readback_steps() : steps_per_epoch();
  if (steps_since_readback_ < every) return;
  readback_.request(loss_sum_);
  loss_sum_.zero_();  // on the same stream, after the copy
  in_flight_.push_back({steps_taken_ - steps_since_readback_, steps_since_readback_, {}});
  steps_since_readback_ = 0;
}

namespace {
std::vector<LossReport> complete(std::deque<LossReport>& in_flight, std::vector<at::Tensor> sums) {
  std::vector<LossReport> out;
  for (at::Tensor& sum : sums) {
    LossReport report = std::move(in_flight.front());
    in_flight.pop_front();
    report.mean = sum.to(at::kDouble) / static_cast<double>(report.steps);
    out.push_back(std::move(report));
  }
  return out;
}
}  // namespace

std::vector<LossReport> EnsembleSteps::poll_losses() { return complete(in_flight_, readback_.poll()); }

std::vector<LossReport> EnsembleSteps::wait_losses() { return complete(in_flight_, readback_.wait()); }

at::Tensor EnsembleSteps::evaluate(const at::Tensor& x_in, const at::Tensor& y_in) {
  PACKTRAIN_NVTX_RANGE("eval");
  const c10::Device device = batcher_.device();
  const at::Tensor x = x_in.to(device, batcher_.data()[0].scalar_type());
  const at::Tensor y = y_in.to(device, batcher_.data()[1].scalar_type());
  TORCH_CHECK(x.dim() == batcher_.data()[0].dim() && y.dim() == batcher_.data()[1].dim() && x.size(0) == y.size(0) &&
                  x.size(0) > 0,
              "evaluate: expected x and y shaped like the training data with the same rows, got ", x.sizes(), " and ",
              y.sizes());
  eval_sum_.zero_();
  const int64_t rows = x.size(0), B = options_.eval_batch_size();
  for (int64_t start = 0; start < rows; start += B) {
    const int64_t n = std::min(B, rows - start);
    eval_->run({x.narrow(0, start, n), y.narrow(0, start, n)});
  }
  return eval_sum_ / static_cast<double>(rows);
}

void EnsembleSteps::reinitialize(uint64_t model_seed, const at::Tensor& which) {
  model_->reinitialize(model_seed, which);
  optimizer_->reset_state(which);
}

}  // namespace packtrain::runtime
