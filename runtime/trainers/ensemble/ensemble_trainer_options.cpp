#include "packtrain/runtime/trainers/ensemble/ensemble_trainer_options.h"

#include "packtrain/base/option_schema.h"
#include "packtrain/base/user_error.h"
#include "packtrain/ensemble/architectures.h"

#include <nlohmann/json.hpp>

#include <limits>
#include <string>

namespace packtrain::runtime {

namespace {

using Schema = OptionSchema<EnsembleTrainerOptions>;

// "Member architecture: mlp (…), residual-mlp (…)", from the registry itself.
std::string architecture_help() {
  std::string help = "Member architecture:";
  for (const ensemble::Architecture& a : ensemble::architectures()) {
    help +=
        std::string(help.back() == ':' ? " " : "; ") + std::string(a.name) + " (" + std::string(a.description) + ")";
  }
  return help;
}

void describe_model(Schema& s) {
  s.option(PACKTRAIN_OPTION(members)).help_text("Ensemble members K, trained as one pack").in_group("Model").above(0);
  s.option(PACKTRAIN_OPTION(architecture))
      .one_of(ensemble::architecture_names(), "architecture")
      .help_text(architecture_help())
      .in_group("Model")
      .added_in(2, "mlp");
  s.option(PACKTRAIN_OPTION(hidden))
      .help_text(
          "Width of each hidden layer; several (32,64,128) train members of each width in one pack, padded to the "
          "widest, swept as --lr (mlp; cnn: the head)")
      .in_group("Model")
      .above(0)
      .sweepable();
  s.option(PACKTRAIN_OPTION(depth))
      .help_text("Number of hidden layers (residual-mlp: residual blocks)")
      .in_group("Model")
      .at_least(0);
  s.option(PACKTRAIN_OPTION(channels))
      .help_text(
          "cnn: output channels of each convolution block (convolution, norm, relu, pool 2), comma-separated; "
          "several lists separated by / (8,16/16,32) train members of each in one pack, padded to the widest, swept "
          "as --lr")
      .in_group("Model")
      .above(0)
      .sweepable()
      .added_in(3, ensemble::kDefaultCnnChannels);
  s.option(PACKTRAIN_OPTION(kernel))
      .help_text("cnn: kernel size of each convolution (odd with the default \"same\" padding)")
      .in_group("Model")
      .above(0)
      .added_in(4, 3);
  s.option(PACKTRAIN_OPTION(stride))
      .help_text("cnn: stride of each convolution (each block still pools by 2 after it)")
      .in_group("Model")
      .above(0)
      .added_in(5, 1);
  s.option(PACKTRAIN_OPTION(padding))
      .help_text("cnn: zero padding on each side of each convolution's input; -1: \"same\", kernel/2")
      .in_group("Model")
      .at_least(ensemble::kSamePadding)
      .added_in(5, ensemble::kSamePadding);
  s.choice(PACKTRAIN_OPTION(pool), ensemble::kPoolNames)
      .help_text("cnn: each block's pooling, kernel and stride 2: max, or avg (average)")
      .in_group("Model")
      .added_in(4, "max");
  s.option(PACKTRAIN_OPTION(norm_groups))
      .help_text(
          "cnn: GroupNorm(G, channels) after each convolution, G groups dividing every block's channels "
          "(1: a layer norm over the block's channels and positions); 0: none")
      .in_group("Model")
      .at_least(0)
      .added_in(4, 0);
  // One sample's shape, from the data set (EnsembleTrainer::set_input_shape).
  s.option(PACKTRAIN_OPTION(input_shape)).internal().above(0).added_in(3, nlohmann::json::array());
  s.choice(PACKTRAIN_OPTION(activation), ensemble::kActivationNames).help_text("Hidden activation").in_group("Model");
  s.option(PACKTRAIN_OPTION(layer_norm)).help_text("LayerNorm after each hidden layer").in_group("Model");
  s.option(PACKTRAIN_OPTION(dropout))
      .help_text("Dropout after each hidden activation, in training; several sweep them as --lr")
      .in_group("Model")
      .at_least(0)
      .below(1)
      .sweepable();
  s.choice(PACKTRAIN_OPTION(head), kHeadNames)
      .help_text("gaussian: mean and variance (deep ensembles); mean: MSE; classification: labels in the target column")
      .in_group("Model");
  s.option(PACKTRAIN_OPTION(min_variance))
      .help_text("Gaussian head: the floor of each member's predicted variance, in standardized units")
      .in_group("Model")
      .at_least(0)
      .finite_only();
}

void describe_optimizer(Schema& s) {
  s.choice(PACKTRAIN_OPTION(optimizer), kOptimizerKindNames).help_text("Optimizer").in_group("Optimizer");
  s.option(PACKTRAIN_OPTION(lr))
      .help_text(
          "Learning rate; several, comma-separated (1e-3,3e-3,1e-2), sweep them: train: every (lr, weight "
          "decay, dropout) triple x --members seeds in one pack, a table per configuration, --select best")
      .in_group("Optimizer")
      .above(0)
      .finite_only()
      .sweepable();
  s.option(PACKTRAIN_OPTION(weight_decay))
      .help_text("Weight decay (decoupled for adamw); several sweep them as --lr")
      .in_group("Optimizer")
      .at_least(0)
      .finite_only()
      .sweepable();
  s.option(PACKTRAIN_OPTION(momentum))
      .help_text("SGD momentum (Nesterov off)")
      .in_group("Optimizer")
      .at_least(0)
      .below(1);
  // Per-member values: a sweep's pack (runtime/trainers/ensemble/hyperparameter_sweep.h).
  s.option(PACKTRAIN_OPTION(member_lr)).internal().above(0).finite_only().added_in(2, nlohmann::json::array());
  s.option(PACKTRAIN_OPTION(member_weight_decay))
      .internal()
      .at_least(0)
      .finite_only()
      .added_in(2, nlohmann::json::array());
  s.option(PACKTRAIN_OPTION(member_dropout)).internal().at_least(0).below(1).added_in(2, nlohmann::json::array());
  s.option(PACKTRAIN_OPTION(member_hidden)).internal().above(0).added_in(4, nlohmann::json::array());
  s.option(PACKTRAIN_OPTION(member_channels)).internal().above(0).added_in(6, nlohmann::json::array());
  s.choice(PACKTRAIN_OPTION(schedule), ensemble::kLrScheduleKindNames)
      .help_text("Learning-rate schedule")
      .in_group("Optimizer");
  s.option(PACKTRAIN_OPTION(warmup_steps))
      .help_text("Linear warm-up steps (warmup, cosine)")
      .in_group("Optimizer")
      .at_least(0);
  s.option(PACKTRAIN_OPTION(min_lr_factor))
      .help_text("Cosine: final learning rate as a fraction of --lr")
      .in_group("Optimizer")
      .at_least(0)
      .at_most(1);
}

void describe_training(Schema& s) {
  s.option(PACKTRAIN_OPTION(epochs)).help_text("Passes over the training rows").in_group("Training").above(0);
  s.option(PACKTRAIN_OPTION(batch_size))
      .flag_name("--batch")
      .help_text(
          "Mini-batch size (rows per member per step). Data parallel: the global batch, split equally over the "
          "ranks (each prints its share at start)")
      .in_group("Training")
      .above(0);
  s.choice(PACKTRAIN_OPTION(order), graphs::kBatchOrderNames)
      .help_text("Member data order: one shared shuffle, a shuffle per member, or a bootstrap resample per member")
      .in_group("Training");
  s.option(PACKTRAIN_OPTION(patience))
      .help_text("Early stopping: epochs without a better validation loss before a member stops (0: off)")
      .unset("50 with validation rows, else 0")
      .in_group("Training")
      .at_least(0);
  s.choice(PACKTRAIN_OPTION(early_stopping), kEarlyStoppingNames)
      .help_text(
          "With --patience, whose validation loss decides: each member's own (members stop one by one), or the "
          "ensemble's (a sweep's configuration, or the whole pack, as one mixture: its members stop together at "
          "its best epoch)")
      .in_group("Training")
      .added_in(2, "member");
  s.option(PACKTRAIN_OPTION(restore_best))
      .flag_name("--no-restore-best")
      .sets_false()
      .help_text("With --patience: keep each member's last weights instead of its best validation epoch's")
      .in_group("Training");
  s.choice(PACKTRAIN_OPTION(recalibration), kRecalibrationNames)
      .flag_name("--recalibrate")
      .help_text(
          "Regression with validation rows: once trained, stretch the ensemble's predictive distribution about "
          "its mean by the one factor that fits the validation rows (its variance times s, s minimizing the "
          "moment-matched Gaussian NLL there; printed, saved in the checkpoint, used by predict, evaluate and "
          "acquire); none: predict as trained")
      .in_group("Training")
      .added_in(2, "none");  // older checkpoints predict as they were trained
  s.option(PACKTRAIN_OPTION(seed))
      .help_text("Seed: member i is initialized from (seed, i); batch orders too")
      .in_group("Training");
  s.option(PACKTRAIN_OPTION(first_member)).internal().at_least(0).added_in(2, 0);  // member-parallel shards
  s.option(PACKTRAIN_OPTION(device)).no_flag().help_text("Device: cpu, cuda or cuda:N").in_group("Training");
  s.choice(PACKTRAIN_OPTION(precision), ensemble::kPrecisionNames)
      .help_text(
          "Arithmetic: fp32, or bf16-mixed (torch.autocast's bfloat16 policy: matrix products and convolutions "
          "in bfloat16 with float32 accumulation; weights, optimizer, losses and predictions stay float32). "
          "bf16-mixed pays on wide packs (hidden >= 256) where the CPU has bfloat16 units (packtrain info) or on "
          "a GPU; small packs run slower, and near-noiseless targets lose accuracy (docs/guide.md)")
      .in_group("Training")
      .added_in(7, "fp32");
  s.option(PACKTRAIN_OPTION(capture))
      .flag_name("--eager")
      .sets_false()
      .help_text("Run every step eagerly (no CUDA graph capture)")
      .in_group("Training");
  s.option(PACKTRAIN_OPTION(unroll)).help_text("Training steps per CUDA graph replay").in_group("Training").above(0);
}

template <typename T>
void check_per_member(const std::vector<T>& values, int64_t members, const char* what) {
  if (!values.empty() && static_cast<int64_t>(values.size()) != members) {
    throw UserError(std::string("per-member ") + what + ": expected one per member (" + std::to_string(members) +
                    "), got " + std::to_string(values.size()));
  }
}

}  // namespace

const OptionSchema<EnsembleTrainerOptions>& trainer_option_schema() {
  static const Schema schema = [] {
    Schema s("trainer options", kTrainerOptionsFormat);
    describe_model(s);
    describe_optimizer(s);
    describe_training(s);
    return s;
  }();
  return schema;
}

void EnsembleTrainerOptions::validate() const {
  trainer_option_schema().check_ranges(*this);
  // Members first_member .. first_member + members - 1 are numbered in int64 (their seeds, shard names).
  if (first_member() > std::numeric_limits<int64_t>::max() - members()) {
    throw UserError("first_member " + std::to_string(first_member()) + " + " + std::to_string(members()) +
                    " members runs past the largest member number (" +
                    std::to_string(std::numeric_limits<int64_t>::max()) + ")");
  }
  check_per_member(member_lr(), members(), "learning rates");
  check_per_member(member_weight_decay(), members(), "weight decays");
  check_per_member(member_dropout(), members(), "dropout rates");
  check_per_member(member_hidden(), members(), "hidden widths");
  for (const int64_t width : member_hidden()) {
    if (width > hidden()) {
      throw UserError("per-member hidden width " + std::to_string(width) + " is wider than the pack (hidden " +
                      std::to_string(hidden()) + ")");
    }
  }
  if (!member_channels().empty()) {
    const size_t blocks = channels().size();
    if (member_channels().size() != static_cast<size_t>(members()) * blocks) {
      throw UserError("per-member channels: expected " + std::to_string(members()) + " members x " +
                      std::to_string(blocks) + " blocks = " + std::to_string(static_cast<size_t>(members()) * blocks) +
                      " counts, got " + std::to_string(member_channels().size()));
    }
    for (size_t i = 0; i < member_channels().size(); ++i) {
      if (member_channels()[i] > channels()[i % blocks]) {
        throw UserError("member " + std::to_string(i / blocks) + "'s block " + std::to_string(i % blocks) + " has " +
                        std::to_string(member_channels()[i]) + " channels, more than the pack's " +
                        std::to_string(channels()[i % blocks]));
      }
    }
  }
  if (layer_norm() && !member_hidden().empty()) {
    throw UserError(
        "--layer-norm with several --hidden widths: LayerNorm would count a narrower member's padding in its "
        "statistics; give one width, or leave out --layer-norm");
  }
}

std::vector<std::vector<int64_t>> EnsembleTrainerOptions::member_channel_lists() const {
  std::vector<std::vector<int64_t>> lists;
  const auto blocks = static_cast<std::ptrdiff_t>(channels().size());
  for (auto it = member_channels().begin(); blocks > 0 && member_channels().end() - it >= blocks; it += blocks) {
    lists.emplace_back(it, it + blocks);
  }
  return lists;
}

int64_t resolved_patience(const EnsembleTrainerOptions& o, bool has_validation) {
  if (!o.patience()) return has_validation ? kDefaultPatience : 0;
  if (*o.patience() > 0 && !has_validation) {
    throw UserError(
        "patience > 0 needs validation rows to stop on (a validation fraction > 0, or validation data), "
        "got patience " +
        std::to_string(*o.patience()) + " and none");
  }
  return *o.patience();
}

std::string to_json(const EnsembleTrainerOptions& o) { return trainer_option_schema().to_json(o).dump(); }

EnsembleTrainerOptions options_from_json(const std::string& text) {
  // Version 1 wrote no format_version; its checkpoints stopped on each member's own
  // loss unless they said otherwise, and trained with the patience they stored.
  EnsembleTrainerOptions o = trainer_option_schema().parse(text);
  o.validate();
  return o;
}

}  // namespace packtrain::runtime
