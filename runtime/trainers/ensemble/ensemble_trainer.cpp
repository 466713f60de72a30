#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"

#include "packtrain/ensemble/architectures.h"
#include "packtrain/ensemble/member_seed.h"

#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/optimizers/sgd.h"
#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/fingerprint.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_steps.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_validation.h"
#include "packtrain/runtime/trainers/ensemble/hyperparameter_sweep.h"
#include "packtrain/runtime/trainers/uncertainty/variance_calibration.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

// The ensemble trainer's assembly (prepare: standardization, pack, steps) and its
// epoch loop with the per-member state machine (early stopping, divergence, best
// weights) and data-parallel hooks. Predictions and metrics: ensemble_predictions.cpp;
// checkpoints and member selection: ensemble_checkpoint.cpp.
namespace packtrain::runtime {

namespace {

ensemble::LossKind loss_kind(Head head) {
  switch (head) {
    case Head::kMean: return ensemble::LossKind::kMSE;
    case Head::kGaussian: return ensemble::LossKind::kGaussianNLL;
    case Head::kClassification: return ensemble::LossKind::kCrossEntropy;
  }
  return ensemble::LossKind::kMSE;
}

// Host staging for the once-per-epoch transfers: page-locked when the device is a
// GPU, so a copy is one DMA (pageable memory stages through a driver buffer and
// blocks the host); the caching host allocator keeps a freed pinned block alive
// until the copy that reads it has run.
template <typename T>
at::Tensor host_tensor(const std::vector<T>& values, const c10::Device& device) {
  const auto options = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value).pinned_memory(device.is_cuda());
  at::Tensor t = at::empty({static_cast<int64_t>(values.size())}, options);
  std::copy(values.begin(), values.end(), t.data_ptr<T>());
  return t;
}
at::Tensor to_device(const at::Tensor& host, const c10::Device& device) {
  return device.is_cuda() ? host.to(device, /*non_blocking=*/true) : host;
}
// One device->host copy (into pinned memory on a GPU), waited for: the values
// decide this epoch's member states.
std::vector<double> read_to_host(const at::Tensor& t) {
  at::Tensor host = t;
  if (t.is_cuda()) {
    host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    host.copy_(t, /*non_blocking=*/true);
    c10::cuda::getCurrentCUDAStream(t.device().index()).synchronize();
  }
  host = host.to(at::kDouble).contiguous();
  return {host.data_ptr<double>(), host.data_ptr<double>() + host.numel()};
}

// Copies the parameter rows of `members` from the flat buffer `from` into `to`
// (both in `parameters`' layout), in place.
void copy_members(const ensemble::PackedParameters& parameters, const at::Tensor& to, const at::Tensor& from,
                  const std::vector<int64_t>& members) {
  if (members.empty()) return;
  const at::Tensor idx = to_device(host_tensor(members, to.device()), to.device());
  const std::vector<at::Tensor> dst = parameters.blocks(to), src = parameters.blocks(from);
  for (size_t i = 0; i < dst.size(); ++i) dst[i].index_copy_(0, idx, src[i].index_select(0, idx));
}

void check_xy(const at::Tensor& x, const at::Tensor& y, const char* what) {
  TORCH_CHECK(x.defined() && y.defined() && x.dim() == 2 && y.dim() == 2 && y.size(1) == 1 && x.size(0) == y.size(0),
              what, ": expected x (N, I) and y (N, 1), got ", x.defined() ? x.sizes() : c10::IntArrayRef{}, " and ",
              y.defined() ? y.sizes() : c10::IntArrayRef{});
}

}  // namespace

EnsembleTrainer::EnsembleTrainer(EnsembleTrainerOptions options) : options_(std::move(options)) { options_.validate(); }

EnsembleTrainer::~EnsembleTrainer() = default;

int64_t EnsembleTrainer::out_features() const {
  switch (options_.head()) {
    case Head::kMean: return 1;
    case Head::kGaussian: return 2;
    case Head::kClassification: return static_cast<int64_t>(classes_.size());
  }
  return 1;
}

