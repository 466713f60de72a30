// `packtrain train` and `packtrain resume`: train (or continue) a packed ensemble
// with a progress line, periodic and on-interrupt checkpoints, then report test
// metrics per member and for the ensemble.
#include "profiling/trace.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/metrics_report.h"
#include "runtime/cli/progress.h"
#include "runtime/cli/trainer_args.h"
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

int run_session(runtime::EnsembleTrainer& trainer, const SplitData& data, const DataArgs& data_args,
                SessionArgs s, const std::vector<std::string>& log_lines, const char* command,
                const runtime::distributed::ProcessGroup* group = nullptr) {
  const runtime::EnsembleTrainerOptions& o = trainer.options();
  // In a data-parallel run every rank trains; rank 0 alone reports and writes files.
  const bool primary = group == nullptr || group->rank() == 0;
  if (!primary) {
    s = SessionArgs();
    s.quiet = true;
  }
  Progress progress(!s.quiet && !s.json, s.log);
  if (group != nullptr && group->world_size() > 1) {
    progress.note(fmt::format("data parallel: {} ranks ({}), global batch {} = {} per rank; gradients averaged "
                              "over Gloo every step",
                              group->world_size(), group->info().source, o.batch_size(), trainer.per_rank_batch()));
  }
  progress.note(fmt::format("packtrain {}: {} on {}; {} members, {} head, {}x{} {}, {} epochs, batch {}, {} order{}",
                            command, data.description, o.device().str(), o.members(), runtime::to_string(o.head()),
                            o.depth(), o.hidden(), ensemble::to_string(o.activation()), o.epochs(), o.batch_size(),
                            graphs::to_string(o.order()),
                            o.patience() > 0 ? fmt::format(", patience {}", o.patience()) : ""));
  const std::string extra = to_json(RunDescription{data_args, data.all.feature_names, data.all.target_name});
  const auto save = [&] {
    if (!s.checkpoint.empty()) trainer.save(s.checkpoint, extra);
  };
  g_interrupted = 0;
  const auto previous = std::signal(SIGINT, on_sigint);
  if (!s.trace.empty()) profiling::trace_start();
  const bool finished = trainer.train([&](const runtime::EpochReport& r) {
    progress.epoch(r, o.members());
    if (s.checkpoint_every > 0 && r.epoch % s.checkpoint_every == 0) save();
    return g_interrupted == 0;
  });
  progress.finish();
  std::signal(SIGINT, previous);
  if (!s.trace.empty()) {
    profiling::trace_stop();
    profiling::write_chrome_trace(s.trace);
    progress.note("Chrome trace written to " + s.trace);
  }
  if (!finished) {
    save();
    fmt::print(stderr, "packtrain: interrupted after epoch {}{}\n", trainer.epoch(),
               s.checkpoint.empty() ? " (no --checkpoint given: nothing saved)"
                                    : "; checkpoint saved: continue with `packtrain resume " + s.checkpoint + "`");
    return 130;
  }
  save();
  if (!primary) return 0;
  if (!s.export_path.empty()) export_members(s.export_path, trainer, data.all.feature_names, {});
  const double seconds = progress.seconds();
  const runtime::Dataset test = data.test();
  const bool has_test = test.features.size(0) > 0;
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

struct TrainCommand {
  DataArgs data;
  TrainerArgs trainer;
  SessionArgs session;
};

// Under torchrun, srun or packtrain launch: joins the run's process group and makes
// the trainer data-parallel over it; one process: no group.
std::unique_ptr<runtime::distributed::ProcessGroup> join_if_launched(runtime::EnsembleTrainer& trainer) {
  const runtime::distributed::RankInfo rank = runtime::distributed::rank_info_from_environment();
  if (!rank.distributed()) return nullptr;
  auto group = runtime::distributed::ProcessGroup::join(rank, runtime::distributed::collective_timeout());
  trainer.set_process_group(group.get());
  return group;
}

int run_train(const TrainCommand& c) {
  std::vector<std::string> log_lines;
  runtime::EnsembleTrainerOptions options = trainer_options(c.trainer);
  options.log(graph_log(c.session, log_lines));
  const SplitData data = load_split_data(c.data);
  if (options.device().is_cpu()) runtime::retain_freed_cpu_memory();
  if (options.patience() > 0 && data.split.validation.empty()) {
    throw UsageError("--patience needs validation rows (--val-fraction > 0 or --val-index)");
  }
  runtime::EnsembleTrainer trainer(options);
  const auto group = join_if_launched(trainer);
  const runtime::Dataset train = data.train(), val = data.validation();
  trainer.prepare(train.features, train.targets, val.features.size(0) > 0 ? val.features : at::Tensor(),
                  val.features.size(0) > 0 ? val.targets : at::Tensor());
  return run_session(trainer, data, c.data, c.session, log_lines, "train", group.get());
}

struct ResumeCommand {
  std::string from;
  int64_t epochs = 0;
  std::string device = "auto";
  SessionArgs session;
};

int run_resume(ResumeCommand c) {
  std::vector<std::string> log_lines;
  const auto checkpoint = runtime::EnsembleTrainer::read_checkpoint(c.from);
  runtime::EnsembleTrainerOptions options = runtime::EnsembleTrainer::checkpoint_options(*checkpoint);
  const DataArgs data_args = run_description_from_json(runtime::EnsembleTrainer::checkpoint_extra(*checkpoint)).data;
  options.device(pick_device(c.device)).log(graph_log(c.session, log_lines));
  if (c.epochs > 0) options.epochs(c.epochs);
  const SplitData data = load_split_data(data_args);
  if (options.device().is_cpu()) runtime::retain_freed_cpu_memory();
  runtime::EnsembleTrainer trainer(options);
  const auto group = join_if_launched(trainer);  // every rank reads the same checkpoint
  const runtime::Dataset train = data.train(), val = data.validation();
  trainer.prepare(train.features, train.targets, val.features.size(0) > 0 ? val.features : at::Tensor(),
                  val.features.size(0) > 0 ? val.targets : at::Tensor());
  trainer.restore(*checkpoint);
  if (c.session.checkpoint.empty()) c.session.checkpoint = c.from;
  return run_session(trainer, data, data_args, c.session, log_lines, "resume", group.get());
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
  t->callback([train, &status] { status = run_train(*train); });

  auto resume = std::make_shared<ResumeCommand>();
  CLI::App* r = app.add_subcommand(
      "resume", "Continue a run from its checkpoint exactly as if it had not stopped (same data, reloaded from the\n"
                "description in the checkpoint), then report test metrics. Writes the checkpoint back in place unless\n"
                "--checkpoint names another file.");
  r->add_option("checkpoint", resume->from, "Checkpoint written by `packtrain train --checkpoint`")->required();
  r->add_option("--epochs", resume->epochs, "Train until this many epochs in total (default: the run's own)")
      ->check(CLI::PositiveNumber);
  r->add_option("--device", resume->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  add_session_options(r, resume->session);
  r->callback([resume, &status] { status = run_resume(*resume); });
}

}  // namespace packtrain::cli
