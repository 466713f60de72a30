// `packtrain train` and `packtrain resume`: train (or continue) a packed ensemble
// through the run driver (progress, checkpoints, Ctrl-C), then report test metrics
// per member and for the ensemble. One process, data parallel, or member parallel.
#include "packtrain/profiling/trace.h"
#include "packtrain/runtime/cli/cli_common.h"
#include "packtrain/runtime/cli/commands.h"
#include "packtrain/runtime/cli/metrics_report.h"
#include "packtrain/runtime/cli/output_paths.h"
#include "packtrain/runtime/cli/progress.h"
#include "packtrain/runtime/cli/range_checks.h"
#include "packtrain/runtime/cli/run_driver.h"
#include "packtrain/runtime/cli/trainer_flags.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/fingerprint.h"
#include "packtrain/runtime/data/run_data.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/distributed/rank_info.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/measure/cpu_memory.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_export.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "packtrain/runtime/trainers/ensemble/hyperparameter_sweep.h"
#include "packtrain/runtime/trainers/ensemble/member_parallel.h"
#include "packtrain/runtime/trainers/ensemble/run_resume.h"
#include "packtrain/runtime/trainers/memory_estimate.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>

namespace packtrain::cli {

namespace {

using runtime::DataArgs;
using runtime::SplitData;

// What a training session writes and prints, common to train and resume.
struct SessionArgs {
  OutputArgs output;
  CheckpointArgs checkpoint;
  std::string export_path;
  std::string trace;
  int64_t rank_check_every = 0;  // data parallel: steps between parameter-checksum comparisons (0: every epoch)
  bool select_best = false;      // a sweep: keep the configuration with the lowest validation loss
};

void add_session_options(CLI::App* app, SessionArgs& s) {
  app->add_option(
         "--checkpoint", s.checkpoint.path,
         "Write a checkpoint here at the end, every --checkpoint-every epochs, and on Ctrl-C (atomic: the last good "
         "file survives a crash)")
      ->group("Output");
  app->add_option("--checkpoint-every", s.checkpoint.every, "Epochs between checkpoints (0: only at the end)")
      ->capture_default_str()
      ->check(non_negative())
      ->group("Output");
  app->add_option("--export", s.export_path,
                  "Also write all members for Python: torch.load(path) (scripts/load_packtrain_export.py)")
      ->group("Output");
  app->add_option("--trace", s.trace, "Write the run's NVTX ranges as Chrome trace JSON (open in ui.perfetto.dev)")
      ->group("Output");
  add_output_options(app, s.output);
  app->add_option("--rank-check-every", s.rank_check_every,
                  "Data parallel: also compare the ranks' parameter checksums every this many steps (each a host "
                  "synchronization; 0: after every epoch only)")
      ->capture_default_str()
      ->check(non_negative())
      ->group("Multi-process");
  app->add_option_function<std::string>(
         "--select",
         [&s](const std::string& v) {
           if (v != "all" && v != "best") throw CLI::ValidationError("--select", "expected all or best, got " + v);
           s.select_best = v == "best";
         },
         "A sweep (--hidden/--lr/--weight-decay/--dropout lists): all keeps every configuration's members; best keeps "
         "the "
         "configuration with the lowest validation loss (its members' mean NLL, or RMSE for a mean head, on the "
         "validation rows "
         "only) and deselects the rest before the test metrics and the checkpoint")
      ->default_str("all")
      ->group("Training");
}

// How a session is spread over processes: one process (no group), data parallel
// (every rank trains all members on its share of each batch), or member parallel
// (each rank trains its shard of the members; `sharded` writes the checkpoints).
struct Distribution {
  runtime::distributed::ProcessGroup* group = nullptr;
  runtime::ShardedCheckpoint* sharded = nullptr;  // member parallel
  runtime::MemberShard shard;
  int64_t members = 0;  // the whole ensemble's, member parallel
  bool member_parallel() const { return sharded != nullptr; }

