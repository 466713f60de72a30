#include "runtime/ensemble_trainer.h"

#include "runtime/distributed/process_group.h"

#include "ensemble/optimizers/adam.h"
#include "ensemble/optimizers/sgd.h"
#include "ensemble/packed_loss.h"
#include "runtime/checkpoint_file.h"
#include "runtime/data_error.h"
#include "runtime/ensemble_steps.h"

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <map>
#include <numbers>
#include <string>

namespace packtrain::runtime {

namespace fs = std::filesystem;

std::string_view to_string(MemberStatus status) {
  switch (status) {
    case MemberStatus::kTraining: return "training";
    case MemberStatus::kStopped: return "stopped";
    case MemberStatus::kDiverged: return "diverged";
  }
  return "?";
}

struct EnsembleTrainer::Checkpoint {
  fs::path path;
  c10::impl::GenericDict payload{c10::StringType::get(), c10::AnyType::get()};
};

namespace {

constexpr const char* kCheckpointFormat = "packtrain-trainer-1";

ensemble::LossKind loss_kind(Head head) {
  switch (head) {
    case Head::kMean: return ensemble::LossKind::kMSE;
    case Head::kGaussian: return ensemble::LossKind::kGaussianNLL;
    case Head::kClassification: return ensemble::LossKind::kCrossEntropy;
  }
  return ensemble::LossKind::kMSE;
}

// FNV-1a over the bytes of contiguous tensors: identifies the training data a
// checkpoint was made with, so a resume on other data is refused.
uint64_t fingerprint(std::initializer_list<at::Tensor> tensors) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const at::Tensor& t : tensors) {
    const at::Tensor c = t.contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  }
  return h;
}

// Copies the parameter rows of `members` from the flat buffer `from` into `to`
// (both in `parameters`' layout), in place.
void copy_members(const ensemble::PackedParameters& parameters, const at::Tensor& to, const at::Tensor& from,
                  const std::vector<int64_t>& members) {
  if (members.empty()) return;
  const at::Tensor idx = at::tensor(members, at::kLong).to(to.device());
  const std::vector<at::Tensor> dst = parameters.blocks(to), src = parameters.blocks(from);
  for (size_t i = 0; i < dst.size(); ++i) dst[i].index_copy_(0, idx, src[i].index_select(0, idx));
}

double gaussian_nll(const at::Tensor& mean, const at::Tensor& variance, const at::Tensor& y) {
  const double half_log_2pi = 0.5 * std::log(2 * std::numbers::pi);
  const at::Tensor var = variance.clamp_min(1e-12);
  return (0.5 * (var.log() + (y - mean).square() / var) + half_log_2pi).mean().item<double>();
}

double rmse(const at::Tensor& mean, const at::Tensor& y) { return (mean - y).square().mean().sqrt().item<double>(); }

void check_xy(const at::Tensor& x, const at::Tensor& y, const char* what) {
  TORCH_CHECK(x.defined() && y.defined() && x.dim() == 2 && y.dim() == 2 && y.size(1) == 1 && x.size(0) == y.size(0),
              what, ": expected x (N, I) and y (N, 1), got ", x.defined() ? x.sizes() : c10::IntArrayRef{}, " and ",
              y.defined() ? y.sizes() : c10::IntArrayRef{});
}

}  // namespace

EnsembleTrainer::EnsembleTrainer(EnsembleTrainerOptions options) : options_(std::move(options)) {
  options_.validate();
}

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
  model_ = std::make_unique<ensemble::PackedMLP>(ensemble::PackedMLPOptions(in_features, out_features())
                                                     .members(options_.members())
                                                     .hidden(options_.hidden())
                                                     .depth(options_.depth())
                                                     .activation(options_.activation())
                                                     .layer_norm(options_.layer_norm())
                                                     .dropout(options_.dropout())
                                                     .seed(options_.seed())
                                                     .first_member(options_.first_member())
                                                     .device(options_.device()));
  model_->train(false);
  members_.assign(options_.members(), MemberState{});
}