void EnsembleTrainer::build_model(int64_t in_features) {
  in_features_ = in_features;
  ensemble::PackSpec spec;
  spec.in_features = in_features;
  spec.out_features = out_features();
  spec.members = options_.members();
  spec.hidden = options_.hidden();
  spec.depth = options_.depth();
  spec.activation = options_.activation();
  spec.layer_norm = options_.layer_norm();
  spec.dropout = options_.dropout();
  spec.member_dropout = options_.member_dropout();
  spec.member_hidden = options_.member_hidden();
  spec.input_shape = options_.input_shape();
  spec.channels = options_.channels();
  spec.member_channels = options_.member_channel_lists();
  spec.kernel_size = options_.kernel();
  spec.stride = options_.stride();
  spec.padding = options_.padding();
  spec.pool = options_.pool();
  spec.norm_groups = options_.norm_groups();
  spec.seed = options_.seed();
  spec.first_member = options_.first_member();
  spec.device = options_.device();
  model_ = ensemble::architecture(options_.architecture()).make(spec);
  model_->set_precision(options_.precision());
  model_->train(false);
  members_.assign(options_.members(), MemberState{});
}

at::Tensor EnsembleTrainer::encode_targets(const at::Tensor& y, const char* what) const {
  if (options_.head() != Head::kClassification) {
    return y_scale_.transform(y).to(at::TensorOptions().dtype(at::kFloat).device(options_.device()));
  }
  return class_indices(y, classes_, what).to(options_.device());
}

void EnsembleTrainer::fit(const at::Tensor& x, const at::Tensor& y, const at::Tensor& val_x, const at::Tensor& val_y,
                          const EpochCallback& on_epoch) {
  prepare(x, y, val_x, val_y);
  train(on_epoch);
}

namespace {

// Shapes of the training and validation rows; a patience set without validation
// rows is refused here, before anything is built.
void check_inputs(const EnsembleTrainerOptions& options, const at::Tensor& x, const at::Tensor& y,
                  const at::Tensor& val_x, const at::Tensor& val_y) {
  check_xy(x, y, "training data");
  resolved_patience(options, val_x.defined() && val_x.size(0) > 0);  // a set patience needs validation rows
  if (val_x.defined() || val_y.defined()) {
    check_xy(val_x, val_y, "validation data");
    TORCH_CHECK(val_x.size(1) == x.size(1), "validation data have ", val_x.size(1), " features, training data ",
                x.size(1));
  }
}

// The static batch every step and captured graph is built for: the batch size, or
// all N rows of a smaller training set (said once, when it changes).
int64_t static_batch(const EnsembleTrainerOptions& options, int64_t N, int64_t previous) {
  const int64_t batch = std::min(options.batch_size(), N);
  if (batch < options.batch_size() && batch != previous && options.log()) {
    options.log()("batch size " + std::to_string(options.batch_size()) + " is larger than the training set (" +
                  std::to_string(N) + " rows): training with batches of " + std::to_string(N));
  }
  return batch;
}

// The standardization of the fitted rows (and a classifier's classes, from every
// row the trainer holds: active learning labels more of them later, and the output
// layer is fixed now). Other rows are standardized with these statistics: each must
// stay finite in float32.
struct FittedScales {
  Standardizer x, y;
  std::vector<double> classes;
};
FittedScales fit_scales(const EnsembleTrainerOptions& options, const at::Tensor& x, const at::Tensor& y,
                        const at::Tensor& val_x, const at::Tensor& val_y, const at::Tensor& fit_rows) {
  FittedScales f;
  f.x = Standardizer::fit(fit_rows.defined() ? x.index_select(0, fit_rows) : x, "training features");
  if (fit_rows.defined()) f.x.check_representable(x, "training features");
  if (val_x.defined()) f.x.check_representable(val_x, "validation features");
  if (options.head() == Head::kClassification) {
    const at::Tensor labels = std::get<0>(at::_unique(y.reshape({-1}), /*sorted=*/true)).contiguous();
    f.classes.assign(labels.data_ptr<double>(), labels.data_ptr<double>() + labels.numel());
    if (f.classes.size() < 2) {
      throw DataError("classification needs at least 2 classes in the training data, got " +
                      std::to_string(f.classes.size()));
    }
  } else {
    f.y = Standardizer::fit(fit_rows.defined() ? y.index_select(0, fit_rows) : y, "training targets");
    if (fit_rows.defined()) f.y.check_representable(y, "training targets");
    if (val_y.defined()) f.y.check_representable(val_y, "validation targets");
  }
  return f;
}

// Data parallel: the group is on the trainer's device and the batch splits equally.
void check_data_parallel(const distributed::ProcessGroup& group, const EnsembleTrainerOptions& options, int64_t batch,
                         int64_t N) {
  const int64_t world = group.world_size();
  if (options.device().is_cuda() && group.device() != options.device()) {
    throw DataError("data-parallel training on " + options.device().str() + " needs the process group joined on " +
                    "that device (its gradients go over NCCL there); it was joined on " + group.device().str());
  }
  if (batch % world != 0) {
    throw DataError(batch < options.batch_size()
                        ? "the training set's " + std::to_string(N) + " rows (fewer than the batch size " +
                              std::to_string(options.batch_size()) + ", so the global batch) do not split into " +
                              std::to_string(world) + " equal per-rank batches: give a batch size of at most " +
                              std::to_string(N) + " that " + std::to_string(world) + " divides"
                        : "the global batch " + std::to_string(batch) + " does not split into " +
                              std::to_string(world) + " equal per-rank batches");
  }
}

// The options' optimizer over the pack's parameters, with a sweep's per-member
// learning rates and weight decays.
std::unique_ptr<ensemble::PackedOptimizer> make_optimizer(const EnsembleTrainerOptions& options,
                                                          ensemble::PackedParameters& params) {
  std::unique_ptr<ensemble::PackedOptimizer> optimizer;
  switch (options.optimizer()) {
    case OptimizerKind::kAdamW:
      optimizer = std::make_unique<ensemble::PackedAdam>(
          params, ensemble::adamw_options().lr(options.lr()).weight_decay(options.weight_decay()));
      break;
    case OptimizerKind::kAdam:
      optimizer = std::make_unique<ensemble::PackedAdam>(
          params, ensemble::AdamOptions().lr(options.lr()).weight_decay(options.weight_decay()));
      break;
    case OptimizerKind::kSGD:
      optimizer = std::make_unique<ensemble::PackedSGD>(
          params, ensemble::SGDOptions(options.lr()).momentum(options.momentum()).weight_decay(options.weight_decay()));
      break;
  }
  if (!options.member_lr().empty()) optimizer->set_lr(at::tensor(options.member_lr(), at::kDouble));
  if (!options.member_weight_decay().empty()) {
    optimizer->set_weight_decay(at::tensor(options.member_weight_decay(), at::kDouble));
  }
  return optimizer;
}

}  // namespace

