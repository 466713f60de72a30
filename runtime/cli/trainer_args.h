// The trainer's options as command-line flags (and config-file keys), shared by
// `train` and `active-learn`, and the data flags of every command that loads data.
#pragma once

#include "runtime/cli/cli_common.h"
#include "runtime/ensemble_trainer_options.h"

#include <CLI/CLI.hpp>

#include <string>

namespace packtrain::cli {

struct TrainerArgs {
  int64_t members = 16;
  int64_t hidden = 64;
  int64_t depth = 2;
  std::string activation = "relu";
  bool layer_norm = false;
  double dropout = 0;
  std::string head = "gaussian";
  std::string optimizer = "adamw";
  double lr = 3e-3;
  double weight_decay = 1e-4;
  double momentum = 0.9;
  std::string schedule = "constant";
  int64_t warmup_steps = 0;
  double min_lr_factor = 0;
  int64_t epochs = 200;
  int64_t batch = 64;
  std::string order = "shared";
  int64_t patience = 0;
  bool no_restore_best = false;
  uint64_t seed = 0;
  std::string device = "auto";
  bool eager = false;
  int64_t unroll = runtime::kDefaultUnroll;
};

void add_trainer_options(CLI::App* app, TrainerArgs& args);
void add_data_options(CLI::App* app, DataArgs& args);

// The trainer options the flags describe; throws UsageError naming a bad value.
runtime::EnsembleTrainerOptions trainer_options(const TrainerArgs& args);

}  // namespace packtrain::cli
