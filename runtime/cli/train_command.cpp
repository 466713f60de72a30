// `packtrain train` and `packtrain resume`: train (or continue) a packed ensemble
// with a progress line, periodic and on-interrupt checkpoints, then report test
// metrics per member and for the ensemble.
#include "profiling/trace.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/member_parallel.h"
#include "runtime/cli/metrics_report.h"
#include "runtime/cli/progress.h"
#include "runtime/cli/trainer_args.h"
#include "runtime/checkpoint_file.h"
#include "runtime/cpu_memory.h"
#include "runtime/data_error.h"
#include "runtime/distributed/process_group.h"
#include "runtime/ensemble_trainer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <iostream>
#include <memory>

namespace packtrain::cli {

namespace {

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_sigint(int) { g_interrupted = 1; }

// What a training session writes and prints, common to train and resume.
struct SessionArgs {
  std::string checkpoint;
  int64_t checkpoint_every = 0;
  std::string export_path;
  std::string log;
  std::string trace;
  bool json = false;
  bool quiet = false;
  int64_t rank_check_every = 0;  // data parallel: steps between parameter-checksum comparisons (0: every epoch)
};

void add_session_options(CLI::App* app, SessionArgs& s) {
  app->add_option("--checkpoint", s.checkpoint,
                  "Write a checkpoint here at the end, every --checkpoint-every epochs, and on Ctrl-C (atomic: the last good "
                  "file survives a crash)")->group("Output");
  app->add_option("--checkpoint-every", s.checkpoint_every, "Epochs between checkpoints (0: only at the end)")
      ->capture_default_str()->check(CLI::NonNegativeNumber)->group("Output");
  app->add_option("--export", s.export_path, "Also write all members for Python: torch.load(path) (scripts/load_packtrain_export.py)")
      ->group("Output");
  app->add_option("--log", s.log, "Append plain progress lines (every epoch) to this file")->group("Output");
  app->add_option("--trace", s.trace, "Write the run's NVTX ranges as Chrome trace JSON (open in ui.perfetto.dev)")->group("Output");
  app->add_flag("--json", s.json, "Print the result as JSON on stdout (no progress)")->group("Output");
  app->add_flag("--quiet", s.quiet, "No progress on stderr")->group("Output");
  app->add_option("--rank-check-every", s.rank_check_every,
                  "Data parallel: also compare the ranks' parameter checksums every this many steps (each a host "
                  "synchronization; 0: after every epoch only)")
      ->capture_default_str()->check(CLI::NonNegativeNumber)->group("Multi-process");
}

// Graph-layer log lines: stderr, or collected into the JSON result.
graphs::GraphLog graph_log(const SessionArgs& s, std::vector<std::string>& lines) {
  return [&s, &lines](const std::string& line) {
    if (s.json) {
      lines.push_back(line);
    } else if (!s.quiet) {
      fmt::print(stderr, "[packtrain] {}\n", line);
    }
  };
}

// How a session is spread over processes: one process (no group), data parallel
// (every rank trains all members on its share of each batch), or member parallel
// (each rank trains its shard of the members; `sharded` writes the checkpoints).
struct Distribution {
  runtime::distributed::ProcessGroup* group = nullptr;
  ShardedCheckpoint* sharded = nullptr;  // member parallel
  MemberShard shard;
  int64_t members = 0;  // the whole ensemble's, member parallel
  bool member_parallel() const { return sharded != nullptr; }