void EnsembleTrainer::prepare(const at::Tensor& x, const at::Tensor& y, const at::Tensor& val_x,
                              const at::Tensor& val_y, const at::Tensor& fit_rows) {
  check_inputs(options_, x, y, val_x, val_y);
  const int64_t N = x.size(0), batch = static_batch(options_, N, batch_size_);
  const size_t previous_classes = classes_.size();
  FittedScales scales = fit_scales(options_, x, y, val_x, val_y, fit_rows);
  x_scale_ = std::move(scales.x);
  if (options_.head() == Head::kClassification) {
    classes_ = std::move(scales.classes);
  } else {
    y_scale_ = std::move(scales.y);
  }
  if (!fit_rows.defined() && classes_.size() == previous_classes && reuse_steps(x, y, val_x, val_y)) return;
  if (group_ != nullptr) check_data_parallel(*group_, options_, batch, N);
  batch_size_ = batch;
  steps_.reset();  // its graphs refer to the previous model and optimizer
  build_model(x.size(1));
  if (group_ != nullptr) {
    at::Tensor flat = model_->parameters().flat();
    group_->broadcast_(flat, 0, "initial-weights broadcast");  // every rank starts from rank 0's weights
  }
  data_fingerprint_ = tensor_fingerprint({x.to(at::kDouble), y.to(at::kDouble)});
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(options_.device());
  const at::Tensor xs = x_scale_.transform(x).to(f32);  // the whole set lives on the device
  const at::Tensor ys = encode_targets(y, "training");
  val_x_ = val_x.defined() ? x_scale_.transform(val_x).to(f32) : at::Tensor();
  val_y_ = val_x.defined() ? encode_targets(val_y, "validation") : at::Tensor();
  val_targets_ = val_x.defined() ? val_y.reshape({-1}).to(at::kDouble).cpu().clone() : at::Tensor();
  optimizer_ = make_optimizer(options_, model_->parameters());
  steps_ = std::make_unique<EnsembleSteps>(
      *model_, *optimizer_, std::vector<at::Tensor>{xs, ys},
      EnsembleStepsOptions()
          .batch_size(batch_size_)
          .order(options_.order())
          .loss(loss_kind(options_.head()))
          .min_variance(options_.min_variance())
          .unroll(options_.unroll())
          .seed(options_.seed() ^ 0x5DEECE66Dull)
          .capture(graphs::CaptureOptions().capture(options_.capture()).log(options_.log()))
          .shard_index(group_ != nullptr ? group_->rank() : 0)
          .shard_count(group_ != nullptr ? group_->world_size() : 1)
          .gradient_hook(group_ != nullptr ? ensemble::GradientHook([this] {
            at::Tensor gradients = model_->parameters().flat_grad();
            // One all-reduce of the flat buffer per step: Gloo on CPU (a dead or stuck
            // peer ends it with an error naming the step, after the group's timeout at
            // most), NCCL on the capture stream on CUDA (recorded into the graph).
            group_->all_reduce_mean_(gradients, "gradient all-reduce", steps_->steps_taken() + step_offset_ + 1);
          })
                                           : ensemble::GradientHook())
          .after_launch(group_ != nullptr && options_.device().is_cuda()
                            ? std::function<void(int64_t, int64_t)>([this](int64_t first, int64_t last) {
                                // The replay's all-reduces get the group's deadline.
                                group_->watch_device("gradient all-reduce", first + step_offset_, last + step_offset_);
                              })
                            : std::function<void(int64_t, int64_t)>()));
  if (options_.schedule() != ensemble::LrScheduleKind::kConstant) {
    optimizer_->set_schedule(ensemble::LrSchedule()
                                 .kind(options_.schedule())
                                 .warmup_steps(options_.warmup_steps())
                                 .total_steps(options_.epochs() * steps_->steps_per_epoch())
                                 .min_factor(options_.min_lr_factor()));
  }
  best_params_ = val_x_.defined() ? model_->parameters().flat().detach().clone() : at::Tensor();
  resume_params_ = at::Tensor();
  variance_scale_ = 1.0;
  epoch_ = 0;
  steps_taken_ = 0;
  train_history_.clear();
  val_history_.clear();
}

