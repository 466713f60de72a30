// What an EnsembleTrainer trains: model shape, head, optimizer and schedule,
// epochs, data order, early stopping, device. Serializes to JSON (stored in every
// checkpoint, so `packtrain resume` and `predict` rebuild the same trainer).
#pragma once

#include "packtrain/base/enum_names.h"

#include "packtrain/ensemble/optimizers/lr_schedule.h"
#include "packtrain/ensemble/packed_cnn.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/precision.h"
#include "packtrain/graphs/device_batcher.h"
#include "packtrain/graphs/graph_log.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_steps.h"

#include <c10/core/Device.h>
#include <torch/arg.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace packtrain {
template <typename O>
class OptionSchema;
}  // namespace packtrain

namespace packtrain::runtime {

enum class Head {
  kMean,            // regression, one output per member, MSE
  kGaussian,        // regression, mean and variance per member, Gaussian NLL (deep ensembles)
  kClassification,  // logits per class, cross-entropy
};
inline constexpr EnumNames<Head, 3> kHeadNames{
    "head", {{{Head::kMean, "mean"}, {Head::kGaussian, "gaussian"}, {Head::kClassification, "classification"}}}};
inline std::string_view to_string(Head head) { return kHeadNames.name(head); }
// Throws naming the value and the accepted names.
inline Head parse_head(std::string_view name) { return kHeadNames.parse(name); }

enum class OptimizerKind { kAdamW, kAdam, kSGD };
inline constexpr EnumNames<OptimizerKind, 3> kOptimizerKindNames{
    "optimizer", {{{OptimizerKind::kAdamW, "adamw"}, {OptimizerKind::kAdam, "adam"}, {OptimizerKind::kSGD, "sgd"}}}};
inline std::string_view to_string(OptimizerKind kind) { return kOptimizerKindNames.name(kind); }
// Throws naming the value and the accepted names.
inline OptimizerKind parse_optimizer(std::string_view name) { return kOptimizerKindNames.parse(name); }

// Whose validation loss early stopping watches (with patience > 0).
enum class EarlyStopping {
  kMember,    // each member's own: a member stops, and keeps its best epoch, alone
  kEnsemble,  // its ensemble's (a sweep's configuration, or the whole pack) as one mixture:
              // the ensemble's members stop together at the ensemble's best epoch
};
inline constexpr EnumNames<EarlyStopping, 2> kEarlyStoppingNames{
    "early stopping", {{{EarlyStopping::kMember, "member"}, {EarlyStopping::kEnsemble, "ensemble"}}}};
inline std::string_view to_string(EarlyStopping kind) { return kEarlyStoppingNames.name(kind); }
// Throws naming the value and the accepted names.
inline EarlyStopping parse_early_stopping(std::string_view name) { return kEarlyStoppingNames.parse(name); }

// What a regression ensemble does with its validation rows once trained
// (runtime/trainers/uncertainty/variance_calibration.h).
enum class Recalibration {
  kNone,      // predicts as trained
  kVariance,  // one scale s fitted on the validation rows: the predictive mixture
              // stretched about its mean by sqrt(s) (its variance times s)
};
inline constexpr EnumNames<Recalibration, 2> kRecalibrationNames{
    "recalibration", {{{Recalibration::kNone, "none"}, {Recalibration::kVariance, "variance"}}}};
inline std::string_view to_string(Recalibration kind) { return kRecalibrationNames.name(kind); }
// Throws naming the value and the accepted names.
inline Recalibration parse_recalibration(std::string_view name) { return kRecalibrationNames.parse(name); }

struct EnsembleTrainerOptions {
  /// Example: EnsembleTrainerOptions().members(16).epochs(200).batch_size(64).patience(20)
  TORCH_ARG(int64_t, members) = 16;
  // The member architecture, by its registered name (ensemble/architectures.h):
  // "mlp", "residual-mlp" (hidden: its width; depth: its residual blocks).
  TORCH_ARG(std::string, architecture) = "mlp";
  TORCH_ARG(int64_t, hidden) = 64;
  TORCH_ARG(int64_t, depth) = 2;
  // Convolutional members ("cnn", ensemble/packed_cnn.h): each convolution block's
  // output channels, and the shape of one sample of the rows, {C, H, W} or {C, L}
  // (set from the data: EnsembleTrainer::set_input_shape; empty for a table).
  TORCH_ARG(std::vector<int64_t>, channels) = ensemble::kDefaultCnnChannels;
  TORCH_ARG(std::vector<int64_t>, input_shape) = {};
  // cnn: each convolution's kernel size, stride and zero padding (-1: "same",
  // kernel / 2, for an odd kernel), each block's pooling, and the group count of the
  // GroupNorm after each convolution (0: none; PackedCNNOptions).
  TORCH_ARG(int64_t, kernel) = 3;
  TORCH_ARG(int64_t, stride) = 1;
  TORCH_ARG(int64_t, padding) = ensemble::kSamePadding;
  TORCH_ARG(ensemble::Pool, pool) = ensemble::Pool::kMax;
  TORCH_ARG(int64_t, norm_groups) = 0;
  TORCH_ARG(ensemble::Activation, activation) = ensemble::Activation::kReLU;
  TORCH_ARG(bool, layer_norm) = false;
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(Head, head) = Head::kGaussian;
  TORCH_ARG(OptimizerKind, optimizer) = OptimizerKind::kAdamW;
  TORCH_ARG(double, lr) = 3e-3;
  TORCH_ARG(double, weight_decay) = 1e-4;
  TORCH_ARG(double, momentum) = 0.9;  // SGD only (Nesterov off)
  // Per-member learning rates and weight decays (members() values each, or empty:
  // every member uses lr / weight_decay). A hyperparameter sweep trains in one pack
  // this way (runtime/trainers/ensemble/hyperparameter_sweep.h): the optimizers already read
  // both as (K) device tensors, so one captured step serves every configuration.
  TORCH_ARG(std::vector<double>, member_lr) = {};
  TORCH_ARG(std::vector<double>, member_weight_decay) = {};
  // Per-member dropout rates (PackedMLPOptions::member_dropout): the rate is a
  // (K, 1, 1) device tensor of the forward, so a sweep over it is one pack too.
  TORCH_ARG(std::vector<double>, member_dropout) = {};
  // Per-member hidden widths (PackedMLPOptions::member_hidden; hidden is then the
  // widest): members of different widths padded to one pack, a sweep over widths.
  TORCH_ARG(std::vector<int64_t>, member_hidden) = {};
  // Per-member convolution channels (cnn; PackedCNNOptions::member_channels; channels is
  // then the widest in each block), flat and member-major: members() x channels().size()
  // counts, or empty. A sweep over --channels lists trains this way.
  TORCH_ARG(std::vector<int64_t>, member_channels) = {};
  TORCH_ARG(ensemble::LrScheduleKind, schedule) = ensemble::LrScheduleKind::kConstant;
  TORCH_ARG(int64_t, warmup_steps) = 0;
  TORCH_ARG(double, min_lr_factor) = 0.0;  // cosine: the final fraction of lr (decays over all epochs)
  TORCH_ARG(int64_t, epochs) = 200;
  TORCH_ARG(int64_t, batch_size) = 64;
  TORCH_ARG(graphs::BatchOrder, order) = graphs::BatchOrder::kShared;
  // Epochs without a better validation loss before a member stops (0: never). The
  // member's mask goes off, so the captured step stays the same graph. Unset: the
  // run's default, kDefaultPatience with validation rows and off without
  // (resolved_patience), so C++, the CLI and Python train the same model.
  TORCH_ARG(std::optional<int64_t>, patience) = std::nullopt;
  // With early stopping (patience > 0): each member ends with the weights of its
  // best validation epoch. (Without it, training runs its epochs and keeps the last.)
  TORCH_ARG(bool, restore_best) = true;
  // kEnsemble: members over-confident alone can still improve their mixture (the
  // prediction users get); stopping each on its own loss can stop them too early.
  TORCH_ARG(EarlyStopping, early_stopping) = EarlyStopping::kEnsemble;
  TORCH_ARG(double, min_variance) = 1e-6;  // floor of the variance head (standardized units)
  // Regression with validation rows: after training (and after keep_members), the
  // ensemble's spread is fitted to them. Classification ignores it.
  TORCH_ARG(Recalibration, recalibration) = Recalibration::kVariance;
  TORCH_ARG(uint64_t, seed) = 0;         // member i initialized from (seed, i); orders from seed too
  TORCH_ARG(int64_t, first_member) = 0;  // member parallel: this shard's members start at this global index
  TORCH_ARG(c10::Device, device) = c10::Device(c10::DeviceType::CPU);
  // The arithmetic of training and prediction (ensemble/precision.h): fp32, or
  // bf16-mixed (bfloat16 products, float32 weights, optimizer, losses and outputs).
  TORCH_ARG(ensemble::Precision, precision) = ensemble::Precision::kFP32;
  TORCH_ARG(bool, capture) = true;                           // CUDA graphs on a GPU (CPU always runs eagerly)
  TORCH_ARG(int64_t, unroll) = kDefaultUnroll;               // training steps per graph replay
  TORCH_ARG(graphs::GraphLog, log) = graphs::log_to_stderr;  // capture decisions, fallbacks (not serialized)

