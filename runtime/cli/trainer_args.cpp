#include "runtime/cli/trainer_args.h"

#include <c10/util/Exception.h>

namespace packtrain::cli {

void add_trainer_options(CLI::App* app, TrainerArgs& a) {
  app->add_option("--members", a.members, "Ensemble members K, trained as one pack")
      ->capture_default_str()->check(CLI::PositiveNumber)->group("Model");
  app->add_option("--hidden", a.hidden, "Width of each hidden layer")->capture_default_str()->check(CLI::PositiveNumber)->group("Model");
  app->add_option("--depth", a.depth, "Number of hidden layers")->capture_default_str()->check(CLI::NonNegativeNumber)->group("Model");
  app->add_option("--activation", a.activation, "relu, gelu, silu or tanh")->capture_default_str()->group("Model");
  app->add_flag("--layer-norm", a.layer_norm, "LayerNorm after each hidden layer")->group("Model");
  app->add_option("--dropout", a.dropout, "Dropout after each hidden activation")->capture_default_str()->group("Model");
  app->add_option("--head", a.head,
                  "gaussian (mean and variance, deep ensembles), mean (MSE) or classification (labels in the target column)")
      ->capture_default_str()->group("Model");
  app->add_option("--optimizer", a.optimizer, "adamw, adam or sgd")->capture_default_str()->group("Optimizer");
  app->add_option("--lr", a.lr, "Learning rate")->capture_default_str()->group("Optimizer");
  app->add_option("--weight-decay", a.weight_decay, "Weight decay (decoupled for adamw)")->capture_default_str()->group("Optimizer");
  app->add_option("--momentum", a.momentum, "SGD momentum")->capture_default_str()->group("Optimizer");
  app->add_option("--schedule", a.schedule, "Learning-rate schedule: constant, warmup or cosine")->capture_default_str()->group("Optimizer");
  app->add_option("--warmup-steps", a.warmup_steps, "Linear warm-up steps (warmup, cosine)")->capture_default_str()->group("Optimizer");
  app->add_option("--min-lr-factor", a.min_lr_factor, "Cosine: final learning rate as a fraction of --lr")->capture_default_str()->group("Optimizer");
  app->add_option("--epochs", a.epochs, "Passes over the training rows")->capture_default_str()->check(CLI::PositiveNumber)->group("Training");
  app->add_option("--batch", a.batch, "Mini-batch size (rows per member per step). Data parallel: the global batch, split equally over the "
                   "ranks (each prints its share at start)")->capture_default_str()->check(CLI::PositiveNumber)->group("Training");
  app->add_option("--order", a.order, "Member data order: shared, per-member (shuffled per member) or bootstrap")
      ->capture_default_str()->group("Training");
  app->add_option("--patience", a.patience, "Early stopping: epochs without a better validation loss before a member stops (0: off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber)->group("Training");
  app->add_flag("--no-restore-best", a.no_restore_best, "With --patience: keep each member's last weights instead of its best validation epoch's")->group("Training");
  app->add_option("--seed", a.seed, "Seed: member i is initialized from (seed, i); batch orders too")->capture_default_str()->group("Training");
  app->add_option("--device", a.device, "auto, cpu, cuda or cuda:N")->capture_default_str()->group("Training");
  app->add_flag("--eager", a.eager, "Run every step eagerly (no CUDA graph capture)")->group("Training");
  app->add_option("--unroll", a.unroll, "Training steps per CUDA graph replay")->capture_default_str()->check(CLI::PositiveNumber)->group("Training");
}

void add_data_options(CLI::App* app, DataArgs& a) {
  app->add_option("--data", a.data,
                  "Bundled data set (concrete, energy, yacht, wine-quality-red), a directory in the UCI format, or a CSV/TSV file")
      ->capture_default_str()->group("Data");
  app->add_option("--features", a.features, "Table files: feature columns, comma-separated names or 0-based indices (default: all but the target)")->group("Data");
  app->add_option("--target", a.target, "Table files: the target column, a name or index (default: the last column)")->group("Data");
  app->add_option("--delimiter", a.delimiter, "auto, comma, tab, semicolon or space")->capture_default_str()->group("Data");
  app->add_option("--header", a.header, "Does the table have a header row: auto, yes or no")->capture_default_str()->group("Data");
  app->add_option("--split", a.split, "UCI directories: the standard split k (index_train_k.txt / index_test_k.txt)")
      ->capture_default_str()->check(CLI::NonNegativeNumber)->group("Data");
  app->add_option("--train-index", a.train_index, "File of 0-based training row indices (with --test-index)")->group("Data");
  app->add_option("--val-index", a.val_index, "File of 0-based validation row indices")->group("Data");
  app->add_option("--test-index", a.test_index, "File of 0-based test row indices (with --train-index)")->group("Data");
  app->add_option("--val-fraction", a.val_fraction, "Fraction of the training rows held out for validation (seeded; 0: none)")
      ->capture_default_str()->group("Data");
  app->add_option("--test-fraction", a.test_fraction, "Table files without index files: fraction of rows held out for test")
      ->capture_default_str()->group("Data");
  app->add_option("--split-seed", a.split_seed, "Seed of the random splits")->capture_default_str()->group("Data");
}

runtime::EnsembleTrainerOptions trainer_options(const TrainerArgs& a) {
  try {
    runtime::EnsembleTrainerOptions o;
    o.members(a.members).hidden(a.hidden).depth(a.depth).activation(ensemble::parse_activation(a.activation));
    o.layer_norm(a.layer_norm).dropout(a.dropout).head(runtime::parse_head(a.head));
    o.optimizer(runtime::parse_optimizer(a.optimizer)).lr(a.lr).weight_decay(a.weight_decay).momentum(a.momentum);
    o.schedule(ensemble::parse_lr_schedule(a.schedule)).warmup_steps(a.warmup_steps).min_lr_factor(a.min_lr_factor);
    o.epochs(a.epochs).batch_size(a.batch).order(graphs::parse_batch_order(a.order)).patience(a.patience);
    o.restore_best(!a.no_restore_best).seed(a.seed).device(pick_device(a.device)).capture(!a.eager).unroll(a.unroll);
    o.validate();
    return o;
  } catch (const c10::Error& e) {
    throw UsageError(e.what_without_backtrace());
  }
}

}  // namespace packtrain::cli
