// `packtrain active-learn`: the pool-based active-learning loop (runtime/trainers/uncertainty/active_learning.h)
// with acquisition by a strategy (runtime/trainers/uncertainty/acquisition.h) against random
// acquisition, on one pack, for regression and classification; writes the
// learning curve as CSV and SVG.
#include "packtrain/runtime/cli/cli_common.h"
#include "packtrain/runtime/cli/commands.h"
#include "packtrain/runtime/cli/output_paths.h"
#include "packtrain/runtime/cli/schema_flags.h"
#include "packtrain/runtime/cli/trainer_flags.h"
#include "packtrain/runtime/measure/cpu_memory.h"
#include "packtrain/runtime/trainers/memory_estimate.h"
#include "packtrain/runtime/trainers/uncertainty/active_learning.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace packtrain::cli {

namespace {

struct ActiveLearnCommand {
  runtime::DataArgs data;
  TrainerFlags trainer;
  runtime::ActiveLearningOptions loop;
  bool strategy_given = false;
  std::string csv = "learning_curve.csv";
  std::string plot = "learning_curve.svg";
  bool json = false;
  bool quiet = false;
};

// The acquisition strategy's name: the given one, else bald (classification) or
// epistemic (regression), its options checked.
std::string checked_strategy(ActiveLearnCommand& c, bool cls) {
  if (!c.strategy_given) c.loop.acquisition().strategy = runtime::default_strategy(cls);
  const std::string strategy(runtime::kAcquisitionStrategyNames.name(c.loop.acquisition().strategy));
  try {  // before any round is trained
    runtime::check_acquisition_options(c.loop.acquisition(), cls);
  } catch (const UserError& e) {
    throw UsageError(fmt::format("--strategy {}: {}", strategy, e.what()));
  }
  return strategy;
}

// --json: the run and its learning curve as one JSON object on stdout.
void print_curve_json(const ActiveLearnCommand& c, const runtime::SplitData& data,
                      const runtime::EnsembleTrainerOptions& options, const runtime::ActiveLearningResult& result,
                      const std::vector<std::string>& log_lines) {
  nlohmann::json out;
  out["data"] = data.description;
  out["device"] = options.device().str();
  out["pack_members"] = result.pack_members;
  out["train_seconds"] = result.train_seconds;
  out["strategy"] = result.strategy;
  out["metric"] = result.metric;
  for (const runtime::LearningCurvePoint& p : result.curve) {
    out["curve"].push_back(
        {{"round", p.round},
         {"labelled", p.labelled},
         {result.strategy + "_" + result.metric, p.acquired},
         {"random_" + result.metric, std::isnan(p.random) ? nlohmann::json(nullptr) : nlohmann::json(p.random)}});
  }
  out["csv"] = c.csv;
  out["plot"] = c.plot;
  out["log"] = log_lines;
  std::cout << out.dump(2) << "\n";
}

// The learning curve as a table, then the run's time and its files.
void print_curve_table(const ActiveLearnCommand& c, const runtime::ActiveLearningResult& result, const char* metric,
                       bool cls, const std::string& strategy, bool written) {
  fmt::print("\nLearning curve (test {}{}, mean over {} run(s)):\n  {:>8}  {:>15}  {:>10}\n", metric,
             cls ? "" : ", original units", c.loop.ensembles(), "labelled", strategy, "random");
  for (const runtime::LearningCurvePoint& p : result.curve) {
    fmt::print("  {:>8}  {:>15.4f}  {:>10}\n", p.labelled, p.acquired,
               std::isnan(p.random) ? "-" : fmt::format("{:.4f}", p.random));
  }
  fmt::print("\nTrained {} rounds of a {}-member pack in {:.1f} s.{}\n", result.curve.size(), result.pack_members,
             result.train_seconds, written ? fmt::format(" Curve: {} and {}", c.csv, c.plot) : "");
}

int run_active_learn(ActiveLearnCommand c) {
  check_outputs({{"--csv", c.csv}, {"--plot", c.plot}}, data_inputs(c.data));
  std::vector<std::string> log_lines;
  if (c.trainer.sweep()) {
    throw UsageError(
        "a sweep (--hidden, --lr, --weight-decay, --dropout or --channels with several values) is for `train`");
  }
  runtime::EnsembleTrainerOptions options = trainer_options(c.trainer);
  const bool cls = options.head() == runtime::Head::kClassification;
  const std::string strategy = checked_strategy(c, cls);
  const char* metric = cls ? "accuracy" : "RMSE";
  options.log([&](const std::string& line) {
    if (c.json) {
      log_lines.push_back(line);
    } else if (!c.quiet) {
      fmt::print(stderr, "[packtrain] {}\n", line);
    }
  });
  runtime::DataArgs data_args = c.data;
  data_args.val_fraction = 0;  // the loop trains for fixed epochs: the pool is the training split
  const runtime::SplitData data = runtime::load_split_data(data_args);
  if (data.all.sample_shape.size() > 1) options.input_shape(data.all.sample_shape);  // images, sequences: a cnn's
  if (options.device().is_cpu()) runtime::retain_freed_cpu_memory();
  const runtime::Dataset pool = data.train(), test = data.test();
  if (test.features.size(0) == 0) throw UsageError("active learning needs test rows to draw the learning curve");
  const runtime::EnsembleRunSizes sizes = runtime::ensemble_run_sizes(options, data, /*checkpoints=*/false);
  runtime::check_memory(runtime::estimate_active_learning(options, c.loop, sizes),
                        "lower --runs, --members, --hidden, --depth or --batch (or run where more memory is free)");
  const bool progress = !c.quiet && !c.json;
  const int64_t strategies = c.loop.random_baseline() ? 2 : 1;
  if (progress) {
    fmt::print(stderr,
               "packtrain active-learn: {} on {}; {} run(s) x {} members per strategy ({} in one pack), {} rounds "
               "from {} labelled rows, +{} per round, {} epochs each\n",
               data.description, options.device().str(), c.loop.ensembles(), options.members(),
               strategies * c.loop.ensembles() * options.members(), c.loop.rounds(), c.loop.initial(), c.loop.acquire(),
               options.epochs());
  }
  const runtime::ActiveLearningResult result =
      runtime::run_active_learning(options, pool.features, pool.targets, test.features, test.targets, c.loop,
                                   [&](const runtime::LearningCurvePoint& p) {
                                     if (!progress) return;
                                     fmt::print(stderr, "round {:>3}/{}  labelled {:>5}  test {}: {} {:.4f}{}\n",
                                                p.round + 1, c.loop.rounds(), p.labelled, metric, strategy, p.acquired,
                                                std::isnan(p.random) ? "" : fmt::format("  random {:.4f}", p.random));
                                   });
  DeferredWriteError writes;  // the curve is printed before a failed write ends the run
  const bool written = writes.attempt([&] { runtime::write_learning_curve_csv(c.csv, result); }) && writes.attempt([&] {
    runtime::write_learning_curve_svg(c.plot, result, fmt::format("Active learning on {}", data.all.name));
  });
  if (c.json) {
    print_curve_json(c, data, options, result, log_lines);
    return writes.rethrow_or(0);
  }
  print_curve_table(c, result, metric, cls, strategy, written);
  return writes.rethrow_or(0);
}

}  // namespace