int64_t EnsembleTrainer::patience() const {
  return resolved_patience(options_, val_x_.defined() && val_x_.size(0) > 0);
}

bool EnsembleTrainer::reuse_steps(const at::Tensor& x, const at::Tensor& y, const at::Tensor& val_x,
                                  const at::Tensor& val_y) {
  if (!steps_ || group_ != nullptr || x.size(1) != in_features_ || x.size(0) != steps_->batcher().rows() ||
      val_x.defined() != val_x_.defined() || (val_x.defined() && val_x.size(0) != val_x_.size(0))) {
    return false;
  }
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(options_.device());
  steps_->batcher().replace_data({x_scale_.transform(x).to(f32), encode_targets(y, "training")});
  val_x_ = val_x.defined() ? x_scale_.transform(val_x).to(f32) : at::Tensor();
  val_y_ = val_x.defined() ? encode_targets(val_y, "validation") : at::Tensor();
  val_targets_ = val_x.defined() ? val_y.reshape({-1}).to(at::kDouble).cpu().clone() : at::Tensor();
  data_fingerprint_ = tensor_fingerprint({x.to(at::kDouble), y.to(at::kDouble)});
  reinitialize(options_.seed());
  return true;
}

void EnsembleTrainer::check_ranks_agree(int64_t step) const {
  // All ranks learn whether any differs, so they fail together instead of hanging.
  group_->check_same(model_->parameters().flat(), "parameters",
                     "after step " + std::to_string(step) + " (epoch " + std::to_string(epoch_ + 1) + ")");
}

int64_t EnsembleTrainer::per_rank_batch() const { return batch_size_ / (group_ != nullptr ? group_->world_size() : 1); }

void EnsembleTrainer::set_training_rows(const at::Tensor& rows) {
  TORCH_CHECK(prepared(), "set_training_rows: call prepare() first");
  if (rows.size(-1) < batch_size_) {
    throw DataError("batch size " + std::to_string(batch_size_) + " is larger than the training set (" +
                    std::to_string(rows.size(-1)) + " rows)");
  }
  steps_->batcher().set_active_rows(rows);
}

