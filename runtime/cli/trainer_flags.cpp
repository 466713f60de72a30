#include "packtrain/runtime/cli/trainer_flags.h"

#include "packtrain/runtime/cli/cli_common.h"
#include "packtrain/runtime/cli/range_checks.h"
#include "packtrain/runtime/cli/schema_flags.h"
#include "packtrain/runtime/trainers/ensemble/hyperparameter_sweep.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace packtrain::cli {

void add_trainer_options(CLI::App* app, TrainerFlags& f) {
  add_schema_flags(app, runtime::trainer_option_schema(), f.options, &f.sweeps, &f.list_sweeps);
  app->add_option("--device", f.device, "auto, cpu, cuda or cuda:N")->capture_default_str()->group("Training");
}

void add_data_options(CLI::App* app, runtime::DataArgs& a) {
  app->add_option("--data", a.data,
                  "Bundled data set (concrete, energy, yacht, wine-quality-red, bostonHousing, kin8nm, "
                  "naval-propulsion-plant, power-plant, protein-tertiary-structure; images and sequences: optdigits, "
                  "mnist1d), a directory in the UCI format, an array directory (features.npy + labels.npy, or "
                  "train_/test_ pairs of them) or an .npz of the same arrays, or a CSV/TSV file")
      ->capture_default_str()
      ->group("Data");
  app->add_option(
         "--features", a.features,
         "Table files: feature columns, comma-separated names or 0-based indices (default: all but the target)")
      ->group("Data");
  app->add_option("--target", a.target, "Table files: the target column, a name or index (default: the last column)")
      ->group("Data");
  app->add_option("--delimiter", a.delimiter, "auto, comma, tab, semicolon or space")
      ->capture_default_str()
      ->group("Data");
  app->add_option("--header", a.header, "Does the table have a header row: auto, yes or no")
      ->capture_default_str()
      ->group("Data");
  app->add_option("--split", a.split, "UCI directories: the standard split k (index_train_k.txt / index_test_k.txt)")
      ->capture_default_str()
      ->check(non_negative())
      ->group("Data");
  app->add_option("--train-index", a.train_index, "File of 0-based training row indices (with --test-index)")
      ->group("Data");
  app->add_option("--val-index", a.val_index, "File of 0-based validation row indices")->group("Data");
  app->add_option("--test-index", a.test_index, "File of 0-based test row indices (with --train-index)")->group("Data");
  app->add_option("--val-fraction", a.val_fraction,
                  "Fraction of the training rows held out for validation (seeded; 0: none)")
      ->capture_default_str()
      ->group("Data");
  app->add_option("--test-fraction", a.test_fraction,
                  "Table files without index files: fraction of rows held out for test")
      ->capture_default_str()
      ->group("Data");
  app->add_option("--split-seed", a.split_seed, "Seed of the random splits")->capture_default_str()->group("Data");
}

runtime::EnsembleTrainerOptions trainer_options(const TrainerFlags& f) {
  runtime::EnsembleTrainerOptions o = f.options;
  const std::vector<double>&lr = f.values("lr"), &weight_decay = f.values("weight_decay"),
        &dropout = f.values("dropout"), &hidden_values = f.values("hidden");
  if (lr.empty() || weight_decay.empty() || dropout.empty() || hidden_values.empty()) {
    throw UsageError("--hidden, --lr, --weight-decay and --dropout need at least one value");
  }
  std::vector<int64_t> hidden;
  for (const double h : hidden_values) {
    if (!(h >= 1 && h <= 1e15 && h == std::floor(h))) {
      throw UsageError(fmt::format("--hidden: widths must be positive integers, got {}", h));
    }
    hidden.push_back(static_cast<int64_t>(h));
  }
  o.lr(lr.front()).weight_decay(weight_decay.front()).dropout(dropout.front()).hidden(hidden.front());
  o.device(pick_device(f.device));
  // The convolution's settings ("cnn: ..." in their help) shape a cnn member only:
  // set for another architecture they would be silently ignored.
  if (o.architecture() != "cnn") {
    const runtime::EnsembleTrainerOptions defaults;
    for (const auto& field : runtime::trainer_option_schema().fields()) {
      if (field.flag.empty() || !field.help.starts_with("cnn:")) continue;
      if (field.get(o) != field.get(defaults)) {
        throw UsageError(
            fmt::format("{} shapes a cnn member's convolutions: give --architecture cnn, or leave {} "
                        "out (this run's architecture is {})",
                        field.flag, field.flag, o.architecture()));
      }
    }
  }
  try {
    o.validate();
    if (f.sweep()) {
      const std::vector<std::vector<int64_t>>& channels = f.list_sweeps.at("channels");
      const runtime::SweepGrid grid{lr,          weight_decay,
                                    o.members(), dropout,
                                    hidden,      channels.size() > 1 ? channels : std::vector<std::vector<int64_t>>{}};
      o = within_memory(fmt::format("a sweep of {} configurations x --members {}", grid.configurations(), o.members()),
                        "lower --members or give fewer --hidden, --lr, --weight-decay, --dropout or --channels values",
                        [&] { return runtime::sweep_options(o, grid); });
    }
    o.validate();
  } catch (const c10::Error& e) {
    throw UsageError(e.what_without_backtrace());
  } catch (const UserError& e) {
    throw UsageError(e.what());
  }
  return o;
}

}  // namespace packtrain::cli