void add_active_learn_command(CLI::App& app, int& status) {
  auto c = std::make_shared<ActiveLearnCommand>();
  // Active learning's own defaults: small packs retrained often, each member its own order.
  c->trainer.options.members(5).epochs(100).batch_size(16).order(graphs::BatchOrder::kPerMember);
  c->data.data = "yacht";
  CLI::App* a = app.add_subcommand(
      "active-learn",
      "Pool-based active learning: start from --initial labelled rows of the training split; each round re-initialize\n"
      "the pack in place (no re-capture), retrain, score the unlabelled pool by --strategy and label --acquire rows\n"
      "(the top ones, or drawn by --selection). A random-acquisition baseline runs in the same pack on the same\n"
      "seeds. Regression or classification (--head classification). Writes the learning curve (labelled rows vs\n"
      "test RMSE or accuracy, both strategies) as CSV and SVG.");
  add_data_options(a, c->data);
  add_trainer_options(a, c->trainer);
  // The loop's and its acquisition's flags, --help and checks: their schema (active_learning.cpp).
  add_schema_flags(a, runtime::active_learning_option_schema(), c->loop);
  a->get_option("--strategy")->default_str("epistemic|bald")->each([c](const std::string&) {
    c->strategy_given = true;
  });
  a->add_option("--csv", c->csv, "Learning curve CSV")->capture_default_str()->group("Output");
  a->add_option("--plot", c->plot, "Learning curve plot (SVG)")->capture_default_str()->group("Output");
  a->add_flag("--json", c->json, "Print the result as JSON on stdout")->group("Output");
  a->add_flag("--quiet", c->quiet, "No progress on stderr")->group("Output");
  a->callback([c, &status] {
    status = within_memory("the active-learning pack", "lower --runs, --members, --hidden, --depth or --batch",
                           [&] { return run_active_learn(*c); });
  });
}

}  // namespace packtrain::cli
