#include "runtime/ensemble_trainer.h"

#include "ensemble/optimizers/adam.h"
#include "ensemble/packed_loss.h"
#include "profiling/nvtx.h"
#include "runtime/data_error.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <numbers>
#include <string>

namespace packtrain::runtime {

void EnsembleTrainerOptions::validate() const {
  TORCH_CHECK(members() > 0, "members must be positive, got ", members());
  TORCH_CHECK(epochs() > 0, "epochs must be positive, got ", epochs());
  TORCH_CHECK(batch_size() > 0, "batch size must be positive, got ", batch_size());
  TORCH_CHECK(lr() > 0, "learning rate must be positive, got ", lr());
  TORCH_CHECK(min_variance() >= 0, "min variance must be >= 0, got ", min_variance());
}

EnsembleTrainer::EnsembleTrainer(EnsembleTrainerOptions options) : options_(options) { options_.validate(); }

EnsembleTrainer::~EnsembleTrainer() = default;

void EnsembleTrainer::fit(const at::Tensor& x, const at::Tensor& y, const EpochCallback& on_epoch) {
  TORCH_CHECK(x.dim() == 2 && y.dim() == 2 && y.size(1) == 1 && x.size(0) == y.size(0),
              "fit: expected x (N, I) and y (N, 1), got ", x.sizes(), " and ", y.sizes());
  const int64_t N = x.size(0);
  if (options_.batch_size() > N) {
    throw DataError("batch size " + std::to_string(options_.batch_size()) + " is larger than the training set (" +
                    std::to_string(N) + " rows)");
  }
  x_scale_ = Standardizer::fit(x);
  y_scale_ = Standardizer::fit(y);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(options_.device());
  const at::Tensor xs = x_scale_.transform(x).to(f32);  // the whole set lives on the device
  const at::Tensor ys = y_scale_.transform(y).to(f32);

  model_ = std::make_unique<ensemble::PackedMLP>(ensemble::PackedMLPOptions(x.size(1), 2)
                                                     .members(options_.members())
                                                     .hidden(options_.hidden())
                                                     .depth(options_.depth())
                                                     .activation(options_.activation())
                                                     .seed(options_.seed())
                                                     .device(options_.device()));
  optimizer_ = std::make_unique<ensemble::PackedAdam>(
      model_->parameters(), ensemble::adamw_options().lr(options_.lr()).weight_decay(options_.weight_decay()));

  auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed() ^ 0x5DEECE66Dull);
  const int64_t B = options_.batch_size();
  const int64_t batches = N / B;  // static shapes: the last partial batch is dropped
  model_->train(true);
  for (int64_t epoch = 0; epoch < options_.epochs(); ++epoch) {
    PACKTRAIN_NVTX_RANGE("epoch");
    const at::Tensor order = at::randperm(N, generator, at::kLong).to(options_.device());
    at::Tensor loss_sum = at::zeros({}, f32);
    for (int64_t b = 0; b < batches; ++b) {
      PACKTRAIN_NVTX_RANGE("step");
      const at::Tensor index = order.narrow(0, b * B, B);
      const at::Tensor xb = xs.index_select(0, index);
      const at::Tensor yb = ys.index_select(0, index);
      model_->parameters().zero_grad();
      const at::Tensor losses = ensemble::packed_gaussian_nll_loss(model_->forward(xb), yb, options_.min_variance());
      const at::Tensor total = losses.sum();
      total.backward();
      optimizer_->step();
      loss_sum.add_(total.detach());
      ++steps_taken_;
    }
    if (on_epoch) {
      on_epoch(epoch, loss_sum.item<double>() / static_cast<double>(batches * options_.members()));
    }
  }
  model_->train(false);
}

EnsemblePrediction EnsembleTrainer::predict(const at::Tensor& x) const {
  TORCH_CHECK(model_, "predict: the ensemble has not been trained (call fit first)");
  at::NoGradGuard no_grad;
  const at::Tensor xs = x_scale_.transform(x).to(at::TensorOptions().dtype(at::kFloat).device(options_.device()));
  const auto head = ensemble::gaussian_head(model_->forward(xs), options_.min_variance());
  const double y_mean = y_scale_.mean.item<double>(), y_std = y_scale_.std.item<double>();
  EnsemblePrediction out;
  out.member_mean = (head.mean.squeeze(2).to(at::kDouble) * y_std + y_mean).cpu();       // (K, N)
  out.member_variance = (head.variance.squeeze(2).to(at::kDouble) * (y_std * y_std)).cpu();
  out.mean = out.member_mean.mean(0);
  out.variance = (out.member_variance + out.member_mean.square()).mean(0) - out.mean.square();
  out.variance.clamp_min_(0);
  return out;
}

namespace {
double gaussian_nll(const at::Tensor& mean, const at::Tensor& variance, const at::Tensor& y) {
  const double half_log_2pi = 0.5 * std::log(2 * std::numbers::pi);
  const at::Tensor var = variance.clamp_min(1e-12);
  return (0.5 * (var.log() + (y - mean).square() / var) + half_log_2pi).mean().item<double>();
}
}  // namespace

EnsembleMetrics EnsembleTrainer::evaluate(const at::Tensor& x, const at::Tensor& y) const {
  const EnsemblePrediction p = predict(x);
  const at::Tensor target = y.reshape({-1}).to(at::kDouble);
  EnsembleMetrics m;
  for (int64_t k = 0; k < p.member_mean.size(0); ++k) {
    m.members.push_back({(p.member_mean[k] - target).square().mean().sqrt().item<double>(),
                         gaussian_nll(p.member_mean[k], p.member_variance[k], target)});
  }
  m.ensemble = {(p.mean - target).square().mean().sqrt().item<double>(), gaussian_nll(p.mean, p.variance, target)};
  return m;
}

}  // namespace packtrain::runtime