void EnsembleTrainer::reinitialize(uint64_t seed, int64_t repeat_every) {
  TORCH_CHECK(prepared(), "reinitialize: call prepare() first");
  const int64_t K = options_.members();
  TORCH_CHECK(repeat_every >= 0 && (repeat_every == 0 || K % repeat_every == 0), "reinitialize: repeat_every ",
              repeat_every, " does not divide the ", K, " members");
  steps_->reinitialize(seed);
  if (repeat_every > 0) {
    at::NoGradGuard no_grad;
    for (const at::Tensor& p : model_->parameters().tensors()) {  // (K, ...) views of the flat buffer
      for (int64_t first = repeat_every; first < K; first += repeat_every) {
        p.narrow(0, first, repeat_every).copy_(p.narrow(0, 0, repeat_every));
      }
    }
  }
  steps_->reseed_order(seed ^ 0x5DEECE66Dull);
  optimizer_->set_mask(at::ones({options_.members()}, at::kBool));
  members_.assign(options_.members(), MemberState{});
  if (best_params_.defined()) best_params_.copy_(model_->parameters().flat().detach());
  resume_params_ = at::Tensor();
  variance_scale_ = 1.0;
  epoch_ = 0;
  steps_taken_ = 0;
  train_history_.clear();
  val_history_.clear();
}

bool EnsembleTrainer::train(const EpochCallback& on_epoch, bool stop_when_idle) {
  TORCH_CHECK(prepared(), "train: call prepare() first");
  bool go_on = true;
  if (resume_params_.defined()) {  // continue from the last trained weights, not the restored best
    at::NoGradGuard no_grad;
    model_->parameters().flat().detach().copy_(resume_params_);
    resume_params_ = at::Tensor();
  }
  variance_scale_ = 1.0;  // fitted again to the weights this run ends with
  model_->train(true);
  while (go_on && epoch_ < options_.epochs()) {
    const EpochReport report = run_epoch();
    if (on_epoch) go_on = on_epoch(report);
    if (report.active == 0 && stop_when_idle) break;
  }
  model_->train(false);
  const bool finished = go_on;
  if (finished && options_.restore_best() && patience() > 0) restore_best_weights();
  if (finished) recalibrate();
  return finished;
}

void EnsembleTrainer::recalibrate() {
  variance_scale_ = 1.0;
  if (options_.recalibration() != Recalibration::kVariance || options_.head() == Head::kClassification ||
      !val_x_.defined() || val_x_.size(0) == 0) {
    return;
  }
  const at::NoGradGuard no_grad;  // a prediction, not a step: no autograd graph
  const double s = fit_variance_scale(predict_standardized(val_x_.to(options_.device())), val_targets_);
  if (std::isfinite(s)) {
    variance_scale_ = s;
  } else if (options_.log()) {
    options_.log()(
        "recalibration: no variance scale could be fitted on the validation rows (a row of zero predicted "
        "variance, or non-finite predictions): predicting as trained");
  }
}