at::Tensor class_indices(const at::Tensor& y, const std::vector<double>& classes, const char* what) {
  const at::Tensor values = y.reshape({-1}).to(at::kDouble).contiguous();
  at::Tensor index = at::empty({values.size(0)}, at::kLong);
  const auto v = values.accessor<double, 1>();
  auto out = index.accessor<int64_t, 1>();
  for (int64_t r = 0; r < values.size(0); ++r) {
    const auto it = std::lower_bound(classes.begin(), classes.end(), v[r]);
    if (it == classes.end() || *it != v[r]) {
      throw DataError(std::string(what) + " data: label " + std::to_string(v[r]) + " (row " + std::to_string(r + 1) +
                      ") is not one of the " + std::to_string(classes.size()) + " classes seen in training");
    }
    out[r] = it - classes.begin();
  }
  return index;
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

void EnsembleTrainer::prepare(const at::Tensor& x, const at::Tensor& y, const at::Tensor& val_x,
                              const at::Tensor& val_y, const at::Tensor& fit_rows) {
  check_xy(x, y, "training data");
  if (val_x.defined() || val_y.defined()) {
    check_xy(val_x, val_y, "validation data");
    TORCH_CHECK(val_x.size(1) == x.size(1), "validation data have ", val_x.size(1), " features, training data ",
                x.size(1));
  }
  const int64_t N = x.size(0);
  if (options_.batch_size() > N) {
    throw DataError("batch size " + std::to_string(options_.batch_size()) + " is larger than the training set (" +
                    std::to_string(N) + " rows)");
  }
  const at::Tensor fx = fit_rows.defined() ? x.index_select(0, fit_rows) : x;
  const at::Tensor fy = fit_rows.defined() ? y.index_select(0, fit_rows) : y;
  x_scale_ = Standardizer::fit(fx);
  if (options_.head() == Head::kClassification) {
    const at::Tensor labels = std::get<0>(at::_unique(fy.reshape({-1}), /*sorted=*/true)).contiguous();
    classes_.assign(labels.data_ptr<double>(), labels.data_ptr<double>() + labels.numel());
    if (classes_.size() < 2) throw DataError("classification needs at least 2 classes in the training data, got " +
                                             std::to_string(classes_.size()));
  } else {
    y_scale_ = Standardizer::fit(fy);
  }
  const int64_t world = group_ != nullptr ? group_->world_size() : 1;
  if (group_ != nullptr) {
    if (options_.device().is_cuda() && group_->device() != options_.device()) {
      throw DataError("data-parallel training on " + options_.device().str() + " needs the process group joined on " +
                      "that device (its gradients go over NCCL there); it was joined on " + group_->device().str());
    }
    if (options_.batch_size() % world != 0) {
      throw DataError("the global batch " + std::to_string(options_.batch_size()) + " does not split into " +
                      std::to_string(world) + " equal per-rank batches");
    }
  }
  steps_.reset();  // its graphs refer to the previous model and optimizer
  build_model(x.size(1));
  if (group_ != nullptr) {
    at::Tensor flat = model_->parameters().flat();
    group_->broadcast_(flat, 0, "initial-weights broadcast");  // every rank starts from rank 0's weights
  }
  data_fingerprint_ = fingerprint({x.to(at::kDouble), y.to(at::kDouble)});
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(options_.device());
  const at::Tensor xs = x_scale_.transform(x).to(f32);  // the whole set lives on the device
  const at::Tensor ys = encode_targets(y, "training");
  val_x_ = val_x.defined() ? x_scale_.transform(val_x).to(f32) : at::Tensor();
  val_y_ = val_x.defined() ? encode_targets(val_y, "validation") : at::Tensor();

  ensemble::PackedParameters& params = model_->parameters();
  switch (options_.optimizer()) {
    case OptimizerKind::kAdamW:
      optimizer_ = std::make_unique<ensemble::PackedAdam>(
          params, ensemble::adamw_options().lr(options_.lr()).weight_decay(options_.weight_decay()));
      break;
    case OptimizerKind::kAdam:
      optimizer_ = std::make_unique<ensemble::PackedAdam>(
          params, ensemble::AdamOptions().lr(options_.lr()).weight_decay(options_.weight_decay()));
      break;
    case OptimizerKind::kSGD:
      optimizer_ = std::make_unique<ensemble::PackedSGD>(
          params, ensemble::SGDOptions(options_.lr()).momentum(options_.momentum()).weight_decay(options_.weight_decay()));
      break;
  }
  steps_ = std::make_unique<EnsembleSteps>(
      *model_, *optimizer_, std::vector<at::Tensor>{xs, ys},
      EnsembleStepsOptions()
          .batch_size(options_.batch_size())
          .order(options_.order())
          .loss(loss_kind(options_.head()))
          .min_variance(options_.min_variance())
          .unroll(options_.unroll())
          .seed(options_.seed() ^ 0x5DEECE66Dull)
          .capture(graphs::CaptureOptions().capture(options_.capture()).log(options_.log()))
          .shard_index(group_ != nullptr ? group_->rank() : 0)
          .shard_count(world)
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
  epoch_ = 0;
  steps_taken_ = 0;
  train_history_.clear();
  val_history_.clear();
}

void EnsembleTrainer::check_ranks_agree(int64_t step) const {
  // All ranks learn whether any differs, so they fail together instead of hanging.
  group_->check_same(model_->parameters().flat(), "parameters",
                     "after step " + std::to_string(step) + " (epoch " + std::to_string(epoch_ + 1) + ")");
}

int64_t EnsembleTrainer::per_rank_batch() const {
  return options_.batch_size() / (group_ != nullptr ? group_->world_size() : 1);
}

void EnsembleTrainer::set_training_rows(const at::Tensor& rows) {
  TORCH_CHECK(prepared(), "set_training_rows: call prepare() first");
  if (rows.size(-1) < options_.batch_size()) {
    throw DataError("batch size " + std::to_string(options_.batch_size()) + " is larger than the training set (" +
                    std::to_string(rows.size(-1)) + " rows)");
  }
  steps_->batcher().set_active_rows(rows);
}

void EnsembleTrainer::reinitialize(uint64_t seed) {
  TORCH_CHECK(prepared(), "reinitialize: call prepare() first");
  steps_->reinitialize(seed);
  steps_->reseed_order(seed ^ 0x5DEECE66Dull);
  optimizer_->set_mask(at::ones({options_.members()}, at::kBool));
  members_.assign(options_.members(), MemberState{});
  if (best_params_.defined()) best_params_.copy_(model_->parameters().flat().detach());
  resume_params_ = at::Tensor();
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
  model_->train(true);
  while (go_on && epoch_ < options_.epochs()) {
    const EpochReport report = run_epoch();
    if (on_epoch) go_on = on_epoch(report);
    if (report.active == 0 && stop_when_idle) break;
  }
  model_->train(false);
  const bool finished = go_on;
  if (finished && options_.restore_best() && options_.patience() > 0) restore_best_weights();
  return finished;
}

EpochReport EnsembleTrainer::run_epoch() {
  EpochReport report;
  report.steps = steps_->steps_per_epoch();
  step_offset_ = steps_taken_ - steps_->steps_taken();  // steps of earlier sessions (resume)
  const bool data_parallel = group_ != nullptr && group_->world_size() > 1;
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
  TORCH_CHECK(!losses.empty(), "internal: no loss report after an epoch");
  if (data_parallel) {
    at::Tensor mean = losses.back().mean.contiguous();
    group_->all_reduce_mean_(mean, "training-loss all-reduce", steps_taken_ + report.steps);  // each rank saw its shard
    check_ranks_agree(steps_taken_ + report.steps);
  }
  const at::Tensor val = val_x_.defined() ? steps_->evaluate(val_x_, val_y_).cpu() : at::Tensor();
  ++epoch_;
  steps_taken_ += report.steps;
  report.epoch = epoch_;
  report.epochs = options_.epochs();
  update_members(losses.back().mean, val, report);
  return report;
}

void EnsembleTrainer::update_members(const at::Tensor& train_loss, const at::Tensor& val_loss, EpochReport& report) {
  const auto train = train_loss.accessor<double, 1>();
  double train_sum = 0, val_sum = 0;
  int64_t trained = 0, validated = 0;
  std::vector<int64_t> improved, to_restore;
  for (int64_t k = 0; k < options_.members(); ++k) {
    MemberState& m = members_[k];
    const double v = val_loss.defined() ? val_loss[k].item<double>() : 0.0;
    if (m.status != MemberStatus::kTraining) {
      if (m.usable && val_loss.defined() && std::isfinite(v)) {
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
    if (!val_loss.defined()) continue;
    val_sum += v;
    ++validated;
    if (v < m.best_loss) {
      m.best_loss = v;
      m.best_epoch = epoch_;
      improved.push_back(k);
    } else if (options_.patience() > 0 && epoch_ - m.best_epoch >= options_.patience()) {
      m.status = MemberStatus::kStopped;
      m.ended_epoch = epoch_;
      report.events.push_back("member " + std::to_string(k) + " stopped early at epoch " + std::to_string(epoch_) +
                              " (best validation loss " + std::to_string(m.best_loss) + " at epoch " +
                              std::to_string(m.best_epoch) + ")");
    }
  }
  const at::Tensor flat = model_->parameters().flat().detach();
  if (best_params_.defined()) {
    copy_members(model_->parameters(), best_params_, flat, improved);
    copy_members(model_->parameters(), flat, best_params_, to_restore);
  }
  at::Tensor mask = at::empty({options_.members()}, at::kLong);
  for (int64_t k = 0; k < options_.members(); ++k) mask[k] = members_[k].status == MemberStatus::kTraining ? 1 : 0;
  optimizer_->set_mask(mask.to(at::kBool));
  report.active = mask.sum().item<int64_t>();
  report.train_loss = trained > 0 ? train_sum / static_cast<double>(trained) : std::nan("");
  if (val_loss.defined()) report.val_loss = validated > 0 ? val_sum / static_cast<double>(validated) : std::nan("");
  train_history_.push_back(report.train_loss);
  val_history_.push_back(report.val_loss);
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

EnsemblePrediction EnsembleTrainer::predict(const at::Tensor& x) const {
  TORCH_CHECK(model_, "predict: the ensemble has not been trained or loaded");
  if (x.dim() != 2 || x.size(1) != in_features_) {
    throw DataError("the model expects " + std::to_string(in_features_) + " features per row, got data shaped " +
                    c10::str(x.sizes()));
  }
  EnsemblePrediction out;
  for (int64_t k = 0; k < options_.members(); ++k) {
    if (members_[k].usable) out.included.push_back(k);
  }
  if (out.included.empty()) throw std::runtime_error("every member diverged: no usable member to predict with");
  at::NoGradGuard no_grad;
  const at::Tensor xs = x_scale_.transform(x).to(at::TensorOptions().dtype(at::kFloat).device(options_.device()));
  const at::Tensor raw = model_->forward(xs).to(at::kDouble).cpu();  // (K, N, O)
  const at::Tensor inc = at::tensor(out.included, at::kLong);
  if (options_.head() == Head::kClassification) {
    out.member_probabilities = raw.softmax(-1);
    return combine_members(std::move(out), options_.head(), classes_);
  }
  const double y_mean = y_scale_.mean.item<double>(), y_std = y_scale_.std.item<double>();
  if (options_.head() == Head::kGaussian) {
    const auto head = ensemble::gaussian_head(raw, options_.min_variance());
    out.member_mean = head.mean.squeeze(2) * y_std + y_mean;  // (K, N)
    out.member_variance = head.variance.squeeze(2) * (y_std * y_std);
  } else {
    out.member_mean = raw.squeeze(2) * y_std + y_mean;
  }
  return combine_members(std::move(out), options_.head());
}

EnsemblePrediction combine_members(EnsemblePrediction p, Head head, const std::vector<double>& classes) {
  TORCH_CHECK(!p.included.empty(), "every member diverged: no usable member to predict with");
  const at::Tensor inc = at::tensor(p.included, at::kLong);
  if (head == Head::kClassification) {
    TORCH_CHECK(p.member_probabilities.defined() && p.member_probabilities.size(-1) == static_cast<int64_t>(classes.size()),
                "combine_members: expected member probabilities over ", classes.size(), " classes");
    p.probabilities = p.member_probabilities.index_select(0, inc).mean(0);
    p.predicted = at::tensor(classes, at::kDouble).index_select(0, p.probabilities.argmax(1));
    return p;
  }
  const at::Tensor means = p.member_mean.index_select(0, inc);
  p.mean = means.mean(0);
  p.spread = means.std(0, /*unbiased=*/false);
  const at::Tensor second = p.member_variance.defined()
                                ? (p.member_variance.index_select(0, inc) + means.square()).mean(0)
                                : means.square().mean(0);
  p.variance = (second - p.mean.square()).clamp_min(0);
  return p;
}

namespace {
EnsembleMetrics regression_metrics(const EnsemblePrediction& p, const at::Tensor& y) {
  EnsembleMetrics m;
  const at::Tensor target = y.reshape({-1}).to(at::kDouble);
  for (int64_t k = 0; k < p.member_mean.size(0); ++k) {
    Metrics r;
    r.rmse = rmse(p.member_mean[k], target);
    if (p.member_variance.defined()) r.nll = gaussian_nll(p.member_mean[k], p.member_variance[k], target);
    m.members.push_back(r);
  }
  m.ensemble.rmse = rmse(p.mean, target);
  m.ensemble.nll = gaussian_nll(p.mean, p.variance, target);
  return m;
}
}  // namespace

EnsembleMetrics ensemble_metrics(const EnsemblePrediction& p, const at::Tensor& y, Head head,
                                 const std::vector<double>& classes) {
  if (head != Head::kClassification) return regression_metrics(p, y);
  const at::Tensor target = class_indices(y, classes, "evaluation");
  const auto metrics = [&](const at::Tensor& probs) {
    Metrics r;
    r.accuracy = probs.argmax(1).eq(target).to(at::kDouble).mean().item<double>();
    r.nll = -probs.gather(1, target.unsqueeze(1)).clamp_min(1e-12).log().mean().item<double>();
    return r;
  };
  EnsembleMetrics m;
  for (int64_t k = 0; k < p.member_probabilities.size(0); ++k) m.members.push_back(metrics(p.member_probabilities[k]));
  m.ensemble = metrics(p.probabilities);
  return m;
}

void place_members(EnsemblePrediction& all, const EnsemblePrediction& shard, int64_t first_member, int64_t members) {
  const auto place = [&](at::Tensor& into, const at::Tensor& from) {
    if (!from.defined()) return;
    if (!into.defined()) {
      std::vector<int64_t> shape = from.sizes().vec();
      shape[0] = members;
      into = at::zeros(shape, from.options());
    }
    into.narrow(0, first_member, from.size(0)).copy_(from);
  };
  place(all.member_mean, shard.member_mean);
  place(all.member_variance, shard.member_variance);
  place(all.member_probabilities, shard.member_probabilities);
  for (int64_t k : shard.included) all.included.push_back(first_member + k);
  std::sort(all.included.begin(), all.included.end());
}

EnsembleMetrics EnsembleTrainer::evaluate(const at::Tensor& x, const at::Tensor& y) const {
  check_xy(x, y, "evaluation data");
  return ensemble_metrics(predict(x), y, options_.head(), classes_);
}

// --- checkpoints ---------------------------------------------------------------

namespace {
at::Tensor cpu_copy(const at::Tensor& t) { return t.detach().to(at::kCPU).clone(); }
at::Tensor doubles(const std::vector<double>& v) { return at::tensor(v, at::kDouble).reshape({-1}); }
std::vector<double> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kDouble).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}
}  // namespace

void EnsembleTrainer::save(const fs::path& path, const std::string& extra, int64_t crash_after_bytes) const {
  TORCH_CHECK(model_, "save: nothing to save (no model)");
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("format", std::string(kCheckpointFormat));
  d.insert("options", to_json(options_));
  d.insert("extra", extra);
  d.insert("in_features", in_features_);
  d.insert("classes", doubles(classes_));
  d.insert("x_mean", cpu_copy(x_scale_.mean));
  d.insert("x_std", cpu_copy(x_scale_.std));
  if (y_scale_.mean.defined()) {
    d.insert("y_mean", cpu_copy(y_scale_.mean));
    d.insert("y_std", cpu_copy(y_scale_.std));
  }
  d.insert("params", cpu_copy(model_->parameters().flat()));
  std::vector<int64_t> status, best_epoch, ended, usable;
  std::vector<double> best_loss;
  for (const MemberState& m : members_) {
    status.push_back(static_cast<int64_t>(m.status));
    best_epoch.push_back(m.best_epoch);
    ended.push_back(m.ended_epoch);
    usable.push_back(m.usable ? 1 : 0);
    best_loss.push_back(m.best_loss);
  }
  d.insert("member_status", at::tensor(status, at::kLong));
  d.insert("member_best_epoch", at::tensor(best_epoch, at::kLong));
  d.insert("member_ended_epoch", at::tensor(ended, at::kLong));
  d.insert("member_usable", at::tensor(usable, at::kLong));
  d.insert("member_best_loss", doubles(best_loss));
  d.insert("epoch", epoch_);
  d.insert("steps_taken", steps_taken_);
  d.insert("train_history", doubles(train_history_));
  d.insert("val_history", doubles(val_history_));
  d.insert("data_fingerprint", static_cast<int64_t>(data_fingerprint_));
  d.insert("prepared", prepared());
  if (prepared()) {
    c10::impl::GenericDict opt(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [name, tensor] : optimizer_->state()) opt.insert(name, cpu_copy(tensor));
    d.insert("optimizer", opt);
    d.insert("order_rng", cpu_copy(steps_->batcher().generator_state()));
    if (best_params_.defined()) d.insert("best_params", cpu_copy(best_params_));
    if (resume_params_.defined()) d.insert("resume_params", cpu_copy(resume_params_));
    if (steps_->batcher().active_rows().defined()) d.insert("training_rows", cpu_copy(steps_->batcher().active_rows()));
  }
  save_checkpoint(path, d, crash_after_bytes);
}

std::shared_ptr<const EnsembleTrainer::Checkpoint> EnsembleTrainer::read_checkpoint(const fs::path& path) {
  const c10::IValue payload = load_checkpoint(path);
  auto checkpoint = std::make_shared<Checkpoint>();
  checkpoint->path = path;
  if (!payload.isGenericDict() || !payload.toGenericDict().contains("format") ||
      !payload.toGenericDict().at("format").isString() ||
      payload.toGenericDict().at("format").toStringRef() != kCheckpointFormat) {
    throw DataError(path.string() + ": not a packtrain trainer checkpoint (expected format " + kCheckpointFormat + ")");
  }
  checkpoint->payload = payload.toGenericDict();
  return checkpoint;
}

EnsembleTrainerOptions EnsembleTrainer::checkpoint_options(const Checkpoint& checkpoint) {
  try {
    return options_from_json(checkpoint.payload.at("options").toStringRef());
  } catch (const c10::Error& e) {
    throw DataError(checkpoint.path.string() + ": bad options in checkpoint: " + e.what_without_backtrace());
  }
}

std::string EnsembleTrainer::checkpoint_extra(const Checkpoint& checkpoint) {
  return checkpoint.payload.at("extra").toStringRef();
}

std::shared_ptr<const EnsembleTrainer::Checkpoint> EnsembleTrainer::select_members(
    const std::vector<MemberSource>& shards, int64_t first, int64_t count) {
  TORCH_CHECK(!shards.empty() && count > 0, "select_members: no shards or no members");
  const Checkpoint& base = *shards.front().first;
  const std::string where = base.path.string() + ": ";
  EnsembleTrainerOptions options = checkpoint_options(base);
  if (options.order() != graphs::BatchOrder::kShared) {
    throw DataError(where + "its members were trained with " + std::string(graphs::to_string(options.order())) +
                    " batch orders, which depend on how the members were sharded: resume it on its own number of "
                    "ranks");
  }
  // Every shard's members as rows: (K_s, P) per flat buffer, (K_s) per per-member tensor.
  const int64_t in = base.payload.at("in_features").toInt();
  EnsembleTrainerOptions layout_options = options;
  layout_options.device(c10::Device(c10::kCPU));
  // Flat (N = K * P) buffers <-> member rows (K, P), through a layout of K members.
  const auto to_rows = [&](const at::Tensor& flat, const ensemble::PackedParameters& p) {
    return at::cat(p.blocks(flat), 1);
  };
  const auto from_rows = [&](const at::Tensor& rows, const ensemble::PackedParameters& p) {
    at::Tensor flat = at::zeros({rows.size(0) * p.per_member()}, rows.options());
    const std::vector<at::Tensor> blocks = p.blocks(flat);
    int64_t column = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      blocks[i].copy_(rows.narrow(1, column, p.numel(i)));
      column += p.numel(i);
    }
    return flat;
  };
  const auto parameters_for = [&](int64_t members) {
    EnsembleTrainerOptions o = layout_options;
    EnsembleTrainer t(o.members(members));
    t.classes_ = to_vector(base.payload.at("classes").toTensor());
    t.build_model(in);
    return std::make_shared<ensemble::PackedParameters>(t.model_->parameters());
  };
  const auto target = parameters_for(count);
  // Which shard holds member m, and its index there.
  const auto locate = [&](int64_t m) -> std::pair<const Checkpoint*, int64_t> {
    for (const auto& [checkpoint, shard_first] : shards) {
      const int64_t n = checkpoint_options(*checkpoint).members();
      if (m >= shard_first && m < shard_first + n) return {checkpoint.get(), m - shard_first};
    }
    throw DataError(fmt::format("{}member {} is in none of the shards given", where, m));
  };
  std::map<const Checkpoint*, std::shared_ptr<ensemble::PackedParameters>> layouts;
  const auto layout_of = [&](const Checkpoint* c) {
    auto& p = layouts[c];
    if (!p) p = parameters_for(checkpoint_options(*c).members());
    return p;
  };
  // Gathers members first.. of a tensor that every shard holds: flat or per member.
  const auto gather = [&](const std::function<c10::optional<at::Tensor>(const Checkpoint&)>& get, bool flat) {
    std::vector<at::Tensor> rows;
    std::map<const Checkpoint*, at::Tensor> by_shard;  // each shard's rows, converted once
    for (int64_t m = first; m < first + count; ++m) {
      const auto [c, k] = locate(m);
      at::Tensor& shard_rows = by_shard[c];
      if (!shard_rows.defined()) {
        const c10::optional<at::Tensor> t = get(*c);
        if (!t) return at::Tensor();
        shard_rows = flat ? to_rows(*t, *layout_of(c)) : *t;
      }
      rows.push_back(shard_rows[k]);
    }
    const at::Tensor stacked = at::stack(rows);
    return flat ? from_rows(stacked, *target) : stacked;
  };
  auto out = std::make_shared<Checkpoint>();
  out->path = base.path;
  out->payload = base.payload.copy();
  if (base.payload.contains("training_rows")) {
    throw DataError(where + "trained on per-member training-row sets (active learning): resume it as it was sharded");
  }
  const int64_t K0 = options.members();
  for (const auto& entry : base.payload) {
    const std::string key = entry.key().toStringRef();
    if (key == "params" || key == "best_params" || key == "resume_params") {
      const at::Tensor gathered = gather([&](const Checkpoint& c) -> c10::optional<at::Tensor> {
        return c.payload.contains(key) ? c10::optional<at::Tensor>(c.payload.at(key).toTensor()) : c10::nullopt;
      }, /*flat=*/true);
      // Optional buffers some shard lacks: none for the selection (restore asks for
      // best weights only where the run has validation data, which all shards share).
      if (gathered.defined()) {
        out->payload.insert_or_assign(key, gathered);
      } else {
        (void)out->payload.erase(key);
      }
    } else if (key.rfind("member_", 0) == 0) {
      out->payload.insert_or_assign(key, gather([&](const Checkpoint& c) -> c10::optional<at::Tensor> {
        return c.payload.at(key).toTensor();
      }, /*flat=*/false));
    }
  }
  if (base.payload.contains("optimizer")) {
    c10::impl::GenericDict opt(c10::StringType::get(), c10::AnyType::get());
    const auto base_opt = base.payload.at("optimizer").toGenericDict();
    const int64_t P = target->per_member();
    for (const auto& entry : base_opt) {
      const std::string name = entry.key().toStringRef();
      const at::Tensor t = entry.value().toTensor();
      const bool flat = t.numel() == K0 * P, per_member = t.numel() == K0;
      if (!flat && !per_member) {
        opt.insert(name, t);  // shared by all members
        continue;
      }
      opt.insert(name, gather([&](const Checkpoint& c) -> c10::optional<at::Tensor> {
        return c.payload.at("optimizer").toGenericDict().at(name).toTensor();
      }, flat));
    }
    out->payload.insert_or_assign("optimizer", opt);
  }
  out->payload.insert_or_assign("options", to_json(options.members(count).first_member(first)));
  return out;
}

void EnsembleTrainer::restore(const Checkpoint& checkpoint) {
  const auto& d = checkpoint.payload;
  const std::string where = checkpoint.path.string() + ": ";
  try {
    const int64_t in = d.at("in_features").toInt();
    classes_ = to_vector(d.at("classes").toTensor());
    if (!model_) build_model(in);
    const int64_t saved = d.at("params").toTensor().numel(), ours = model_->parameters().flat().numel();
    if (in != in_features_ || saved != ours) {
      throw DataError(where + "the checkpoint is for a model with " + std::to_string(in) + " inputs and " +
                      std::to_string(saved) + " parameters; this one has " + std::to_string(in_features_) + " and " +
                      std::to_string(ours));
    }
    if (prepared() && static_cast<int64_t>(data_fingerprint_) != d.at("data_fingerprint").toInt()) {
      throw DataError(where + "the training data differ from the data this checkpoint was trained on");
    }
    at::NoGradGuard no_grad;
    x_scale_ = {d.at("x_mean").toTensor(), d.at("x_std").toTensor()};
    if (d.contains("y_mean")) y_scale_ = {d.at("y_mean").toTensor(), d.at("y_std").toTensor()};
    model_->parameters().flat().detach().copy_(d.at("params").toTensor());
    const at::Tensor status = d.at("member_status").toTensor(), best_epoch = d.at("member_best_epoch").toTensor();
    const at::Tensor ended = d.at("member_ended_epoch").toTensor(), usable = d.at("member_usable").toTensor();
    const at::Tensor best_loss = d.at("member_best_loss").toTensor();
    TORCH_CHECK(status.numel() == options_.members(), "member states for ", status.numel(), " members");
    for (int64_t k = 0; k < options_.members(); ++k) {
      members_[k] = {static_cast<MemberStatus>(status[k].item<int64_t>()), best_epoch[k].item<int64_t>(),
                     best_loss[k].item<double>(), ended[k].item<int64_t>(), usable[k].item<int64_t>() != 0};
    }
    epoch_ = d.at("epoch").toInt();
    steps_taken_ = d.at("steps_taken").toInt();
    train_history_ = to_vector(d.at("train_history").toTensor());
    val_history_ = to_vector(d.at("val_history").toTensor());
    if (!prepared()) return;
    TORCH_CHECK(d.at("prepared").toBool(), "the checkpoint holds a model only (no training state to resume)");
    const auto opt = d.at("optimizer").toGenericDict();
    for (const auto& [name, tensor] : optimizer_->state()) {
      TORCH_CHECK(opt.contains(name), "no optimizer state '", name, "' (was it saved with another optimizer?)");
      tensor.copy_(opt.at(name).toTensor());
    }
    steps_->batcher().set_generator_state(d.at("order_rng").toTensor());
    if (best_params_.defined()) {
      TORCH_CHECK(d.contains("best_params"), "no best weights (was it trained without validation data?)");
      best_params_.copy_(d.at("best_params").toTensor());
    }
    if (d.contains("resume_params")) resume_params_ = d.at("resume_params").toTensor().to(options_.device());
    if (d.contains("training_rows")) set_training_rows(d.at("training_rows").toTensor());
  } catch (const c10::Error& e) {
    throw DataError(where + "damaged or incompatible checkpoint: " + e.what_without_backtrace());
  }
}

}  // namespace packtrain::runtime