 public:
  // UserError naming the offending field and value.
  void validate() const;
  // member_channels as one list per member (empty without per-member channels).
  std::vector<std::vector<int64_t>> member_channel_lists() const;
};

// The struct's defaults are `packtrain train`'s and the Python estimators': early
// stopping on the ensemble's validation loss after 50 epochs without improvement
// (the UCI protocol's recipe: benchmarks/uci/), and without validation rows every
// epoch trained.
inline constexpr int64_t kDefaultPatience = 50;
// The patience a run stops with: the one set, or the default for whether the run has
// validation rows. A patience > 0 set for a run without them is a UserError.
int64_t resolved_patience(const EnsembleTrainerOptions& options, bool has_validation);

// The one description of the options (packtrain/base/option_schema.h): validate's
// ranges, JSON, the CLI's flags, the Python estimators' parameters and the docs'
// table all come from it (ensemble_trainer_options.cpp).
const OptionSchema<EnsembleTrainerOptions>& trainer_option_schema();
// Version 2 added format_version itself; version 1 payloads (checkpoints before it)
// may lack the keys their field's added_in names and read as they meant then.
// Version 3 added channels and input_shape (the cnn architecture's); version 4
// member_hidden (packs of different widths) and the cnn's kernel, pool and norm_groups;
// version 5 the cnn's stride and padding; version 6 member_channels (cnn members of
// different channel counts); version 7 precision.
inline constexpr int kTrainerOptionsFormat = 7;

// Every field but `log`, and format_version, as a JSON object.
std::string to_json(const EnsembleTrainerOptions& options);
// The inverse, upgrading older versions; an unknown key, a missing key, a wrong
// type or a bad value is a UserError naming it.
EnsembleTrainerOptions options_from_json(const std::string& json);

}  // namespace packtrain::runtime
