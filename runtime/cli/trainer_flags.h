// The ensemble trainer's options as command-line flags (and config-file keys),
// shared by `train` and `active-learn`, and the data flags of every command that
// loads data. The trainer's flags are generated from its options schema
// (runtime/trainers/ensemble/ensemble_trainer_options.cpp, via schema_flags.h) and bind onto
// EnsembleTrainerOptions itself: the defaults --help shows are the struct's own.
#pragma once

#include "packtrain/runtime/data/run_data.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer_options.h"

#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <vector>

namespace packtrain::cli {

// The trainer's flags and the device name they are used with ("auto" by default;
// the options hold a c10::Device, which has no "auto").
// --hidden, --lr, --weight-decay and --dropout take comma lists, --channels /-separated
// lists: with more than one value, the run is a sweep of their cross product, --members
// seeds each, in one pack (runtime/trainers/ensemble/hyperparameter_sweep.h).
struct TrainerFlags {
  runtime::EnsembleTrainerOptions options;
  std::string device = "auto";
  std::map<std::string, std::vector<double>> sweeps;  // each sweepable option's values, by name
  // Each sweepable list option's lists, by name (--channels 8,16/16,32)
  std::map<std::string, std::vector<std::vector<int64_t>>> list_sweeps;
  const std::vector<double>& values(const std::string& name) const { return sweeps.at(name); }
  bool sweep() const {
    for (const auto& [name, values] : sweeps) {
      if (values.size() > 1) return true;
    }
    for (const auto& [name, lists] : list_sweeps) {
      if (lists.size() > 1) return true;
    }
    return false;
  }
};

void add_trainer_options(CLI::App* app, TrainerFlags& flags);
void add_data_options(CLI::App* app, runtime::DataArgs& args);

// The options the flags describe (a sweep's per-member values included), on the
// picked device; UsageError naming a bad value.
runtime::EnsembleTrainerOptions trainer_options(const TrainerFlags& flags);

}  // namespace packtrain::cli