  static Distribution over(runtime::distributed::ProcessGroup* group) {  // none: one process
    Distribution d;
    d.group = group;
    return d;
  }
  static Distribution members_over(runtime::distributed::ProcessGroup& group, ShardedCheckpoint& sharded,
                                   MemberShard shard, int64_t members) {
    Distribution d = over(&group);
    d.sharded = &sharded;
    d.shard = shard;
    d.members = members;
    return d;
  }
};

// The session arguments of a rank that neither prints nor writes files.
SessionArgs silent_session() {
  SessionArgs s;
  s.quiet = true;
  return s;
}

int run_session(runtime::EnsembleTrainer& trainer, const SplitData& data, const DataArgs& data_args,
                SessionArgs s, const std::vector<std::string>& log_lines, const char* command,
                const Distribution& dist = Distribution::over(nullptr)) {
  const runtime::EnsembleTrainerOptions& o = trainer.options();
  runtime::distributed::ProcessGroup* group = dist.group;
  // In a multi-process run every rank trains; rank 0 alone reports and writes files
  // (member parallel: every rank writes its shard).
  const bool primary = group == nullptr || group->rank() == 0;
  if (!primary) {
    const SessionArgs all = s;
    s = silent_session();
    if (dist.member_parallel()) {
      s.checkpoint = all.checkpoint;
      s.checkpoint_every = all.checkpoint_every;
    }
  }
  Progress progress(!s.quiet && !s.json, s.log);
  if (dist.member_parallel()) {
    progress.note(fmt::format("member parallel: {} members over {} ranks ({}); rank 0 trains members {}..{}, no "
                              "gradient traffic",
                              dist.members, group->world_size(), group->info().source, dist.shard.first,
                              dist.shard.first + dist.shard.count - 1));
  } else if (group != nullptr) {
    progress.note(fmt::format("data parallel: {} ranks ({}), global batch {} = {} per rank; gradients averaged "
                              "over {} every step",
                              group->world_size(), group->info().source, o.batch_size(), trainer.per_rank_batch(),
                              group->backends()));
  }
  progress.note(fmt::format("packtrain {}: {} on {}; {} members, {} head, {}x{} {}, {} epochs, batch {}, {} order{}",
                            command, data.description, o.device().str(), o.members(), runtime::to_string(o.head()),
                            o.depth(), o.hidden(), ensemble::to_string(o.activation()), o.epochs(), o.batch_size(),
                            graphs::to_string(o.order()),
                            o.patience() > 0 ? fmt::format(", patience {}", o.patience()) : ""));
  const std::string extra = to_json(RunDescription{data_args, data.all.feature_names, data.all.target_name});
  const auto save = [&] {
    if (s.checkpoint.empty()) return;
    if (dist.member_parallel()) {
      dist.sharded->save(trainer, extra);
    } else {
      trainer.save(s.checkpoint, extra);
    }
  };
  g_interrupted = 0;
  const auto previous = std::signal(SIGINT, on_sigint);
  if (!s.trace.empty()) profiling::trace_start();
  const bool finished = trainer.train(
      [&](const runtime::EpochReport& r) {
        progress.epoch(r, o.members());
        // The last epoch is saved after train() returns (with each member's best weights).
        if (s.checkpoint_every > 0 && r.epoch % s.checkpoint_every == 0 && r.epoch < r.epochs) save();
        // Ctrl-C reaches the ranks at different moments: all stop after the same epoch.
        const bool interrupted = g_interrupted != 0;
        return group == nullptr ? !interrupted
                                : !group->any(interrupted, "interrupt-agreement all-reduce", trainer.steps_taken());
      },
      /*stop_when_idle=*/!dist.member_parallel());
  progress.finish();
  std::signal(SIGINT, previous);
  if (!s.trace.empty()) {
    profiling::trace_stop();
    profiling::write_chrome_trace(s.trace);
    progress.note("Chrome trace written to " + s.trace);
  }
  const std::string resume_with =
      dist.member_parallel() ? fmt::format("packtrain launch --nproc {} -- resume {}", group->world_size(), s.checkpoint)
                             : "packtrain resume " + s.checkpoint;
  if (!finished) {
    save();
    if (primary) {
      fmt::print(stderr, "packtrain: interrupted after epoch {}{}\n", trainer.epoch(),
                 s.checkpoint.empty() ? " (no --checkpoint given: nothing saved)"
                                      : "; checkpoint saved: continue with `" + resume_with + "`");
    }
    return 130;
  }
  save();
  const runtime::Dataset test = data.test();
  const bool has_test = test.features.size(0) > 0;
  if (dist.member_parallel()) {
    // Every rank takes part in the gather; rank 0 reports the whole ensemble.
    const runtime::EnsemblePrediction all =
        has_test ? gather_predictions(trainer, test.features, dist.shard, dist.members, *group)
                 : runtime::EnsemblePrediction{};
    if (!primary) return 0;
    const runtime::EnsembleMetrics metrics =
        has_test ? runtime::ensemble_metrics(all, test.targets, o.head(), trainer.classes()) : runtime::EnsembleMetrics{};
    if (s.json) {
      nlohmann::json out = has_test ? gathered_metrics_json(metrics, o.head()) : nlohmann::json::object();
      out["command"] = command;
      out["member_parallel"] = {{"ranks", group->world_size()}, {"members", dist.members}};
      out["epochs_run"] = trainer.epoch();
      out["train_seconds"] = progress.seconds();
      out["checkpoint"] = s.checkpoint;
      out["test_rows"] = test.features.size(0);
      std::cout << out.dump(2) << "\n";
      return 0;
    }
    if (has_test) {
      print_gathered_metrics(metrics, o.head(),
                             fmt::format("Test metrics ({} rows, original units), {} members gathered from {} ranks",
                                         test.features.size(0), dist.members, group->world_size()));
    }
    fmt::print("\nTrained {} members on {} ranks for {} epochs in {:.2f} s.\n", dist.members, group->world_size(),
               trainer.epoch(), progress.seconds());
    if (!s.checkpoint.empty()) fmt::print("Checkpoint manifest: {} ({} shards)\n", s.checkpoint, group->world_size());
    return 0;
  }
  if (!primary) return 0;
  if (!s.export_path.empty()) export_members(s.export_path, trainer, data.all.feature_names, {});
  const double seconds = progress.seconds();
  const runtime::EnsembleMetrics metrics =
      has_test ? trainer.evaluate(test.features, test.targets) : runtime::EnsembleMetrics{};
  if (s.json) {
    nlohmann::json out = has_test ? metrics_json(trainer, metrics) : nlohmann::json::object();
    out["command"] = command;
    out["data"] = data.description;
    out["device"] = o.device().str();
    out["options"] = nlohmann::json::parse(runtime::to_json(o));
    out["epochs_run"] = trainer.epoch();
    out["train_seconds"] = seconds;
    out["member_steps_per_second"] = progress.member_steps_per_second();
    out["test_rows"] = test.features.size(0);
    out["checkpoint"] = s.checkpoint;
    if (group != nullptr) {
      out["data_parallel"] = {{"ranks", group->world_size()}, {"global_batch", o.batch_size()},
                              {"per_rank_batch", trainer.per_rank_batch()}, {"backends", group->backends()}};
    }
    out["log"] = log_lines;
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (has_test) {
    print_metrics(trainer, metrics, fmt::format("Test metrics ({} rows, original units)", test.features.size(0)));
  } else {
    fmt::print("\nNo test rows (test fraction 0): no test metrics.\n");
  }
  fmt::print("\nTrained {} members for {} epochs ({} steps) in {:.2f} s ({:.0f} member-steps/s) on {}.\n", o.members(),
             trainer.epoch(), trainer.steps_taken(), seconds, progress.member_steps_per_second(), o.device().str());
  if (!s.checkpoint.empty()) fmt::print("Checkpoint: {}\n", s.checkpoint);
  if (!s.export_path.empty()) fmt::print("PyTorch export: {}\n", s.export_path);
  return 0;
}

// Fits the trainer's standardization and builds its steps on the split's training
// rows, with its validation rows when there are any.
void prepare_on(runtime::EnsembleTrainer& trainer, const SplitData& data) {
  const runtime::Dataset train = data.train(), val = data.validation();
  const bool validated = val.features.size(0) > 0;
  trainer.prepare(train.features, train.targets, validated ? val.features : at::Tensor(),
                  validated ? val.targets : at::Tensor());
}

struct TrainCommand {
  DataArgs data;
  TrainerArgs trainer;
  SessionArgs session;
  bool member_parallel = false;
};

// The rank's place in a member-parallel run; UsageError when not launched.
runtime::distributed::RankInfo member_parallel_rank(const char* what) {
  const runtime::distributed::RankInfo rank = runtime::distributed::rank_info_from_environment();
  if (!rank.launched()) {
    throw UsageError(fmt::format("{} splits the members across the ranks of a multi-process run: start it with "
                                 "packtrain launch, torchrun or srun (`launch --nproc 1` for one process)",
                                 what));
  }
  return rank;
}

// Member parallel: the ensemble's members split across the ranks (contiguous
// shards), each rank training its own with no gradient traffic (the group is for
// checkpoints and the prediction gather: Gloo, CPU tensors).
int run_member_parallel(const TrainCommand& c) {
  using namespace runtime::distributed;
  const RankInfo rank = member_parallel_rank("--member-parallel");
  if (!c.session.export_path.empty()) {
    throw UsageError("--export is not available with --member-parallel: evaluate or predict read the manifest");
  }
  runtime::EnsembleTrainerOptions options = trainer_options(c.trainer);
  const int64_t K = options.members(), W = rank.world_size;
  if (K < W) throw UsageError(fmt::format("--member-parallel: {} members cannot be split over {} ranks", K, W));
  const MemberShard shard = member_shard(K, W, rank.rank);
  options.members(shard.count).first_member(shard.first);
  std::vector<std::string> log_lines;
  const SessionArgs log_args = rank.rank == 0 ? c.session : silent_session();  // outlives the trainer's log
  options.log(graph_log(log_args, log_lines));
  auto group = ProcessGroup::join(rank, collective_timeout());
  const SplitData data = load_split_data(c.data);
  if (options.device().is_cpu()) runtime::retain_freed_cpu_memory();
  if (options.patience() > 0 && data.split.validation.empty()) {
    throw UsageError("--patience needs validation rows (--val-fraction > 0 or --val-index)");
  }
  runtime::EnsembleTrainer trainer(options);
  prepare_on(trainer, data);
  ShardedCheckpoint sharded(c.session.checkpoint, *group, K);
  return run_session(trainer, data, c.data, c.session, log_lines, "train", Distribution::members_over(*group, sharded, shard, K));
}

int run_train(const TrainCommand& c) {
  if (c.member_parallel) return run_member_parallel(c);
  std::vector<std::string> log_lines;
  runtime::EnsembleTrainerOptions options = trainer_options(c.trainer);
  options.log(graph_log(c.session, log_lines));
  const SplitData data = load_split_data(c.data);
  if (options.device().is_cpu()) runtime::retain_freed_cpu_memory();
  if (options.patience() > 0 && data.split.validation.empty()) {
    throw UsageError("--patience needs validation rows (--val-fraction > 0 or --val-index)");
  }
  // The group before the trainer: the trainer's captured steps (which hold NCCL
  // kernels on a GPU) must be destroyed before the communicator.
  const auto group = join_if_launched(options.device());
  runtime::EnsembleTrainer trainer(options);
  trainer.set_process_group(group.get(), c.session.rank_check_every);
  prepare_on(trainer, data);
  return run_session(trainer, data, c.data, c.session, log_lines, "train", Distribution::over(group.get()));
}

struct ResumeCommand {
  std::string from;
  int64_t epochs = 0;
  std::string device = "auto";
  SessionArgs session;
};

// Resumes a member-parallel run from its manifest: on the same number of ranks each
// rank continues its own shard; on another number the members are re-sharded, each
// rank gathering its new share from the shards that hold it.
int run_resume_member_parallel(ResumeCommand c, const ShardManifest& manifest) {
  using namespace runtime::distributed;
  const RankInfo rank = member_parallel_rank(("resuming the member-parallel run " + c.from).c_str());
  const int64_t K = manifest.members, W = rank.world_size;
  if (K < W) throw UsageError(fmt::format("{}: {} members cannot be split over {} ranks", c.from, K, W));
  // This rank's members: its own shard on the same number of ranks; on another
  // number, gathered from the shards that hold them (re-sharded).
  const MemberShard mine = member_shard(K, W, rank.rank);
  std::vector<runtime::EnsembleTrainer::MemberSource> sources;
  for (const ShardManifest::Shard& shard : manifest.shards) {
    if (shard.first_member >= mine.first + mine.count || shard.first_member + shard.members <= mine.first) continue;
    auto checkpoint = runtime::EnsembleTrainer::read_checkpoint(shard.file);
    const runtime::EnsembleTrainerOptions held = runtime::EnsembleTrainer::checkpoint_options(*checkpoint);
    if (held.members() != shard.members || held.first_member() != shard.first_member) {
      throw runtime::DataError(fmt::format("{}: holds members {}..{}, but the manifest names {}..{} for it",
                                           shard.file.string(), held.first_member(),
                                           held.first_member() + held.members() - 1, shard.first_member,
                                           shard.first_member + shard.members - 1));
    }
    sources.emplace_back(std::move(checkpoint), shard.first_member);
  }
  const bool same_shards = sources.size() == 1 && sources.front().second == mine.first &&
                           runtime::EnsembleTrainer::checkpoint_options(*sources.front().first).members() == mine.count;
  const auto checkpoint = same_shards ? sources.front().first
                                      : runtime::EnsembleTrainer::select_members(sources, mine.first, mine.count);
  runtime::EnsembleTrainerOptions options = runtime::EnsembleTrainer::checkpoint_options(*checkpoint);
  const DataArgs data_args = run_description_from_json(runtime::EnsembleTrainer::checkpoint_extra(*checkpoint)).data;
  std::vector<std::string> log_lines;
  const SessionArgs log_args = rank.rank == 0 ? c.session : silent_session();  // outlives the trainer's log
  options.device(pick_device(c.device)).log(graph_log(log_args, log_lines));
  if (c.epochs > 0) options.epochs(c.epochs);
  auto group = ProcessGroup::join(rank, collective_timeout());
  const SplitData data = load_split_data(data_args);
  if (options.device().is_cpu()) runtime::retain_freed_cpu_memory();
  runtime::EnsembleTrainer trainer(options);
  prepare_on(trainer, data);
  trainer.restore(*checkpoint);
  if (c.session.checkpoint.empty()) c.session.checkpoint = c.from;  // in place: the next commit replaces it
  ShardedCheckpoint sharded(c.session.checkpoint, *group, manifest.members);
  if (W != manifest.ranks && rank.rank == 0 && !c.session.quiet && !c.session.json) {
    fmt::print(stderr, "resume: re-sharding {} members from {} ranks to {}\n", K, manifest.ranks, W);
  }
  return run_session(trainer, data, data_args, c.session, log_lines, "resume", Distribution::members_over(*group, sharded, mine, K));
}

int run_resume(ResumeCommand c) {
  if (const auto manifest = read_shard_manifest(c.from)) return run_resume_member_parallel(std::move(c), *manifest);
  std::vector<std::string> log_lines;
  const auto checkpoint = runtime::EnsembleTrainer::read_checkpoint(c.from);
  runtime::EnsembleTrainerOptions options = runtime::EnsembleTrainer::checkpoint_options(*checkpoint);
  const DataArgs data_args = run_description_from_json(runtime::EnsembleTrainer::checkpoint_extra(*checkpoint)).data;
  options.device(pick_device(c.device)).log(graph_log(c.session, log_lines));
  if (c.epochs > 0) options.epochs(c.epochs);
  const SplitData data = load_split_data(data_args);
  if (options.device().is_cpu()) runtime::retain_freed_cpu_memory();
  const auto group = join_if_launched(options.device());  // before the trainer: destroyed after it
  runtime::EnsembleTrainer trainer(options);
  trainer.set_process_group(group.get(), c.session.rank_check_every);  // every rank read the same checkpoint
  prepare_on(trainer, data);
  trainer.restore(*checkpoint);
  if (c.session.checkpoint.empty()) c.session.checkpoint = c.from;
  return run_session(trainer, data, data_args, c.session, log_lines, "resume", Distribution::over(group.get()));
}

}  // namespace

void add_train_commands(CLI::App& app, int& status) {
  auto train = std::make_shared<TrainCommand>();
  CLI::App* t = app.add_subcommand(
      "train",
      "Train a packed ensemble and print per-member and ensemble metrics on the test rows.\n"
      "With no arguments: a deep ensemble of 16 Gaussian regressors on the bundled UCI concrete data, standard split 0\n"
      "(10% of the training rows held out for validation), 200 epochs.");
  add_data_options(t, train->data);
  add_trainer_options(t, train->trainer);
  add_session_options(t, train->session);
  t->add_flag("--member-parallel", train->member_parallel,
              "Under packtrain launch / torchrun / srun: split the members across the ranks (no gradient traffic), "
              "gather the test predictions; --checkpoint writes one file per shard and then a manifest (the commit "
              "point); `resume MANIFEST` continues it on any number of ranks, evaluate/predict read it in one process")
      ->group("Multi-process");
  t->callback([train, &status] { status = run_train(*train); });

  auto resume = std::make_shared<ResumeCommand>();
  CLI::App* r = app.add_subcommand(
      "resume", "Continue a run from its checkpoint exactly as if it had not stopped (same data, reloaded from the\n"
                "description in the checkpoint), then report test metrics. Writes the checkpoint back in place unless\n"
                "--checkpoint names another file.");
  r->add_option("checkpoint", resume->from,
                "Checkpoint written by `packtrain train --checkpoint`, or the manifest of a --member-parallel run "
                "(resume it under packtrain launch, on any number of ranks)")
      ->required();
  r->add_option("--epochs", resume->epochs, "Train until this many epochs in total (default: the run's own)")
      ->check(CLI::PositiveNumber);
  r->add_option("--device", resume->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  add_session_options(r, resume->session);
  r->callback([resume, &status] { status = run_resume(*resume); });
}

}  // namespace packtrain::cli