EpochReport EnsembleTrainer::run_epoch() {
  const graphs::PoolStreamScope on_trainer_stream(*steps_->pool());  // off the default stream (CUDA)
  EpochReport report;
  report.steps = steps_->steps_per_epoch();
  step_offset_ = steps_taken_ - steps_->steps_taken();  // steps of earlier sessions (resume)
  const bool data_parallel = group_ != nullptr && group_->world_size() > 1;
  // Dropout's masks from (seed, epoch): a resumed run drops what an uninterrupted one
  // would (data-parallel ranks draw the same per-member streams and keep their rows).
  model_->seed_dropout(ensemble::member_seed(ensemble::member_seed(options_.seed(), -2), epoch_));
  if (data_parallel && check_every_steps_ > 0) {
    // The epoch in pieces that end where a checksum comparison is due.
    steps_->start_epoch();
    for (int64_t done = 0; done < report.steps;) {
      const int64_t step = steps_taken_ + done;
      const int64_t n = std::min(check_every_steps_ - step % check_every_steps_, report.steps - done);
      steps_->run_steps(n);
      done += n;
      if ((steps_taken_ + done) % check_every_steps_ == 0) {
        group_->wait_device("gradient all-reduce");
        check_ranks_agree(steps_taken_ + done);
      }
    }
  } else {
    steps_->run_epoch();
  }
  // Data parallel on CUDA: the epoch's all-reduces completed, or an error naming the
  // steps that missed the deadline (a blocking read below would wait forever).
  if (group_ != nullptr) group_->wait_device("gradient all-reduce");
  // One loss report per epoch (readback every epoch); waiting here costs one
  // synchronization per epoch, which the per-member decisions below need anyway.
  const std::vector<LossReport> losses = steps_->wait_losses();
  TORCH_INTERNAL_ASSERT(!losses.empty(), "no loss report after an epoch");
  if (data_parallel) {
    at::Tensor mean = losses.back().mean.contiguous();
    group_->all_reduce_mean_(mean, "training-loss all-reduce", steps_taken_ + report.steps);  // each rank saw its shard
    check_ranks_agree(steps_taken_ + report.steps);
  }
  const std::vector<double> train = read_to_host(losses.back().mean);  // already on the host (async readback)
  // Validation: each member's loss; when its ensembles decide early stopping, from
  // one forward of the pack whose outputs also score the ensembles (update_ensembles).
  std::vector<double> val;
  at::Tensor val_raw;
  if (val_x_.defined() && options_.early_stopping() == EarlyStopping::kEnsemble && patience() > 0) {
    at::NoGradGuard no_grad;
    const bool was_training = model_->is_training();
    model_->train(false);
    val_raw = model_->forward(val_x_.to(options_.device()));
    model_->train(was_training);
    val = read_to_host(ensemble::packed_loss(loss_kind(options_.head()), val_raw, val_y_.to(options_.device()),
                                             options_.min_variance()));
  } else if (val_x_.defined()) {
    val = read_to_host(steps_->evaluate(val_x_, val_y_));
  }
  ++epoch_;
  steps_taken_ += report.steps;
  report.epoch = epoch_;
  report.epochs = options_.epochs();
  update_members(train, val, val_raw, report);
  return report;
}

void EnsembleTrainer::update_members(const std::vector<double>& train, const std::vector<double>& val_loss,
                                     const at::Tensor& val_raw, EpochReport& report) {
  const bool validating = !val_loss.empty();
  report.member_train_loss = train;
  report.member_val_loss = val_loss;
  double train_sum = 0, val_sum = 0;
  int64_t trained = 0, validated = 0;
  std::vector<int64_t> improved, to_restore;
  for (int64_t k = 0; k < options_.members(); ++k) {
    MemberState& m = members_[k];
    const double v = validating ? val_loss[k] : 0.0;
    if (m.status != MemberStatus::kTraining) {
      if (m.usable && validating && std::isfinite(v)) {
        val_sum += v;
        ++validated;
      }
      continue;
    }
    if (!std::isfinite(train[k]) || !std::isfinite(v)) {
      m.status = MemberStatus::kDiverged;
      m.ended_epoch = epoch_;
      m.usable = m.best_epoch > 0;
      if (m.usable) to_restore.push_back(k);
      report.events.push_back("member " + std::to_string(k) + " diverged (non-finite " +
                              (std::isfinite(train[k]) ? "validation" : "training") + " loss) at epoch " +
                              std::to_string(epoch_) + ": frozen" +
                              (m.usable ? ", best weights (epoch " + std::to_string(m.best_epoch) + ") restored"
                                        : ", left out of predictions"));
      continue;
    }
    train_sum += train[k];
    ++trained;
    if (!validating) continue;
    val_sum += v;
    ++validated;
    if (val_raw.defined()) continue;  // its ensemble decides (update_ensembles)
    if (v < m.best_loss) {
      m.best_loss = v;
      m.best_epoch = epoch_;
      improved.push_back(k);
    } else if (patience() > 0 && epoch_ - m.best_epoch >= patience()) {
      m.status = MemberStatus::kStopped;
      m.ended_epoch = epoch_;
      report.events.push_back("member " + std::to_string(k) + " stopped early at epoch " + std::to_string(epoch_) +
                              " (best validation loss " + std::to_string(m.best_loss) + " at epoch " +
                              std::to_string(m.best_epoch) + ")");
    }
  }
  if (validating && val_raw.defined()) update_ensembles(val_raw, improved, report);
  const at::Tensor flat = model_->parameters().flat().detach();
  if (best_params_.defined()) {
    copy_members(model_->parameters(), best_params_, flat, improved);
    copy_members(model_->parameters(), flat, best_params_, to_restore);
  }
  std::vector<bool> training(options_.members());
  for (int64_t k = 0; k < options_.members(); ++k) training[k] = members_[k].status == MemberStatus::kTraining;
  report.active = std::count(training.begin(), training.end(), true);
  optimizer_->set_mask(host_tensor(training, flat.device()));  // one host->device copy, not waited for
  report.train_loss = trained > 0 ? train_sum / static_cast<double>(trained) : std::nan("");
  if (validating) report.val_loss = validated > 0 ? val_sum / static_cast<double>(validated) : std::nan("");
  train_history_.push_back(report.train_loss);
  val_history_.push_back(report.val_loss);
}

