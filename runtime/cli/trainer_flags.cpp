#include "packtrain/runtime/cli/trainer_flags.h"

#include "packtrain/base/number_text.h"
#include "packtrain/runtime/cli/cli_common.h"
#include "packtrain/runtime/cli/enum_option.h"
#include "packtrain/runtime/cli/range_checks.h"
#include "packtrain/runtime/trainers/hyperparameter_sweep.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <stdexcept>

namespace packtrain::cli {

namespace {

// A sweep axis: `--lr 1e-3,3e-3`, the flag repeated, or a config file's
// `lr = [1e-3, 3e-3]` (CLI11 hands its elements over one by one). All of them are
// joined and read strictly (base/number_text.h), so a flag and a config file agree:
// an empty element, nan, inf or a repeated value is an error naming it.
CLI::Option* add_number_list_option(CLI::App* app, const std::string& flag, std::vector<double>& values,
                                    const std::string& help) {
  CLI::Option* option = app->add_option_function<std::vector<std::string>>(
      flag,
      [&values, flag](const std::vector<std::string>& texts) {
        std::string joined;
        for (size_t i = 0; i < texts.size(); ++i) joined += (i == 0 ? "" : ",") + texts[i];
        try {
          values = parse_number_list(joined, flag);
          check_distinct(values, flag);
        } catch (const UserError& e) {
          throw CLI::ValidationError(e.what());
        }
      },
      help);
  std::string shown;
  for (const double v : values) shown += (shown.empty() ? "" : ",") + number_text(v);
  option->type_name("FLOAT")->default_str("[" + shown + "]");  // as CLI11 shows a vector<double>'s
  return option;
}

}  // namespace

void add_trainer_options(CLI::App* app, TrainerFlags& f) {
  runtime::EnsembleTrainerOptions& o = f.options;
  app->add_option("--members", o.members(), "Ensemble members K, trained as one pack")
      ->capture_default_str()->check(positive())->group("Model");
  app->add_option("--hidden", o.hidden(), "Width of each hidden layer")->capture_default_str()->check(positive())->group("Model");
  app->add_option("--depth", o.depth(), "Number of hidden layers")->capture_default_str()->check(non_negative())->group("Model");
  add_enum_option(app, "--activation", o.activation(), ensemble::kActivationNames, "Hidden activation")->group("Model");
  app->add_flag("--layer-norm", o.layer_norm(), "LayerNorm after each hidden layer")->group("Model");
  add_number_list_option(app, "--dropout", f.dropout, "Dropout after each hidden activation, in training; several sweep them as --lr")
      ->group("Model");
  add_enum_option(app, "--head", o.head(), runtime::kHeadNames,
                  "gaussian: mean and variance (deep ensembles); mean: MSE; classification: labels in the target column")
      ->group("Model");
  add_enum_option(app, "--optimizer", o.optimizer(), runtime::kOptimizerKindNames, "Optimizer")->group("Optimizer");
  add_number_list_option(app, "--lr", f.lr,
                         "Learning rate; several, comma-separated (1e-3,3e-3,1e-2), sweep them: train: every (lr, weight "
                         "decay, dropout) triple x --members seeds in one pack, a table per configuration, --select best")
      ->group("Optimizer");
  add_number_list_option(app, "--weight-decay", f.weight_decay, "Weight decay (decoupled for adamw); several sweep them as --lr")
      ->group("Optimizer");
  app->add_option("--momentum", o.momentum(), "SGD momentum")->capture_default_str()->group("Optimizer");
  add_enum_option(app, "--schedule", o.schedule(), ensemble::kLrScheduleKindNames, "Learning-rate schedule")->group("Optimizer");
  app->add_option("--warmup-steps", o.warmup_steps(), "Linear warm-up steps (warmup, cosine)")->capture_default_str()->group("Optimizer");
  app->add_option("--min-lr-factor", o.min_lr_factor(), "Cosine: final learning rate as a fraction of --lr")->capture_default_str()->group("Optimizer");
  app->add_option("--epochs", o.epochs(), "Passes over the training rows")->capture_default_str()->check(positive())->group("Training");
  app->add_option("--batch", o.batch_size(), "Mini-batch size (rows per member per step). Data parallel: the global batch, split equally over the "
                   "ranks (each prints its share at start)")->capture_default_str()->check(positive())->group("Training");
  add_enum_option(app, "--order", o.order(), graphs::kBatchOrderNames,
                  "Member data order: one shared shuffle, a shuffle per member, or a bootstrap resample per member")
      ->group("Training");
  app->add_option("--patience", o.patience(), "Early stopping: epochs without a better validation loss before a member stops (0: off)")
      ->capture_default_str()->check(non_negative())->group("Training");
  add_enum_option(app, "--early-stopping", o.early_stopping(), runtime::kEarlyStoppingNames,
                  "With --patience, whose validation loss decides: each member's own (members stop one by one), or "
                  "the ensemble's (a sweep's configuration, or the whole pack, as one mixture: its members stop together "
                  "at its best epoch)")
      ->group("Training");
  app->add_flag_callback("--no-restore-best", [&o] { o.restore_best(false); },
                         "With --patience: keep each member's last weights instead of its best validation epoch's")->group("Training");
  add_enum_option(app, "--recalibrate", o.recalibration(), runtime::kRecalibrationNames,
                  "Regression with validation rows: once trained, stretch the ensemble's predictive distribution about "
                  "its mean by the one factor that fits the validation rows (its variance times s, s minimizing the "
                  "moment-matched Gaussian NLL there; printed, saved in the checkpoint, used by predict, evaluate and "
                  "acquire); none: predict as trained")
      ->group("Training");
  app->add_option("--seed", o.seed(), "Seed: member i is initialized from (seed, i); batch orders too")->capture_default_str()->check(non_negative())->group("Training");
  app->add_option("--device", f.device, "auto, cpu, cuda or cuda:N")->capture_default_str()->group("Training");
  app->add_flag_callback("--eager", [&o] { o.capture(false); }, "Run every step eagerly (no CUDA graph capture)")->group("Training");
  app->add_option("--unroll", o.unroll(), "Training steps per CUDA graph replay")->capture_default_str()->check(positive())->group("Training");
}

void add_data_options(CLI::App* app, runtime::DataArgs& a) {
  app->add_option("--data", a.data,
                  "Bundled data set (concrete, energy, yacht, wine-quality-red, bostonHousing, kin8nm, naval-propulsion-plant, power-plant, protein-tertiary-structure), a directory in the UCI format, or a CSV/TSV file")
      ->capture_default_str()->group("Data");
  app->add_option("--features", a.features, "Table files: feature columns, comma-separated names or 0-based indices (default: all but the target)")->group("Data");
  app->add_option("--target", a.target, "Table files: the target column, a name or index (default: the last column)")->group("Data");
  app->add_option("--delimiter", a.delimiter, "auto, comma, tab, semicolon or space")->capture_default_str()->group("Data");
  app->add_option("--header", a.header, "Does the table have a header row: auto, yes or no")->capture_default_str()->group("Data");
  app->add_option("--split", a.split, "UCI directories: the standard split k (index_train_k.txt / index_test_k.txt)")
      ->capture_default_str()->check(non_negative())->group("Data");
  app->add_option("--train-index", a.train_index, "File of 0-based training row indices (with --test-index)")->group("Data");
  app->add_option("--val-index", a.val_index, "File of 0-based validation row indices")->group("Data");
  app->add_option("--test-index", a.test_index, "File of 0-based test row indices (with --train-index)")->group("Data");
  app->add_option("--val-fraction", a.val_fraction, "Fraction of the training rows held out for validation (seeded; 0: none)")
      ->capture_default_str()->group("Data");
  app->add_option("--test-fraction", a.test_fraction, "Table files without index files: fraction of rows held out for test")
      ->capture_default_str()->group("Data");
  app->add_option("--split-seed", a.split_seed, "Seed of the random splits")->capture_default_str()->group("Data");
}

runtime::EnsembleTrainerOptions trainer_options(const TrainerFlags& f) {
  runtime::EnsembleTrainerOptions o = f.options;
  if (f.lr.empty() || f.weight_decay.empty() || f.dropout.empty()) {
    throw UsageError("--lr, --weight-decay and --dropout need at least one value");
  }
  o.lr(f.lr.front()).weight_decay(f.weight_decay.front()).dropout(f.dropout.front());
  o.device(pick_device(f.device));
  try {
    o.validate();
    if (f.sweep()) {
      o = within_memory(fmt::format("a sweep of {} configurations x --members {}",
                                    f.lr.size() * f.weight_decay.size() * f.dropout.size(), o.members()),
                        "lower --members or give fewer --lr, --weight-decay or --dropout values",
                        [&] { return runtime::sweep_options(o, {f.lr, f.weight_decay, o.members(), f.dropout}); });
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