  static Distribution over(runtime::distributed::ProcessGroup* group) {  // none: one process
    Distribution d;
    d.group = group;
    return d;
  }
  static Distribution members_over(runtime::distributed::ProcessGroup& group, runtime::ShardedCheckpoint& sharded,
                                   runtime::MemberShard shard, int64_t members) {
    Distribution d = over(&group);
    d.sharded = &sharded;
    d.shard = shard;
    d.members = members;
    return d;
  }
};

// A session: the trainer, its data and how it is spread, reported by `command`.
struct Session {
  runtime::EnsembleTrainer& trainer;
  const SplitData& data;
  const DataArgs& data_args;
  const SessionArgs& args;
  const char* command;
  Distribution dist;
};

// A sweep's distinct hidden widths as "{4,32}".
std::string widths_text(const std::vector<runtime::SweepConfiguration>& configurations) {
  std::string text;
  for (const runtime::SweepConfiguration& c : configurations) {
    const std::string width = std::to_string(c.hidden);
    if (("," + text + ",").find("," + width + ",") == std::string::npos) {
      if (!text.empty()) text += ',';
      text += width;
    }
  }
  return "{" + text + "}";
}

// A cnn's channels: "channels 8,16", or a sweep's distinct lists "channels {8,16/16,32}".
std::string channels_text(const runtime::EnsembleTrainerOptions& o,
                          const std::vector<runtime::SweepConfiguration>& configurations) {
  if (o.member_channels().empty()) return fmt::format(" (channels {})", fmt::join(o.channels(), ","));
  std::vector<std::string> lists;
  for (const runtime::SweepConfiguration& c : configurations) {
    const std::string list = fmt::format("{}", fmt::join(c.channels, ","));
    if (std::find(lists.begin(), lists.end(), list) == lists.end()) lists.push_back(list);
  }
  return fmt::format(" (channels {{{}}})", fmt::join(lists, "/"));
}

void describe(const Session& s, RunDriver& driver) {
  const runtime::EnsembleTrainerOptions& o = s.trainer.options();
  const runtime::distributed::ProcessGroup* group = s.dist.group;
  if (s.dist.member_parallel()) {
    driver.note(
        fmt::format("member parallel: {} members over {} ranks ({}); rank 0 trains members {}..{}, no "
                    "gradient traffic",
                    s.dist.members, group->world_size(), group->info().source, s.dist.shard.first,
                    s.dist.shard.first + s.dist.shard.count - 1));
  } else if (group != nullptr) {
    driver.note(
        fmt::format("data parallel: {} ranks ({}), global batch {} = {} per rank; gradients averaged "
                    "over {} every step",
                    group->world_size(), group->info().source, s.trainer.batch_size(), s.trainer.per_rank_batch(),
                    group->backends()));
  }
  const auto configurations = runtime::sweep_configurations(o);
  if (configurations.size() > 1) {
    driver.note(fmt::format(
        "sweep: {} configurations ({}hidden width x learning rate x weight decay x dropout) x {} members in one "
        "pack",
        configurations.size(), o.member_channels().empty() ? "" : "channels x ", configurations.front().members));
  }
  driver.note(fmt::format(
      "packtrain {}: {} on {}; {} members, {} head, {}x{} {}, {} epochs, batch {}, {} order{}", s.command,
      s.data.description, o.device().str(), o.members(), runtime::to_string(o.head()), o.depth(),
      // Members of different widths: each width, in sweep order (the pack is the widest).
      o.member_hidden().empty() ? std::to_string(o.hidden()) : widths_text(configurations),
      o.architecture() == "mlp"   ? std::string(ensemble::to_string(o.activation()))
      : o.architecture() == "cnn" ? o.architecture() + channels_text(o, configurations)
                                  : o.architecture(),
      o.epochs(), s.trainer.batch_size(), graphs::to_string(o.order()),
      s.trainer.patience() > 0
          ? fmt::format(", early stopping on {} validation loss (patience {})",
                        o.early_stopping() == runtime::EarlyStopping::kEnsemble ? "the ensemble's" : "each member's",
                        s.trainer.patience())
          : ""));
}

// Writes the session's checkpoint (member parallel: this rank's shard, then the
// manifest; data parallel: rank 0 alone).
void save(const Session& s, const RunDriver& driver) {
  const std::string& path = driver.checkpoint().path;
  if (path.empty()) return;
  const std::string extra = to_json(runtime::RunDescription{
      s.data_args, s.data.all.feature_names, s.data.all.target_name, runtime::fingerprint_hex(s.data.fingerprint)});
  if (s.dist.member_parallel()) {
    s.dist.sharded->save(s.trainer, extra);
  } else if (driver.primary()) {
    s.trainer.save(path, extra);
  }
}

// A run whose every member diverged with no earlier good weights has nothing worth
// saving: it stops before the epoch's checkpoint would replace a good one, saying
// when and what to change (exit 2). Member parallel: a shard sees only its own
// members, so the ranks add up their counts (every rank runs every epoch).
void stop_if_every_member_diverged(const Session& s, const RunDriver& driver, int64_t epoch) {
  const auto& members = s.trainer.member_states();
  double usable = static_cast<double>(
      std::count_if(members.begin(), members.end(), [](const runtime::MemberState& m) { return m.usable; }));
  if (s.dist.member_parallel()) {
    at::Tensor count = at::full({1}, usable, at::kDouble);
    s.dist.group->all_reduce_sum_(count, "divergence check");
    usable = count.item<double>();
  }
  if (usable > 0) return;
  const std::string& path = driver.checkpoint().path;
  throw runtime::DataError(fmt::format(
      "every member diverged by epoch {} (a non-finite loss before any good weights): nothing was saved{}; try a "
      "smaller --lr (this run: {})",
      epoch, path.empty() ? "" : ", " + path + " is as it was", s.trainer.options().lr()));
}

// The epochs, with progress, checkpoints and the --trace window; false when interrupted.
bool train_epochs(const Session& s, RunDriver& driver, Progress& progress, DeferredWriteError& writes) {
  if (!s.args.trace.empty()) profiling::trace_start();
  const bool finished = s.trainer.train(
      [&](const runtime::EpochReport& r) {
        progress.epoch(r, s.trainer.options().members());
        stop_if_every_member_diverged(s, driver, r.epoch);
        return driver.after_epoch(r.epoch, r.epochs, s.trainer.steps_taken(), [&] { save(s, driver); });
      },
      /*stop_when_idle=*/!s.dist.member_parallel());
  driver.end_line();
  if (!s.args.trace.empty()) {
    profiling::trace_stop();
    if (writes.attempt([&] { runtime::write_file_atomically(s.args.trace, profiling::chrome_trace_json()); })) {
      driver.note("Chrome trace written to " + s.args.trace);
    }
  }
  return finished;
}

// Member parallel: every rank takes part in the gather; rank 0 reports the whole ensemble.
int report_member_parallel(const Session& s, const RunDriver& driver, const Progress& progress) {
  const runtime::Dataset test = s.data.test();
  const bool has_test = test.features.size(0) > 0;
  const runtime::distributed::ProcessGroup& group = *s.dist.group;
  const runtime::EnsemblePrediction all =
      has_test ? runtime::gather_predictions(s.trainer, test.features, s.dist.shard, s.dist.members, *s.dist.group)
               : runtime::EnsemblePrediction{};
  if (!driver.primary()) return 0;
  const runtime::Head head = s.trainer.options().head();
  const runtime::EnsembleMetrics metrics =
      has_test ? runtime::ensemble_metrics(all, test.targets, head, s.trainer.classes()) : runtime::EnsembleMetrics{};
  const std::string& checkpoint = driver.checkpoint().path;
  if (driver.json()) {
    nlohmann::json out = has_test ? gathered_metrics_json(metrics, head) : nlohmann::json::object();
    out["command"] = s.command;
    out["member_parallel"] = {{"ranks", group.world_size()}, {"members", s.dist.members}};
    out["epochs_run"] = s.trainer.epoch();
    out["train_seconds"] = progress.seconds();
    out["checkpoint"] = checkpoint;
    out["test_rows"] = test.features.size(0);
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (has_test) {
    print_gathered_metrics(metrics, head,
                           fmt::format("Test metrics ({} rows, original units), {} members gathered from {} ranks",
                                       test.features.size(0), s.dist.members, group.world_size()));
  }
  fmt::print("\nTrained {} members on {} ranks for {} epochs in {:.2f} s.\n", s.dist.members, group.world_size(),
             s.trainer.epoch(), progress.seconds());
  if (!checkpoint.empty()) fmt::print("Checkpoint manifest: {} ({} shards)\n", checkpoint, group.world_size());
  return 0;
}

nlohmann::json result_json(const Session& s, const RunDriver& driver, const Progress& progress,
                           const runtime::EnsembleMetrics* metrics) {
  const runtime::EnsembleTrainerOptions& o = s.trainer.options();
  nlohmann::json out = metrics != nullptr ? metrics_json(s.trainer, *metrics) : nlohmann::json::object();
  out["command"] = s.command;
  out["data"] = s.data.description;
  out["device"] = o.device().str();
  out["options"] = nlohmann::json::parse(runtime::to_json(o));
  out["epochs_run"] = s.trainer.epoch();
  out["train_seconds"] = progress.seconds();
  out["member_steps_per_second"] = progress.member_steps_per_second();
  out["test_rows"] = s.data.split.test.size();
  out["checkpoint"] = driver.checkpoint().path;
  if (const runtime::distributed::ProcessGroup* group = s.dist.group) {
    out["data_parallel"] = {{"ranks", group->world_size()},
                            {"global_batch", s.trainer.batch_size()},
                            {"per_rank_batch", s.trainer.per_rank_batch()},
                            {"backends", group->backends()}};
  }
  out["log"] = driver.graph_log_lines();
  return out;
}

// The sweep's configurations scored on the validation and test rows (empty when the
// run trains one configuration).
std::vector<runtime::ConfigurationReport> sweep_reports(const Session& s) {
  if (runtime::sweep_configurations(s.trainer.options()).size() < 2) return {};
  const runtime::Dataset val = s.data.validation(), test = s.data.test();
  return runtime::report_configurations(s.trainer, val.features, val.targets, test.features, test.targets);
}

// --select best: keeps the configuration with the lowest validation loss.
void select_configuration(const Session& s, RunDriver& driver,
                          const std::vector<runtime::ConfigurationReport>& reports) {
  if (reports.empty()) return;
  const runtime::ConfigurationReport& best = reports[runtime::best_configuration(reports)];
  const runtime::SweepConfiguration& c = best.configuration;
  s.trainer.keep_members(c.first_member, c.members);
  driver.note(fmt::format(
      "sweep: kept {}hidden {}, lr {:g}, weight decay {:g}, dropout {:g} (members {}..{}; mean "
      "validation loss {:.4f}); the other {} configurations' members are deselected",
      c.channels.empty() ? "" : fmt::format("channels {}, ", fmt::join(c.channels, ",")), c.hidden, c.lr,
      c.weight_decay, c.dropout, c.first_member, c.first_member + c.members - 1, best.val_loss, reports.size() - 1));
}

// One process or data parallel: rank 0 exports and reports the test metrics
// (`saved`: whether the final checkpoint was written).
int report(const Session& s, const RunDriver& driver, const Progress& progress, DeferredWriteError& writes, bool saved,
           const std::vector<runtime::ConfigurationReport>& sweep) {
  if (!driver.primary()) return 0;
  const bool exported = !s.args.export_path.empty() && writes.attempt([&] {
    runtime::export_members(s.args.export_path, s.trainer, s.data.all.feature_names, {});
  });
  const double seconds = progress.seconds();
  const runtime::Dataset test = s.data.test();
  const bool has_test = test.features.size(0) > 0;
  const runtime::EnsembleMetrics metrics =
      has_test ? s.trainer.evaluate(test.features, test.targets) : runtime::EnsembleMetrics{};
  const runtime::Head head = s.trainer.options().head();
  if (driver.json()) {
    nlohmann::json out = result_json(s, driver, progress, has_test ? &metrics : nullptr);
    if (!sweep.empty()) out["configurations"] = sweep_json(sweep, head);
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (!sweep.empty()) print_sweep(sweep, head, s.trainer);
  if (has_test) {
    print_metrics(s.trainer, metrics, fmt::format("Test metrics ({} rows, original units)", test.features.size(0)));
  } else {
    fmt::print("\nNo test rows (test fraction 0): no test metrics.\n");
  }
  const runtime::EnsembleTrainerOptions& o = s.trainer.options();
  fmt::print("\nTrained {} members for {} epochs ({} steps) in {:.2f} s ({:.0f} member-steps/s) on {} in {}.\n",
             o.members(), s.trainer.epoch(), s.trainer.steps_taken(), seconds, progress.member_steps_per_second(),
             o.device().str(), ensemble::to_string(o.precision()));
  if (saved && !driver.checkpoint().path.empty()) fmt::print("Checkpoint: {}\n", driver.checkpoint().path);
  if (exported) fmt::print("PyTorch export: {}\n", s.args.export_path);
  return 0;
}

int run_session(const Session& s, RunDriver& driver) {
  describe(s, driver);
  Progress progress(driver);
  DeferredWriteError writes;  // the metrics are printed before a failed final write ends the run
  if (!train_epochs(s, driver, progress, writes)) {
    save(s, driver);
    const std::string& path = driver.checkpoint().path;
    return driver.interrupted(s.trainer.epoch(), s.dist.member_parallel()
                                                     ? fmt::format("packtrain launch --nproc {} -- resume {}",
                                                                   s.dist.group->world_size(), path)
                                                     : "packtrain resume " + path);
  }
  // A sweep's configurations, scored before --select best deselects any of them.
  // Every data-parallel rank selects (the same configuration: the same weights and rows).
  const std::vector<runtime::ConfigurationReport> sweep =
      driver.primary() || s.args.select_best ? sweep_reports(s) : std::vector<runtime::ConfigurationReport>{};
  if (s.args.select_best) select_configuration(s, driver, sweep);
  if (s.dist.member_parallel()) {  // collective: a rank that fails to write its shard must stop the others
    save(s, driver);
    return writes.rethrow_or(report_member_parallel(s, driver, progress));
  }
  const bool saved = writes.attempt([&] { save(s, driver); });  // the last epoch, with each member's best weights
  return writes.rethrow_or(report(s, driver, progress, writes, saved, sweep));
}

// What to change when a run does not fit in memory (estimated, or an allocation failed).
constexpr const char* kLowerRunSize =
    "lower --members, --hidden, --depth or --batch (or run where more memory is free)";

// The same for the run's architecture: a cnn pack's size is its channels and feature maps.
std::string lower_run_size(const runtime::EnsembleTrainerOptions& o) {
  if (o.architecture() == "cnn") {
    return "lower --members, --channels, --hidden or --batch, or shrink the feature maps (a larger --stride, "
           "less --padding, a smaller --kernel) (or run where more memory is free)";
  }
  return kLowerRunSize;
}

// Loads the run's rows, refuses a run whose estimated memory is not available
// (memory_estimate.h), then fits the trainer's standardization and builds its
// steps on the training rows (with the validation rows when there are any).
SplitData prepare(runtime::EnsembleTrainer& trainer, const DataArgs& data_args, bool writes_checkpoints = true) {
  SplitData data = runtime::load_split_data(data_args);
  // Image and sequence rows: their sample shape, for the architectures that need it (cnn).
  if (data.all.sample_shape.size() > 1) trainer.set_input_shape(data.all.sample_shape);
  const runtime::EnsembleTrainerOptions& o = trainer.options();
  if (o.device().is_cpu()) runtime::retain_freed_cpu_memory();
  if (o.patience().value_or(0) > 0 && data.split.validation.empty()) {
    throw UsageError("--patience needs validation rows (--val-fraction > 0 or --val-index)");
  }
  runtime::check_memory(runtime::estimate_ensemble_run(o, runtime::ensemble_run_sizes(o, data, writes_checkpoints)),
                        lower_run_size(o));
  const runtime::Dataset train = data.train(), val = data.validation();
  const bool validated = val.features.size(0) > 0;
  trainer.prepare(train.features, train.targets, validated ? val.features : at::Tensor(),
                  validated ? val.targets : at::Tensor());
  return data;
}

// Recalibration's one scale fitted on a handful of validation rows is noise: said
// once, since variance is the default.
void note_few_recalibration_rows(const runtime::EnsembleTrainerOptions& o, int64_t rows, RunDriver& driver) {
  constexpr int64_t kFewRows = 10;
  if (o.recalibration() != runtime::Recalibration::kVariance || o.head() == runtime::Head::kClassification ||
      rows == 0 || rows >= kFewRows) {
    return;
  }
  driver.note(
      fmt::format("note: --recalibrate variance fits its scale on only {} validation row{}, too few for a "
                  "reliable one: hold out more rows (--val-fraction, --val-index) or use --recalibrate none",
                  rows, rows == 1 ? "" : "s"));
}

struct TrainCommand {
  DataArgs data;
  TrainerFlags trainer;
  SessionArgs session;
  bool member_parallel = false;
  bool early_stopping_given = false, recalibrate_given = false;
};

// train's defaults that depend on how it runs (those that depend on the data, as the
// patience, are the library's: resolved_patience): each member's own loss when the
// members are split over processes (an ensemble's loss needs all of its members in one).
runtime::EnsembleTrainerOptions train_options(const TrainCommand& c) {
  runtime::EnsembleTrainerOptions o = trainer_options(c.trainer);
  const bool validation = !c.data.val_index.empty() || c.data.val_fraction > 0;
  const bool stops_early = o.patience() ? *o.patience() > 0 : validation;
  if (c.member_parallel && o.early_stopping() == runtime::EarlyStopping::kEnsemble && stops_early) {
    if (c.early_stopping_given) {
      throw UsageError(
          "--early-stopping ensemble needs every member in one process: use --early-stopping member "
          "with --member-parallel");
    }
    o.early_stopping(runtime::EarlyStopping::kMember);
  }
  // --recalibrate variance fits a regression ensemble's scale on validation rows:
  // asked for explicitly where it cannot, it is an error, not silently nothing.
  if (c.recalibrate_given && o.recalibration() == runtime::Recalibration::kVariance) {
    if (o.head() == runtime::Head::kClassification) {
      throw UsageError(
          "--recalibrate variance stretches a regression ensemble's predictive variance: a classifier has "
          "none (drop --recalibrate)");
    }
    if (!validation) {
      throw UsageError(
          "--recalibrate variance fits its scale on validation rows, and this run has none: give "
          "--val-fraction > 0 or --val-index, or drop --recalibrate");
    }
  }
  if (c.member_parallel && o.recalibration() != runtime::Recalibration::kNone) {
    if (c.recalibrate_given) {
      throw UsageError(
          "--recalibrate variance fits one scale to the whole ensemble, which needs every member in one "
          "process: use --recalibrate none with --member-parallel");
    }
    o.recalibration(runtime::Recalibration::kNone);
  }
  return o;
}

// The rank's place in a member-parallel run; UsageError when not launched.
runtime::distributed::RankInfo member_parallel_rank(const std::string& what) {
  const runtime::distributed::RankInfo rank = runtime::distributed::rank_info_from_environment();
  if (!rank.launched()) {
    throw UsageError(
        fmt::format("{} splits the members across the ranks of a multi-process run: start it with "
                    "packtrain launch, torchrun or srun (`launch --nproc 1` for one process)",
                    what));
  }
  return rank;
}

// Member parallel: the ensemble's members split across the ranks (contiguous
// shards), each rank training its own with no gradient traffic (the group is for
// checkpoints and the prediction gather: Gloo, CPU tensors).
// The files a run reads (its data, index files, the shards it resumes) and writes
// (checkpoint, export, trace, log), checked before any work (output_paths.h).
// A member-parallel checkpoint is a manifest with shard files beside it.
void check_session_outputs(const SessionArgs& s, const DataArgs& data, bool member_parallel = false,
                           const runtime::ShardManifest* resumed = nullptr) {
  std::vector<NamedPath> inputs = data_inputs(data);
  if (resumed != nullptr) {
    for (const auto& shard : resumed->shards) {
      inputs.push_back({"shard of " + resumed->path.string(), shard.file.string()});
    }
  }
  check_outputs({{"--checkpoint", s.checkpoint.path, member_parallel},
                 {"--export", s.export_path},
                 {"--trace", s.trace},
                 {"--log", s.output.log}},
                inputs);
}

int run_member_parallel(const TrainCommand& c) {
  using namespace runtime::distributed;
  const RankInfo rank = member_parallel_rank("--member-parallel");
  if (!c.session.export_path.empty()) {
    throw UsageError("--export is not available with --member-parallel: evaluate or predict read the manifest");
  }
  if (c.trainer.sweep()) {
    throw UsageError(
        "a sweep (--hidden, --lr, --weight-decay, --dropout or --channels lists) is not available with "
        "--member-parallel");
  }
  runtime::EnsembleTrainerOptions options = train_options(c);
  const int64_t K = options.members(), W = rank.world_size;
  if (K < W) throw UsageError(fmt::format("--member-parallel: {} members cannot be split over {} ranks", K, W));
  const runtime::MemberShard shard = runtime::member_shard(K, W, rank.rank);
  options.members(shard.count).first_member(shard.first);
  auto group = ProcessGroup::join(rank, collective_timeout());
  RunDriver driver(c.session.output, c.session.checkpoint, group.get());  // outlives the trainer's log
  options.log(driver.graph_log());
  runtime::EnsembleTrainer trainer(options);
  const SplitData data = prepare(trainer, c.data, !c.session.checkpoint.path.empty());
  runtime::ShardedCheckpoint sharded(c.session.checkpoint.path, *group, K);
  return run_session({trainer, data, c.data, c.session, "train", Distribution::members_over(*group, sharded, shard, K)},
                     driver);
}

int run_train(const TrainCommand& c) {
  check_session_outputs(c.session, c.data, c.member_parallel);
  if (c.member_parallel) return run_member_parallel(c);
  runtime::EnsembleTrainerOptions options = train_options(c);
  // The group before the trainer: the trainer's captured steps (which hold NCCL
  // kernels on a GPU) must be destroyed before the communicator.
  const auto group = join_if_launched(options.device());
  RunDriver driver(c.session.output, c.session.checkpoint, group.get());
  options.log(driver.graph_log());
  runtime::EnsembleTrainer trainer(options);
  trainer.set_process_group(group.get(), c.session.rank_check_every);
  const SplitData data = prepare(trainer, c.data, !c.session.checkpoint.path.empty());
  if (c.session.select_best && data.split.validation.empty()) {
    throw UsageError("--select best chooses on validation rows: give --val-fraction > 0 or --val-index");
  }
  note_few_recalibration_rows(options, static_cast<int64_t>(data.split.validation.size()), driver);
  return run_session({trainer, data, c.data, c.session, "train", Distribution::over(group.get())}, driver);
}

struct ResumeCommand {
  std::string from;
  int64_t epochs = 0;
  std::string device = "auto";
  SessionArgs session;
};

// The options a resumed run continues with: --epochs and --device, its notes in the
// driver's log, the group of its ranks.
runtime::ResumeOptions resume_options(const ResumeCommand& c, c10::Device device, RunDriver& driver,
                                      runtime::distributed::ProcessGroup* group) {
  return {.epochs = c.epochs,
          .device = device,
          .log = driver.graph_log(),
          .group = group,
          .rank_check_every = c.session.rank_check_every};
}

// Resumes a member-parallel run from its manifest, on any number of ranks.
int run_resume_member_parallel(ResumeCommand c, const runtime::ShardManifest& manifest) {
  using namespace runtime::distributed;
  const RankInfo rank = member_parallel_rank("resuming the member-parallel run " + c.from);
  const runtime::ResumeSource source = runtime::open_resume(manifest, rank.rank, rank.world_size);
  const c10::Device device = pick_device(c.device);
  if (c.session.checkpoint.path.empty()) c.session.checkpoint.path = c.from;  // in place: the next commit replaces it
  check_session_outputs(c.session, source.run.data, /*member_parallel=*/true, &manifest);
  auto group = ProcessGroup::join(rank, collective_timeout());
  RunDriver driver(c.session.output, c.session.checkpoint, group.get());  // outlives the trainer's log
  if (device.is_cpu()) runtime::retain_freed_cpu_memory();
  runtime::ResumedRun run = runtime::resume(source, resume_options(c, device, driver, group.get()));
  runtime::ShardedCheckpoint sharded(c.session.checkpoint.path, *group, manifest.members);
  if (rank.world_size != manifest.ranks) {
    driver.note(fmt::format("resume: re-sharding {} members from {} ranks to {}", manifest.members, manifest.ranks,
                            rank.world_size));
  }
  return run_session({*run.trainer, run.data, source.run.data, c.session, "resume",
                      Distribution::members_over(*group, sharded, source.shard, manifest.members)},
                     driver);
}

int run_resume(ResumeCommand c) {
  if (const auto manifest = runtime::read_shard_manifest(c.from)) {
    return run_resume_member_parallel(std::move(c), *manifest);
  }
  const runtime::ResumeSource source = runtime::open_resume(c.from);
  const c10::Device device = pick_device(c.device);
  if (c.session.checkpoint.path.empty()) c.session.checkpoint.path = c.from;
  check_session_outputs(c.session, source.run.data);  // the checkpoint resumed may be replaced: it is not an input here
  const auto group = join_if_launched(device);        // before the trainer: destroyed after it
  RunDriver driver(c.session.output, c.session.checkpoint, group.get());
  if (device.is_cpu()) runtime::retain_freed_cpu_memory();
  // Every rank reads the same checkpoint: data parallel resumes as it trained.
  runtime::ResumedRun run = runtime::resume(source, resume_options(c, device, driver, group.get()));
  if (c.session.select_best && run.data.split.validation.empty()) {
    throw UsageError("--select best chooses on validation rows, and this run has none");
  }
  return run_session({*run.trainer, run.data, source.run.data, c.session, "resume", Distribution::over(group.get())},
                     driver);
}

}  // namespace

void add_train_commands(CLI::App& app, int& status) {
  auto train = std::make_shared<TrainCommand>();
  CLI::App* t = app.add_subcommand(
      "train",
      "Train a packed ensemble and print per-member and ensemble metrics on the test rows.\n"
      "With no arguments: a deep ensemble of 16 Gaussian regressors on the bundled UCI concrete data, standard split "
      "0\n"
      "(10% of the training rows held out for validation), up to 200 epochs, stopped early when the ensemble's\n"
      "validation NLL has not improved for 50 epochs (its best epoch's weights kept). Ctrl-C stops after the current\n"
      "epoch (and writes --checkpoint); a second Ctrl-C stops at once.");
  add_data_options(t, train->data);
  add_trainer_options(t, train->trainer);
  add_session_options(t, train->session);
  t->add_flag("--member-parallel", train->member_parallel,
              "Under packtrain launch / torchrun / srun: split the members across the ranks (no gradient traffic), "
              "gather the test predictions; --checkpoint writes one file per shard and then a manifest (the commit "
              "point); `resume MANIFEST` continues it on any number of ranks, evaluate/predict read it in one process")
      ->group("Multi-process");
  t->callback([train, t, &status] {
    train->early_stopping_given = t->count("--early-stopping") > 0;
    train->recalibrate_given = t->count("--recalibrate") > 0;
    status = within_memory("the run", kLowerRunSize, [&] { return run_train(*train); });
  });

  auto resume = std::make_shared<ResumeCommand>();
  CLI::App* r = app.add_subcommand(
      "resume",
      "Continue a run from its checkpoint exactly as if it had not stopped (same data, reloaded from the\n"
      "description in the checkpoint), then report test metrics. Writes the checkpoint back in place unless\n"
      "--checkpoint names another file.");
  r->add_option("checkpoint", resume->from,
                "Checkpoint written by `packtrain train --checkpoint`, or the manifest of a --member-parallel run "
                "(resume it under packtrain launch, on any number of ranks)")
      ->required();
  r->add_option("--epochs", resume->epochs, "Train until this many epochs in total (default: the run's own)")
      ->check(positive());
  r->add_option("--device", resume->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  add_session_options(r, resume->session);
  r->callback(
      [resume, &status] { status = within_memory("the run", kLowerRunSize, [&] { return run_resume(*resume); }); });
}

}  // namespace packtrain::cli
