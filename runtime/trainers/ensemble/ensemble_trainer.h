// EnsembleTrainer: a packed ensemble trained end to end on tabular data.
//
// Standardizes features (and regression targets) with statistics of the training
// rows, trains all K members as one pack through EnsembleSteps (captured CUDA
// graphs on a GPU, the same steps eagerly on CPU), stops members early one by one
// (mask-based: the graph never changes) and freezes a member whose loss turns
// non-finite while the others keep training. Predictions and metrics are in the
// target's original units. Checkpoints hold everything needed to continue exactly.
#pragma once

#include "packtrain/ensemble/packed_model.h"
#include "packtrain/runtime/data/standardizer.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_predictions.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer_options.h"

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace packtrain::ensemble {
class PackedOptimizer;
}
namespace packtrain::runtime {
class EnsembleSteps;
namespace distributed {
class ProcessGroup;
}
}  // namespace packtrain::runtime

namespace packtrain::runtime {

enum class MemberStatus {
  kTraining,    // still updating
  kStopped,     // early-stopped: no better validation loss for `patience` epochs
  kDiverged,    // its loss turned NaN/Inf: frozen (at its best weights when it had any)
  kDeselected,  // a sweep kept another configuration (keep_members): frozen, left out of predictions
};
inline constexpr EnumNames<MemberStatus, 4> kMemberStatusNames{"member status",
                                                               {{{MemberStatus::kTraining, "training"},
                                                                 {MemberStatus::kStopped, "stopped"},
                                                                 {MemberStatus::kDiverged, "diverged"},
                                                                 {MemberStatus::kDeselected, "deselected"}}}};
inline std::string_view to_string(MemberStatus status) { return kMemberStatusNames.name(status); }

struct MemberState {
  MemberStatus status = MemberStatus::kTraining;
  // The best validation loss that decides its stopping (its own, or with
  // EarlyStopping::kEnsemble its ensemble's) and its 1-based epoch; -1: none yet.
  int64_t best_epoch = -1;
  double best_loss = std::numeric_limits<double>::infinity();
  int64_t ended_epoch = -1;  // when it stopped or diverged
  // False for a diverged member with no earlier good weights: left out of predictions.
  bool usable = true;
};

struct EpochReport {
  int64_t epoch = 0;      // epochs done (1-based)
  int64_t epochs = 0;     // the run's target
  int64_t steps = 0;      // training steps this epoch
  double train_loss = 0;  // mean over members that trained this epoch (standardized units)
  double val_loss = std::numeric_limits<double>::quiet_NaN();  // mean over usable members; NaN: no validation
  int64_t active = 0;                                          // members still training after this epoch
  // Each member's loss this epoch (standardized units); validation empty without
  // validation data. A stopped member's training loss is that of its last epoch.
  std::vector<double> member_train_loss, member_val_loss;
  std::vector<std::string> events;  // members that stopped or diverged this epoch, in words
};
// Called after every epoch; return false to stop after it (an interrupt).
using EpochCallback = std::function<bool(const EpochReport&)>;

class EnsembleTrainer {
 public:
  explicit EnsembleTrainer(EnsembleTrainerOptions options);
  ~EnsembleTrainer();

  // x (N, I), y (N, 1): CPU float64 in original units (class labels as numbers for
  // classification). Validation data are optional (undefined tensors). prepare()
  // fits the standardizers (on `fit_rows` only, when given) and the classes (of all
  // rows: active learning labels more of them later), and
  // builds the pack and its steps; train() then runs the epochs. fit() does both.
  // Prepared again with data of the same shapes (rows, features, validation rows,
  // number of classes), the pack and its steps are kept — their captured graphs
  // too: the new rows are copied into the resident buffers and every member is
  // re-initialized from the seed, which trains exactly as a fresh trainer would.
  void fit(const at::Tensor& x, const at::Tensor& y, const at::Tensor& val_x = {}, const at::Tensor& val_y = {},
           const EpochCallback& on_epoch = {});
  void prepare(const at::Tensor& x, const at::Tensor& y, const at::Tensor& val_x = {}, const at::Tensor& val_y = {},
               const at::Tensor& fit_rows = {});
  // Runs epochs until options().epochs() are done or (stop_when_idle) no member
  // trains; continues a restored checkpoint where it stopped. False when the callback
  // asked to stop. Member-parallel ranks pass stop_when_idle = false so that every
  // rank runs the same epochs (their per-epoch collectives stay matched).
  bool train(const EpochCallback& on_epoch = {}, bool stop_when_idle = true);

