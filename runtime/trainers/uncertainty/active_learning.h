// Pool-based active learning with deep ensembles, all in one pack: G independent
// runs per strategy (acquisition by an acquisition strategy — runtime/trainers/
// acquisition.h: epistemic spread, variance, UCB for regression; BALD, entropy,
// margin, variation ratio, BatchBALD's batches for classification — and, as a baseline, uniformly at
// random), each an ensemble of M members, trained together by one EnsembleTrainer
// and re-initialized in place every round, so the captured steps serve every round.
//
// Pack layout: member k = (s * G + g) * M + m belongs to strategy s (0: the
// acquisition strategy, 1: random), run g, member m of that run's ensemble.
#pragma once

#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer_options.h"
#include "packtrain/runtime/trainers/uncertainty/acquisition.h"

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace packtrain::runtime {

// Described once by active_learning_option_schema() (active_learning.cpp): a field
// added here is its TORCH_ARG and one line there, and reaches validate(), JSON,
// `active-learn`'s flags and --help, and `packtrain info --active-learning-options`.
struct ActiveLearningOptions {
  /// Example: ActiveLearningOptions().initial(20).acquire(10).rounds(8).ensembles(4).seed(1)
  // n: labelled rows at the start, one seeded set shared by every run and strategy,
  // so the strategies are compared paired.
  TORCH_ARG(int64_t, initial) = 20;
  TORCH_ARG(int64_t, acquire) = 10;  // b: rows moved from the pool to the labelled set per round
  TORCH_ARG(int64_t, rounds) = 10;   // R: trainings; acquisitions happen between them (R - 1)
  // G: independent runs per strategy, each an ensemble of the trainer options' members().
  TORCH_ARG(int64_t, ensembles) = 1;
  TORCH_ARG(bool, random_baseline) = true;  // also run random acquisition, in the same pack
  TORCH_ARG(uint64_t, seed) = 0;            // initial set, random acquisitions, member seeds per round
  // How rows are scored and a batch chosen (its seed is mixed with each round's
  // and run's). The strategy must fit the head: see strategy_for_classification.
  TORCH_ARG(AcquisitionOptions, acquisition) = {};

 public:
  // Throws UserError naming the field and value (the schema's ranges).
  void validate() const;
};

// The fields of ActiveLearningOptions and of its acquisition options (the latter's
// seed as "acquisition_seed", without a flag), format version 1.
const OptionSchema<ActiveLearningOptions>& active_learning_option_schema();

struct LearningCurvePoint {
  int64_t round = 0;  // 0-based: round r trained on initial + r * acquire rows
  int64_t labelled = 0;
  // The test metric — RMSE (original units) of a run's ensemble mean, or the accuracy
  // of its mixture (classification) — mean over runs: acquisition by the strategy,
  // and random acquisition (NaN without the baseline).
  double acquired = 0;
  double random = 0;
  std::vector<double> acquired_runs, random_runs;  // per run
};

struct ActiveLearningResult {
  std::string strategy;  // the acquisition strategy's name: "epistemic", "bald", ...
  std::string metric;    // "rmse" or "accuracy"
  std::vector<LearningCurvePoint> curve;
  int64_t pack_members = 0;  // S * G * M
  double train_seconds = 0;  // re-initialization and training, all rounds (not scoring)
  // Per run (s * G + g): pool rows in the order they were labelled; round r trained
  // on the first curve[r].labelled of them.
  std::vector<std::vector<int64_t>> labelled;
};

using RoundCallback = std::function<void(const LearningCurvePoint&)>;

// One run's pool, split into labelled and unlabelled rows; a row is in exactly one.
class PoolPartition {
 public:
  // Throws UserError on a repeated or out-of-range initial row.
  PoolPartition(int64_t pool_rows, const std::vector<int64_t>& initial);

  const std::vector<int64_t>& labelled() const { return labelled_; }  // in acquisition order
  const std::vector<int64_t>& unlabelled() const { return unlabelled_; }
  // Moves the `count` unlabelled rows with the highest `scores` (one per pool row,
  // CPU float64; ties to the lower row index).
  void acquire_top(const at::Tensor& scores, int64_t count);
  // Moves `count` unlabelled rows drawn uniformly without replacement.
  void acquire_random(std::mt19937_64& rng, int64_t count);
  // Moves `count` unlabelled rows chosen by `options.selection` from their scores:
  // acquire_top for kTop, else select_batch over the unlabelled rows' scores.
  void acquire_by(const at::Tensor& scores, int64_t count, const AcquisitionOptions& options);
  // Moves the `count` unlabelled rows BatchBALD chooses (batchbald_select, seeded by
  // options.seed) from the members' class probabilities (K, pool rows, C).
  void acquire_batchbald(const at::Tensor& member_probabilities, int64_t count, const AcquisitionOptions& options);

 private:
  void move(const std::vector<size_t>& positions);  // positions in unlabelled_

  std::vector<int64_t> labelled_, unlabelled_;
};

// The loop one round at a time, for callers that watch the trainer between rounds
// (run_active_learning drives it to the end).
class ActiveLearningLoop {
 public:
  // Validates, draws the initial set and prepares the trainer (standardizers fitted
  // on the initial rows). x (N, I), y (N, 1) in original units.
  ActiveLearningLoop(const EnsembleTrainerOptions& trainer_options, const at::Tensor& pool_x, const at::Tensor& pool_y,
                     const at::Tensor& test_x, const at::Tensor& test_y, const ActiveLearningOptions& options);
  ~ActiveLearningLoop();

  bool done() const { return round_ >= options_.rounds(); }
  // Re-initializes and trains every run on its labelled set, scores the test set,
  // then (unless it was the last round) acquires for every run.
  LearningCurvePoint next_round();

  int64_t strategies() const { return options_.random_baseline() ? 2 : 1; }  // S
  bool classification() const { return trainer_->options().head() == Head::kClassification; }
  int64_t members_per_run() const { return members_per_run_; }      // M
  const std::vector<PoolPartition>& runs() const { return runs_; }  // S * G, spread runs first
  EnsembleTrainer& trainer() { return *trainer_; }
  double train_seconds() const { return train_seconds_; }

 private:
  uint64_t round_seed() const;
  at::Tensor member_rows() const;
  void train_round();
  std::vector<double> test_metric() const;
  at::Tensor run_means(const at::Tensor& member_values) const;
  EnsemblePrediction run_prediction(const EnsemblePrediction& all, int64_t run) const;
  void acquire();

  ActiveLearningOptions options_;
  int64_t members_per_run_ = 0;
  at::Tensor pool_x_, test_x_, test_y_;  // float64, CPU
  std::unique_ptr<EnsembleTrainer> trainer_;
  std::vector<PoolPartition> runs_;
  std::vector<std::mt19937_64> random_rngs_;  // one per random run
  int64_t round_ = 0;
  double train_seconds_ = 0;
};

// Runs all rounds. `trainer_options.members()` is M; the pack has S * G * M members.
// Each run's batches come from its own labelled rows, so the order must be
// per-member or bootstrap: a shared order is switched to per-member, with a log
// line. Any head, with a strategy for it; no validation data: patience must be 0. Throws
// UserError on such options, DataError (one line) on sizes that do not
// fit: initial < batch size, or initial + (rounds - 1) * acquire > pool rows.
ActiveLearningResult run_active_learning(const EnsembleTrainerOptions& trainer_options, const at::Tensor& pool_x,
                                         const at::Tensor& pool_y, const at::Tensor& test_x, const at::Tensor& test_y,
                                         const ActiveLearningOptions& options, const RoundCallback& on_round = {});

// round,labelled,<strategy>_<metric>,random_<metric>,<strategy>_std,random_std (e.g.
// epistemic_rmse, bald_accuracy): one row per round (0-based); std over runs
// (sample, 0 with one run); an empty cell where there is no baseline.
// Written atomically.
void write_learning_curve_csv(const std::filesystem::path& path, const ActiveLearningResult& result);
// Labelled rows against the test metric for both strategies, error bars = std over runs
// when there are several. Written atomically.
void write_learning_curve_svg(const std::filesystem::path& path, const ActiveLearningResult& result,
                              const std::string& title);

}  // namespace packtrain::runtime