void EnsembleTrainer::update_ensembles(const at::Tensor& val_raw, std::vector<int64_t>& improved, EpochReport& report) {
  for (const SweepConfiguration& ensemble : sweep_configurations(options_)) {
    std::vector<int64_t> live;  // still training (not stopped, diverged or deselected)
    for (int64_t k = ensemble.first_member; k < ensemble.first_member + ensemble.members; ++k) {
      if (members_[k].status == MemberStatus::kTraining) live.push_back(k);
    }
    if (live.empty()) continue;
    const double v = ensemble_validation_loss(val_raw, val_y_, options_.head(), options_.min_variance(), live);
    const MemberState& first = members_[live.front()];  // the ensemble's live members share their best
    const std::string who = live.size() == 1 ? "member " + std::to_string(live.front())
                                             : "members " + std::to_string(ensemble.first_member) + "-" +
                                                   std::to_string(ensemble.first_member + ensemble.members - 1);
    if (std::isfinite(v) && v < first.best_loss) {
      for (int64_t k : live) {
        members_[k].best_loss = v;
        members_[k].best_epoch = epoch_;
        improved.push_back(k);
      }
    } else if (epoch_ - first.best_epoch >= patience()) {
      for (int64_t k : live) {
        members_[k].status = MemberStatus::kStopped;
        members_[k].ended_epoch = epoch_;
      }
      report.events.push_back(who + " stopped early at epoch " + std::to_string(epoch_) +
                              " (best ensemble validation loss " + std::to_string(first.best_loss) + " at epoch " +
                              std::to_string(first.best_epoch) + ")");
    }
  }
}

void EnsembleTrainer::keep_members(int64_t first, int64_t count) {
  TORCH_CHECK(prepared(), "keep_members: call prepare() first");
  const int64_t K = options_.members();
  TORCH_CHECK(first >= 0 && count > 0 && first + count <= K, "keep_members: members [", first, ", ", first + count,
              ") are not within the pack's ", K);
  std::vector<bool> training(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) {
    MemberState& m = members_[static_cast<size_t>(k)];
    if (k < first || k >= first + count) {
      if (m.status == MemberStatus::kTraining || m.status == MemberStatus::kStopped) m.ended_epoch = epoch_;
      m.status = MemberStatus::kDeselected;
      m.usable = false;
    }
    training[static_cast<size_t>(k)] = m.status == MemberStatus::kTraining;
  }
  optimizer_->set_mask(host_tensor(training, model_->parameters().flat().device()));
  if (epoch_ > 0) recalibrate();  // the scale belongs to the members kept
}

void EnsembleTrainer::restore_best_weights() {
  if (!best_params_.defined()) return;
  std::vector<int64_t> with_best;
  for (int64_t k = 0; k < options_.members(); ++k) {
    if (members_[k].best_epoch > 0) with_best.push_back(k);
  }
  at::NoGradGuard no_grad;
  const at::Tensor flat = model_->parameters().flat().detach();
  resume_params_ = flat.clone();
  copy_members(model_->parameters(), flat, best_params_, with_best);
}

EnsembleMetrics EnsembleTrainer::evaluate(const at::Tensor& x, const at::Tensor& y) const {
  check_xy(x, y, "evaluation data");
  return ensemble_metrics(predict(x), y, options_.head(), classes_);
}

}  // namespace packtrain::runtime