  // Active learning: train on rows (n) of the prepared training data, or (K, n)
  // per member (per-member or bootstrap order).
  void set_training_rows(const at::Tensor& rows);
  // Every member re-initialized in place from `seed`: weights, optimizer state,
  // early stopping, epoch count. Captured graphs are kept (no re-capture). With
  // `repeat_every` P > 0 (dividing K), member k starts as member k mod P: runs that
  // differ only in their rows (active learning's acquired and random halves) start
  // from the same weights.
  void reinitialize(uint64_t seed, int64_t repeat_every = 0);
  // Keeps members [first, first + count) — a sweep's chosen configuration — and
  // deselects the rest: frozen, left out of predictions, metrics and the ensemble a
  // checkpoint loads as (their weights stay in it).
  void keep_members(int64_t first, int64_t count);

  // Data parallel (call before prepare): every rank trains the same members on its
  // equal share of each global batch (batch_size() is the global batch), the flat
  // gradient buffer is averaged across ranks before each update (Gloo on CPU; one
  // NCCL call inside the captured step on CUDA, the group joined on the training
  // device), rank 0's initial weights are broadcast, and training losses are
  // averaged so every rank takes the same per-member decisions. World size 1 runs the
  // same path. The group must outlive the trainer.
  // Ranks compare a parameter checksum with rank 0's after every epoch, and with
  // `check_every_steps` > 0 also every that many steps (a host synchronization each).
  void set_process_group(distributed::ProcessGroup* group, int64_t check_every_steps = 0) {
    group_ = group;
    check_every_steps_ = check_every_steps;
  }
  int64_t per_rank_batch() const;
  // The shape of one sample of the rows x holds, {C, H, W} or {C, L} (call before
  // prepare): the cnn architecture reshapes each row to it; the checkpoint keeps it
  // (options().input_shape()). Data sets give it (Dataset::sample_shape).
  void set_input_shape(std::vector<int64_t> shape) { options_.input_shape(std::move(shape)); }
  // The static batch prepare() built the steps for: options().batch_size(), or all
  // the training rows when there are fewer (0 before prepare).
  int64_t batch_size() const { return batch_size_; }

  // Every member's predictions and their mixture for x (N, I), original units,
  // recalibrated by variance_scale(). Differentiable with respect to x when x
  // requires grad.
  EnsemblePrediction predict(const at::Tensor& x) const;
  // The same as trained, before recalibration: what a sweep's configurations are
  // scored and chosen on (the scale is fitted to the ensemble the run keeps).
  EnsemblePrediction predict_uncalibrated(const at::Tensor& x) const;
  EnsembleMetrics evaluate(const at::Tensor& x, const at::Tensor& y) const;
  // Regression with Recalibration::kVariance and validation rows: the scale fitted
  // on them when train() finished or keep_members() chose (1: none fitted — the
  // run was interrupted, has no validation rows, or recalibration is off).
  double variance_scale() const { return variance_scale_; }

  // Atomically writes a checkpoint: options, standardization, classes, weights,
  // optimizer state, member states, batch-order RNG state, epoch, history, and
  // `extra` (the caller's description of the run, stored verbatim).
  void save(const std::filesystem::path& path, const std::string& extra = "", int64_t crash_after_bytes = -1) const;

  // A checkpoint read from disk (throws DataError if missing, torn or corrupted).
  struct Checkpoint;
  static std::shared_ptr<const Checkpoint> read_checkpoint(const std::filesystem::path& path);
  static EnsembleTrainerOptions checkpoint_options(const Checkpoint& checkpoint);
  static std::string checkpoint_extra(const Checkpoint& checkpoint);
  static int64_t checkpoint_epoch(const Checkpoint& checkpoint);
  // Of the training rows it was prepared with (0: never prepared).
  static uint64_t checkpoint_data_fingerprint(const Checkpoint& checkpoint);
  // A checkpoint of members [first, first + count) taken from the shards of a
  // member-parallel run (each shard's checkpoint with its first member): weights,
  // optimizer state and member states per member; epoch, batch order, data and
  // standardization from the first shard (all shards share them; its loss history,
  // a mean over its own members, stands for the selection's). What resuming on a
  // different number of ranks restores. DataError when the shards do not hold those
  // members, or were trained with per-member batch orders or training-row sets
  // (their orders depend on the shard's layout).
  using MemberSource = std::pair<std::shared_ptr<const Checkpoint>, int64_t>;  // checkpoint, its first member
  static std::shared_ptr<const Checkpoint> select_members(const std::vector<MemberSource>& shards, int64_t first,
                                                          int64_t count);
  // Restores a checkpoint into this trainer (built from checkpoint_options, the
  // device may differ). Before prepare(): the model only (predict, evaluate).
  // After prepare() with the same training data: everything, to continue with train().
  void restore(const Checkpoint& checkpoint);

