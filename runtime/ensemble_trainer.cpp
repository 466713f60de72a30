#include "runtime/ensemble_trainer.h"

#include "ensemble/optimizers/adam.h"
#include "ensemble/packed_loss.h"
#include "runtime/ensemble_steps.h"
#include "profiling/nvtx.h"
#include "runtime/data_error.h"

#include <ATen/ATen.h>
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
  TORCH_CHECK(unroll() > 0, "unroll must be positive, got ", unroll());
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

  steps_.reset();  // its graphs refer to the previous model and optimizer
  model_ = std::make_unique<ensemble::PackedMLP>(ensemble::PackedMLPOptions(x.size(1), 2)
                                                     .members(options_.members())
                                                     .hidden(options_.hidden())
                                                     .depth(options_.depth())
                                                     .activation(options_.activation())
                                                     .seed(options_.seed())
                                                     .device(options_.device()));
  optimizer_ = std::make_unique<ensemble::PackedAdam>(
      model_->parameters(), ensemble::adamw_options().lr(options_.lr()).weight_decay(options_.weight_decay()));

  steps_ = std::make_unique<EnsembleSteps>(
      *model_, *optimizer_, std::vector<at::Tensor>{xs, ys},
      EnsembleStepsOptions()
          .batch_size(options_.batch_size())
          .loss(ensemble::LossKind::kGaussianNLL)
          .min_variance(options_.min_variance())
          .unroll(options_.unroll())
          .seed(options_.seed() ^ 0x5DEECE66Dull)
          .capture(graphs::CaptureOptions().capture(options_.capture()).log(options_.log())));
  model_->train(true);
  const auto report = [&](const std::vector<LossReport>& reports) {
    for (const LossReport& r : reports) {
      if (on_epoch) on_epoch(r.first_step / steps_->steps_per_epoch(), r.mean.mean().item<double>());
    }
  };
  for (int64_t epoch = 0; epoch < options_.epochs(); ++epoch) {
    steps_->run_epoch();
    report(steps_->poll_losses());  // earlier epochs whose losses have landed; never waits
  }
  report(steps_->wait_losses());
  steps_taken_ = steps_->steps_taken();
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
