// A hyperparameter sweep trained as one pack: every configuration of a grid of
// cnn channel lists x hidden widths x learning rates x weight decays x dropout rates,
// each with `seeds` members, in one EnsembleTrainer (per-member values in
// EnsembleTrainerOptions::member_channels / member_hidden / member_lr /
// member_weight_decay / member_dropout, one captured step for all; members of
// different widths or channels are padded to the widest, packed_mlp.h, packed_cnn.h).
// Member k belongs to configuration k / seeds, channels outermost, dropout innermost.
// (Schedules and Adam's betas are not swept: they are scalars of the fused update
// kernels, CPU and CUDA, not per-member tensors.) The configurations are read back
// from the options, so a resumed run reports them too; each is scored as its own
// ensemble, and the best one by validation loss only can be kept
// (EnsembleTrainer::keep_members).
#pragma once

#include "packtrain/runtime/trainers/ensemble/ensemble_predictions.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer_options.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace packtrain::runtime {

class EnsembleTrainer;

struct SweepGrid {
  std::vector<double> lr, weight_decay;  // at least one value each
  int64_t seeds = 1;                     // members per configuration
  std::vector<double> dropout;           // empty: the options' own rate
  std::vector<int64_t> hidden;           // empty: the options' own width
  // cnn channel lists, each one count per block (empty: the options' own channels).
  std::vector<std::vector<int64_t>> channels;
  // Configurations in the grid (an empty axis counts once); whether there are several.
  size_t configurations() const;
  bool sweeps() const { return configurations() > 1; }
};

// `base` with members = configurations x seeds and the per-member values set;
// throws UserError on an empty or repeated axis or seeds < 1, and
// DataError (memory_estimate.h's check_memory, before any per-member value is
// built) when even the least run of that many members (one feature, no rows) needs
// more memory than is available.
EnsembleTrainerOptions sweep_options(EnsembleTrainerOptions base, const SweepGrid& grid);

struct SweepConfiguration {
  double lr = 0, weight_decay = 0, dropout = 0;
  int64_t hidden = 0;
  std::vector<int64_t> channels;  // its cnn channels; empty when the pack's members share theirs
  int64_t first_member = 0, members = 0;
};
// The configurations the options train: runs of consecutive members with the same
// (channels, hidden, lr, weight decay, dropout); one configuration (every member)
// without per-member values.
std::vector<SweepConfiguration> sweep_configurations(const EnsembleTrainerOptions& options);

struct ConfigurationReport {
  SweepConfiguration configuration;
  // The selection criterion: the mean over its usable members of each member's loss
  // on the validation rows in original units — Gaussian NLL, cross-entropy, or RMSE
  // for a mean head (NaN without validation rows).
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  EnsembleMetrics validation, test;  // its members as one ensemble (empty without rows)
  int64_t usable = 0;
};

// Scores each configuration on the validation and test rows (either may be empty).
std::vector<ConfigurationReport> report_configurations(const EnsembleTrainer& trainer, const at::Tensor& val_x,
                                                       const at::Tensor& val_y, const at::Tensor& test_x,
                                                       const at::Tensor& test_y);

// The index of the configuration with the lowest validation loss; throws
// UserError when no configuration has one (no validation rows).
size_t best_configuration(const std::vector<ConfigurationReport>& reports);

}  // namespace packtrain::runtime