  const EnsembleTrainerOptions& options() const { return options_; }
  // The patience this run stops with (resolved_patience for its validation rows).
  int64_t patience() const;
  bool prepared() const { return steps_ != nullptr; }
  bool has_model() const { return model_ != nullptr; }
  const ensemble::PackedModel& model() const { return *model_; }
  ensemble::PackedOptimizer& optimizer() { return *optimizer_; }
  EnsembleSteps& steps() { return *steps_; }
  const std::vector<MemberState>& member_states() const { return members_; }
  int64_t epoch() const { return epoch_; }
  int64_t steps_taken() const { return steps_taken_; }
  int64_t in_features() const { return in_features_; }
  const std::vector<double>& classes() const { return classes_; }
  const Standardizer& x_scale() const { return x_scale_; }
  const Standardizer& y_scale() const { return y_scale_; }
  const std::vector<double>& train_loss_history() const { return train_history_; }
  const std::vector<double>& val_loss_history() const { return val_history_; }

 private:
  int64_t out_features() const;
  void build_model(int64_t in_features);
  // prepare() on data shaped as the prepared data: keeps the steps (see prepare).
  bool reuse_steps(const at::Tensor& x, const at::Tensor& y, const at::Tensor& val_x, const at::Tensor& val_y);
  at::Tensor encode_targets(const at::Tensor& y, const char* what) const;  // standardized or class indices
  EpochReport run_epoch();
  // Per-member losses of the epoch on the host (val empty without validation data);
  // val_raw: the pack's outputs on the validation rows when its ensembles decide
  // early stopping (EarlyStopping::kEnsemble), else undefined.
  void update_members(const std::vector<double>& train_loss, const std::vector<double>& val_loss,
                      const at::Tensor& val_raw, EpochReport& report);
  // kEnsemble: each ensemble's members improve, or stop, together.
  void update_ensembles(const at::Tensor& val_raw, std::vector<int64_t>& improved, EpochReport& report);
  void restore_best_weights();
  // Fits variance_scale_ on the validation rows, when the options ask for it.
  void recalibrate();
  EnsemblePrediction predict_standardized(const at::Tensor& xs) const;  // xs: standardized features

  EnsembleTrainerOptions options_;
  int64_t in_features_ = 0;
  int64_t batch_size_ = 0;  // see batch_size()
  std::vector<double> classes_;
  Standardizer x_scale_, y_scale_;
  std::unique_ptr<ensemble::PackedModel> model_;  // options().architecture()'s
  std::unique_ptr<ensemble::PackedOptimizer> optimizer_;
  std::unique_ptr<EnsembleSteps> steps_;
  distributed::ProcessGroup* group_ = nullptr;
  void check_ranks_agree(int64_t step) const;
  int64_t check_every_steps_ = 0;
  at::Tensor val_x_, val_y_;  // standardized, on the device
  at::Tensor val_targets_;    // the validation targets as given (float64, host): recalibrate()
  at::Tensor best_params_;    // (N) on the device: each member's best weights
  at::Tensor resume_params_;  // (N): the weights training continues from, once best ones replaced them
  std::vector<MemberState> members_;
  int64_t epoch_ = 0;
  int64_t steps_taken_ = 0;
  int64_t step_offset_ = 0;  // steps_taken_ minus the steps object's count (names steps in errors)
  std::vector<double> train_history_, val_history_;
  double variance_scale_ = 1.0;    // recalibrate()
  uint64_t data_fingerprint_ = 0;  // of the prepared training data; checked on restore
};

}  // namespace packtrain::runtime
