// `packtrain train` and `packtrain resume`: train (or continue) a packed ensemble
// with a progress line, periodic and on-interrupt checkpoints, then report test
// metrics per member and for the ensemble.
#include "profiling/trace.h"
#include "runtime/cli/commands.h"
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
  bool member_parallel = false;
};

// Member parallel: the ensemble's members split across the ranks (contiguous
// shards, sizes differing by at most one), each rank training its own with no
// gradient traffic; test predictions gathered for the ensemble statistics; a
// checkpoint per shard, then a manifest naming them, written last by rank 0.
int run_member_parallel(const TrainCommand& c) {
  using namespace runtime::distributed;
  const RankInfo rank = rank_info_from_environment();
  if (!rank.distributed()) {
    throw UsageError("--member-parallel splits the members across the ranks of a multi-process run: start it with "
                     "packtrain launch, torchrun or srun");
  }
  runtime::EnsembleTrainerOptions options = trainer_options(c.trainer);
  if (options.head() == runtime::Head::kClassification) {
    throw UsageError("--member-parallel supports the regression heads (mean, gaussian) for now");
  }
  const int64_t K = options.members(), W = rank.world_size, r = rank.rank;
  if (K < W) throw UsageError(fmt::format("--member-parallel: {} members cannot be split over {} ranks", K, W));
  const int64_t count = K / W + (r < K % W ? 1 : 0), first = r * (K / W) + std::min(r, K % W);
  options.members(count).first_member(first);
  std::vector<std::string> log_lines;
  SessionArgs s = c.session;
  const bool primary = r == 0;
  if (!primary) {
    s = SessionArgs();
    s.quiet = true;
  }
  options.log(graph_log(s, log_lines));
  auto group = ProcessGroup::join(rank, collective_timeout());  // no gradients: Gloo for the gathers
  const SplitData data = load_split_data(c.data);
  if (options.device().is_cpu()) runtime::retain_freed_cpu_memory();
  runtime::EnsembleTrainer trainer(options);
  const runtime::Dataset train = data.train(), val = data.validation();
  trainer.prepare(train.features, train.targets, val.features.size(0) > 0 ? val.features : at::Tensor(),
                  val.features.size(0) > 0 ? val.targets : at::Tensor());
  Progress progress(!s.quiet && !s.json, s.log);
  progress.note(fmt::format("member parallel: {} members over {} ranks ({}); rank 0 trains members {}..{}, no "
                            "gradient traffic",
                            K, W, rank.source, first, first + count - 1));
  trainer.train([&](const runtime::EpochReport& report) {
    progress.epoch(report, count);
    return true;
  });
  progress.finish();
  const std::string checkpoint = c.session.checkpoint;
  if (!checkpoint.empty()) {
    const std::string shard = fmt::format("{}.shard-{}-of-{}", checkpoint, r, W);
    trainer.save(shard, to_json(RunDescription{c.data, data.all.feature_names, data.all.target_name}));
    group->barrier();  // every shard is on disk before the manifest that commits them
    if (primary) {
      nlohmann::json shards = nlohmann::json::array();
      for (int64_t i = 0; i < W; ++i) {
        const int64_t n = K / W + (i < K % W ? 1 : 0);
        shards.push_back({{"file", fmt::format("{}.shard-{}-of-{}", std::filesystem::path(checkpoint).filename().string(),
                                               i, W)},
                          {"first_member", i * (K / W) + std::min(i, K % W)},
                          {"members", n}});
      }
      runtime::write_file_atomically(
          checkpoint, nlohmann::json{{"format", "packtrain-member-parallel-1"}, {"members", K}, {"shards", shards}}.dump(1));
    }
  }
  // Gather every member's test predictions: each rank fills its rows, a sum does the rest.
  const runtime::Dataset test = data.test();
  if (test.features.size(0) == 0) return 0;
  const runtime::EnsemblePrediction mine = trainer.predict(test.features);
  const int64_t N = test.features.size(0);
  at::Tensor means = at::zeros({K, N}, at::kDouble), variances = at::zeros({K, N}, at::kDouble);
  at::Tensor usable = at::zeros({K}, at::kDouble);
  means.narrow(0, first, count).copy_(mine.member_mean);
  if (mine.member_variance.defined()) variances.narrow(0, first, count).copy_(mine.member_variance);
  for (int64_t k : mine.included) usable[first + k] = 1.0;
  group->all_reduce_sum_(means, "prediction gather");
  group->all_reduce_sum_(variances, "prediction gather");
  group->all_reduce_sum_(usable, "prediction gather");
  if (!primary) return 0;
  runtime::EnsemblePrediction all;
  all.member_mean = means;
  if (mine.member_variance.defined()) all.member_variance = variances;
  for (int64_t k = 0; k < K; ++k) {
    if (usable[k].item<double>() > 0) all.included.push_back(k);
  }
  const runtime::EnsembleMetrics metrics =
      runtime::regression_metrics(runtime::combine_regression_members(std::move(all)), test.targets);
  if (s.json) {
    nlohmann::json out = gathered_metrics_json(metrics);
    out["command"] = "train";
    out["member_parallel"] = {{"ranks", W}, {"members", K}};
    out["checkpoint"] = checkpoint;
    out["test_rows"] = N;
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  print_gathered_metrics(metrics, fmt::format("Test metrics ({} rows, original units), {} members gathered from {} ranks",
                                              N, K, W));
  if (!checkpoint.empty()) fmt::print("Checkpoint manifest: {} ({} shards)\n", checkpoint, W);
  return 0;
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
  runtime::EnsembleTrainer trainer(options);
  const auto group = join_if_launched(options.device());
  trainer.set_process_group(group.get());
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
  const auto group = join_if_launched(options.device());  // every rank reads the same checkpoint
  trainer.set_process_group(group.get());
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
  t->add_flag("--member-parallel", train->member_parallel,
              "Under packtrain launch / torchrun / srun: split the members across the ranks (no gradient traffic), "
              "gather the test predictions; --checkpoint writes one file per shard and then a manifest")
      ->group("Multi-process");
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
