// LoadedEnsemble: a trained ensemble read from disk to predict and evaluate — one
// checkpoint, or every shard of a member-parallel run's manifest (each checked
// against the manifest), loaded in this process whatever number of ranks trained
// it. What `packtrain predict` / `evaluate` and the Python package's load() use.
#pragma once

#include "packtrain/runtime/data/run_data.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_predictions.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace packtrain::runtime {

class LoadedEnsemble {
 public:
  // A checkpoint or a member-parallel manifest (told apart by content), on `device`;
  // DataError for a missing, torn or inconsistent file or shard. Capture and
  // fallback notes go to `log` (GraphLog, as the trainer's options take them).
  static LoadedEnsemble load(const std::string& path, c10::Device device,
                             const graphs::GraphLog& log = graphs::log_to_stderr);
  // One checkpoint already read.
  static LoadedEnsemble from_checkpoint(const EnsembleTrainer::Checkpoint& checkpoint, c10::Device device,
                                        const graphs::GraphLog& log = graphs::log_to_stderr);

  // Every member's predictions (all shards' members), combined into the ensemble.
  EnsemblePrediction predict(const at::Tensor& x) const;
  EnsembleMetrics evaluate(const at::Tensor& x, const at::Tensor& y) const;

  // The first shard's trainer (options, classes, standardization: all shards share them).
  const EnsembleTrainer& first() const { return *shards_.front().trainer; }
  const RunDescription& run() const { return run_; }
  int64_t members() const { return members_; }
  int64_t shards() const { return static_cast<int64_t>(shards_.size()); }
  bool sharded() const { return sharded_; }
  // A single checkpoint's trainer, to keep (train on, save): this object is empty after.
  std::unique_ptr<EnsembleTrainer> take_trainer();

 private:
  struct Shard {
    std::unique_ptr<EnsembleTrainer> trainer;
    int64_t first_member = 0;
  };
  std::vector<Shard> shards_;
  RunDescription run_;
  int64_t members_ = 0;
  bool sharded_ = false;
};

}  // namespace packtrain::runtime
