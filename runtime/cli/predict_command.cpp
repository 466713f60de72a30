// `packtrain predict`, `evaluate`, `acquire` and `export`: use a checkpoint without training.
#include "packtrain/runtime/cli/cli_common.h"
#include "packtrain/runtime/cli/commands.h"
#include "packtrain/runtime/cli/metrics_report.h"
#include "packtrain/runtime/cli/output_paths.h"
#include "packtrain/runtime/cli/range_checks.h"
#include "packtrain/runtime/cli/schema_flags.h"
#include "packtrain/runtime/cli/trainer_flags.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/run_data.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_export.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "packtrain/runtime/trainers/ensemble/loaded_ensemble.h"
#include "packtrain/runtime/trainers/ensemble/member_parallel.h"
#include "packtrain/runtime/trainers/uncertainty/acquisition.h"
#include "packtrain/runtime/trainers/uncertainty/predictive_distribution.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>

namespace packtrain::cli {

namespace {

// The model's feature columns of `table`: by name when the table has a header and
// the model was trained on named columns (every name must be there: a header with
// other names is refused, never read by position), else by position (the first I
// columns). With `target`, also the target column (by name, or the column after
// the features).
std::vector<int64_t> model_columns(const runtime::Table& table, const runtime::LoadedEnsemble& m, bool with_target) {
  const int64_t I = m.first().in_features();
  const std::vector<std::string>& names = m.run().feature_names;
  std::vector<int64_t> cols;
  const auto has = [&](const std::string& name) {
    return std::find(table.columns.begin(), table.columns.end(), name) != table.columns.end();
  };
  // A headerless training table names its columns by number: nothing to match.
  const bool named =
      static_cast<int64_t>(names.size()) == I && std::any_of(names.begin(), names.end(), [](const std::string& n) {
        return n.empty() || n.find_first_not_of("0123456789") != std::string::npos;
      });
  if (table.has_header && named && !std::all_of(names.begin(), names.end(), has)) {
    std::vector<std::string> missing;
    std::copy_if(names.begin(), names.end(), std::back_inserter(missing),
                 [&](const std::string& n) { return !has(n); });
    throw runtime::DataError(fmt::format(
        "{}: its header lacks the model's feature column(s) {} (it has {}); the model reads its columns by the "
        "names it was trained with ({}), or by position from a table with no header",
        table.file.string(), fmt::join(missing, ", "), fmt::join(table.columns, ", "), fmt::join(names, ", ")));
  }
  if (table.has_header && named) {
    for (const std::string& name : names) cols.push_back(table.column_index(name));
    if (with_target) cols.push_back(table.column_index(m.run().target_name.empty() ? "-1" : m.run().target_name));
    return cols;
  }
  const int64_t needed = I + (with_target ? 1 : 0);
  if (table.cols() != needed) {
    throw runtime::DataError(fmt::format(
        "{}: the model takes {} feature columns{}{}; the file has {} columns{}", table.file.string(), I,
        with_target ? " and a target column" : "", names.empty() ? "" : fmt::format(" ({})", fmt::join(names, ", ")),
        table.cols(), table.has_header ? fmt::format(" ({})", fmt::join(table.columns, ", ")) : ""));
  }
  for (int64_t c = 0; c < needed; ++c) cols.push_back(c);
  return cols;
}

// The rows predict, evaluate and acquire read: a table. An array file would be read
// as text ("ragged row" of its binary header): named instead.
runtime::Table read_rows(const std::string& file, const runtime::DataArgs& format) {
  const std::string extension = std::filesystem::path(file).extension().string();
  if (extension == ".npy" || extension == ".npz") {
    throw UsageError(fmt::format(
        "{}: rows to predict are read from a table (CSV or TSV, a column per feature, as the model was trained "
        "with); an {} array is not read here: write it as one, e.g. np.savetxt(path, x.reshape(len(x), -1), "
        "delimiter=',')",
        file, extension));
  }
  return runtime::read_table(file, runtime::table_format(format));
}

// The model's columns of `table` as numbers (model_columns' order), every feature
// representable once the model standardizes it (finite in float32, standardizer.h):
// DataError "FILE:LINE:COL: column 'name': value ..." for the first that is not.
at::Tensor model_inputs(const runtime::Table& table, const runtime::LoadedEnsemble& m, bool with_target) {
  const std::vector<int64_t> cols = model_columns(table, m, with_target);
  const at::Tensor x = table.numeric(cols);
  if (const auto u = m.first().x_scale().first_unrepresentable(x.narrow(1, 0, m.first().in_features()))) {
    const int64_t col = cols[static_cast<size_t>(u->column)];
    throw runtime::DataError(fmt::format("{}:{}:{}: column '{}': {}", table.file.string(),
                                         table.line_numbers[static_cast<size_t>(u->row)], col + 1,
                                         table.columns[static_cast<size_t>(col)], u->problem()));
  }
  return x;
}

// The table's text is not needed once its numbers are read: freed before predicting.
void release_cells(runtime::Table& table) { std::vector<std::vector<std::string>>().swap(table.cells); }

// m.predict for consecutive chunks of rows, first to last: DataError naming
// `where(row)` for the first row whose prediction is not finite (features far
// outside the training data overflow float32 inside the network).
std::function<runtime::EnsemblePrediction(const at::Tensor&)> checked_predict(
    const runtime::LoadedEnsemble& m, std::function<std::string(int64_t row)> where) {
  return [&m, where = std::move(where), done = std::make_shared<int64_t>(0)](const at::Tensor& rows) {
    runtime::EnsemblePrediction p = m.predict(rows);
    if (const auto row = runtime::first_non_finite_row(p)) {
      throw runtime::DataError(
          fmt::format("{}: the ensemble's prediction for this row is not finite (its features lie "
                      "too far outside the training data for float32); drop or rescale the row",
                      where(*done + *row)));
    }
    *done += rows.size(0);
    return p;
  };
}

// Rows predicted at a time (runtime::prediction_chunk_rows): memory for one chunk's
// prediction, however long the table.
int64_t chunk_rows(const runtime::LoadedEnsemble& m) {
  const runtime::EnsembleTrainer& t = m.first();
  return runtime::prediction_chunk_rows(m.members(), t.options().hidden(),
                                        std::max<int64_t>(2, static_cast<int64_t>(t.classes().size())));
}

// "FILE:LINE" of a table's data row.
std::function<std::string(int64_t)> table_rows(const runtime::Table& table) {
  return [file = table.file.string(), lines = table.line_numbers](int64_t row) {
    return fmt::format("{}:{}", file, lines[static_cast<size_t>(row)]);
  };
}

struct PredictCommand {
  std::string checkpoint, input, output;
  bool members = false;
  std::vector<double> intervals{0.9};  // central intervals of the mixture (regression)
  bool intervals_given = false;
  std::string device = "auto";
  runtime::DataArgs format;  // delimiter and header only
};

// A level as a column suffix: 0.9 -> "90", 0.975 -> "97.5".
std::string level_name(double level) { return fmt::format("{:g}", 100 * level); }

// --interval for a model: refused for a classifier (its predictions have no
// intervals) and when two levels name the same columns (0.9 twice, or 0.9 and
// 0.9000001: both "90").
void check_interval_levels(const std::vector<double>& levels, bool given, runtime::Head head) {
  if (given && head == runtime::Head::kClassification) {
    throw UsageError(
        "--interval is for regression: this model is a classifier, whose predictions are labels and class "
        "probabilities (drop --interval)");
  }
  for (size_t i = 0; i < levels.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (level_name(levels[i]) == level_name(levels[j])) {
        throw UsageError(fmt::format("--interval {} and --interval {} are both the {}% interval: give each level once",
                                     levels[j], levels[i], level_name(levels[i])));
      }
    }
  }
}

std::string prediction_csv(const runtime::EnsembleTrainer& trainer, const runtime::EnsemblePrediction& p,
                           bool per_member, const std::vector<double>& levels) {
  std::string out;
  const bool cls = trainer.options().head() == runtime::Head::kClassification;
  // The prediction's members: all of a manifest's shards when it was gathered from them.
  const int64_t K = cls ? p.member_probabilities.size(0) : p.member_mean.size(0);
  const std::vector<double>& classes = trainer.classes();
  if (cls) {
    out += "predicted";
    for (double c : classes) out += fmt::format(",p_{}", c);
    if (per_member)
      for (int64_t k = 0; k < K; ++k) out += fmt::format(",member_{}", k);
    out += "\n";
    const at::Tensor member_class = p.member_probabilities.argmax(2).contiguous();  // (K, N)
    const auto predicted = p.predicted.accessor<double, 1>();
    const auto probs = p.probabilities.accessor<double, 2>();
    const auto members = member_class.accessor<int64_t, 2>();
    for (int64_t r = 0; r < probs.size(0); ++r) {
      out += fmt::format("{}", predicted[r]);
      for (int64_t c = 0; c < probs.size(1); ++c) out += fmt::format(",{:.6g}", probs[r][c]);
      if (per_member)
        for (int64_t k = 0; k < K; ++k) out += fmt::format(",{}", classes[members[k][r]]);
      out += "\n";
    }
    return out;
  }
  // Mean, total std and its split (total² = aleatoric² + epistemic²), then the
  // mixture's central intervals.
  out += "mean,std,aleatoric_std,epistemic_std";
  for (double level : levels) out += fmt::format(",lower_{0},upper_{0}", level_name(level));
  if (per_member)
    for (int64_t k = 0; k < K; ++k) out += fmt::format(",member_{}", k);
  out += "\n";
  const runtime::UncertaintyDecomposition d = runtime::decompose_uncertainty(p);
  std::vector<at::Tensor> bounds;
  for (const runtime::PredictionInterval& i : runtime::central_intervals(p, levels)) {
    bounds.push_back(i.lower.contiguous());
    bounds.push_back(i.upper.contiguous());
  }
  const auto mean = d.mean.accessor<double, 1>();
  const auto sd = d.total_std.accessor<double, 1>();
  const auto aleatoric = d.aleatoric_std.accessor<double, 1>();
  const auto epistemic = d.epistemic_std.accessor<double, 1>();
  const auto members = p.member_mean.accessor<double, 2>();
  for (int64_t r = 0; r < mean.size(0); ++r) {
    out += fmt::format("{:.9g},{:.9g},{:.9g},{:.9g}", mean[r], sd[r], aleatoric[r], epistemic[r]);
    for (const at::Tensor& b : bounds) out += fmt::format(",{:.9g}", b.data_ptr<double>()[r]);
    if (per_member)
      for (int64_t k = 0; k < K; ++k) out += fmt::format(",{:.9g}", members[k][r]);
    out += "\n";
  }
  return out;
}

int run_predict(const PredictCommand& c) {
  check_outputs({{"-o", c.output}}, {{"checkpoint", c.checkpoint}, {"input", c.input}});
  const runtime::LoadedEnsemble m = runtime::LoadedEnsemble::load(c.checkpoint, pick_device(c.device));
  check_interval_levels(c.intervals, c.intervals_given, m.first().options().head());
  runtime::Table table = read_rows(c.input, c.format);
  const at::Tensor x = model_inputs(table, m, /*with_target=*/false);
  release_cells(table);
  std::string csv;
  runtime::predict_in_chunks(checked_predict(m, table_rows(table)), x, chunk_rows(m),
                             [&](int64_t first, const runtime::EnsemblePrediction& p) {
                               const std::string text = prediction_csv(m.first(), p, c.members, c.intervals);
                               csv.append(first == 0 ? text : text.substr(text.find('\n') + 1));  // one header
                             });
  if (c.output.empty() || c.output == "-") {
    std::cout << csv;
  } else {
    runtime::write_file_atomically(c.output, csv);
    if (m.sharded()) {
      fmt::print(stderr, "packtrain predict: {} rows, {} members from {} shards -> {}\n", x.size(0), m.members(),
                 m.shards(), c.output);
    } else {
      fmt::print(stderr, "packtrain predict: {} rows -> {}\n", x.size(0), c.output);
    }
  }
  return 0;
}

struct EvaluateCommand {
  std::string checkpoint, input;
  std::string device = "auto";
  bool json = false;
  std::vector<double> intervals = runtime::kDefaultIntervalLevels;  // coverage levels (regression)
  bool intervals_given = false;
  std::string reliability;  // SVG path, or empty
  runtime::DataArgs format;
};

// The rows `evaluate` scores: the run's own test rows, or a table with features and
// target (columns matched to the model `m`).
struct EvaluationRows {
  at::Tensor x, y;
  std::string what;
  std::function<std::string(int64_t)> where;  // a row as an error names it
};

EvaluationRows evaluation_rows(const EvaluateCommand& c, const runtime::LoadedEnsemble& m) {
  if (c.input.empty()) {  // the checkpoint's own test rows, from the data it was trained on
    const runtime::SplitData data = runtime::load_split_data(m.run().data);
    // On data changed since training these would be other rows under the run's name;
    // a table given explicitly is the user's choice of data.
    if (!runtime::check_same_data(
            m.run(), data, "to score the new data give it as a table: packtrain evaluate " + c.checkpoint + " TABLE")) {
      fmt::print(stderr,
                 "packtrain evaluate: note: {} records no fingerprint of its data (an earlier version wrote "
                 "it): cannot check that {} is unchanged since training\n",
                 c.checkpoint, m.run().data.data);
    }
    const runtime::Dataset test = data.test();
    if (test.features.size(0) == 0) throw UsageError("the run had no test rows: give a table to evaluate on");
    const std::string what = data.description + ", test rows";
    return {test.features, test.targets, what,
            [what](int64_t row) { return fmt::format("{}: row {}", what, row + 1); }};
  }
  runtime::Table table = read_rows(c.input, c.format);
  const at::Tensor xy = model_inputs(table, m, /*with_target=*/true);
  release_cells(table);
  return {xy.narrow(1, 0, xy.size(1) - 1), xy.narrow(1, xy.size(1) - 1, 1), c.input, table_rows(table)};
}

// A member-parallel manifest is evaluated with all its shards in this process (any
// number of ranks trained it): the ensemble combines every shard's members.
int run_evaluate(const EvaluateCommand& c) {
  check_outputs({{"--reliability", c.reliability}}, {{"checkpoint", c.checkpoint}, {"input", c.input}});
  const runtime::LoadedEnsemble m = runtime::LoadedEnsemble::load(c.checkpoint, pick_device(c.device));
  check_interval_levels(c.intervals, c.intervals_given, m.first().options().head());
  const auto [x, y, what, where] = evaluation_rows(c, m);
  const runtime::Head head = m.first().options().head();
  std::vector<runtime::EnsemblePrediction> chunks;
  runtime::predict_in_chunks(checked_predict(m, where), x, chunk_rows(m),
                             [&](int64_t, runtime::EnsemblePrediction p) { chunks.push_back(std::move(p)); });
  const runtime::EnsembleMetrics metrics =
      runtime::ensemble_metrics(runtime::concatenate_rows(chunks), y, head, m.first().classes(), c.intervals);
  if (!c.reliability.empty()) {
    runtime::write_file_atomically(
        c.reliability, reliability_svg(metrics, head, fmt::format("Reliability of {} on {}", c.checkpoint, what)));
    fmt::print(stderr, "packtrain evaluate: reliability diagram -> {}\n", c.reliability);
  }
  if (c.json) {
    nlohmann::json out = m.sharded() ? gathered_metrics_json(metrics, head) : metrics_json(m.first(), metrics);
    out["data"] = what;
    out["rows"] = x.size(0);
    if (m.sharded()) out["shards"] = m.shards();
    std::cout << out.dump(2) << "\n";
  } else if (m.sharded()) {
    print_gathered_metrics(metrics, head,
                           fmt::format("Metrics on {} ({} rows, original units), {} members from {} shards", what,
                                       x.size(0), m.members(), m.shards()));
  } else {
    print_metrics(m.first(), metrics, fmt::format("Metrics on {} ({} rows, original units)", what, x.size(0)));
  }
  return 0;
}

struct ExportCommand {
  std::string checkpoint, output;
  std::vector<int64_t> members;
};

int run_export(const ExportCommand& c) {
  check_outputs({{"output", c.output}}, {{"checkpoint", c.checkpoint}});
  if (const auto manifest = runtime::read_shard_manifest(c.checkpoint)) {
    std::vector<std::string> files;
    for (const auto& shard : manifest->shards) files.push_back(shard.file.string());
    throw UsageError(
        fmt::format("{} is a member-parallel manifest ({} members in {} shards); export reads one "
                    "checkpoint: export each shard ({})",
                    c.checkpoint, manifest->members, manifest->shards.size(), fmt::join(files, ", ")));
  }
  const runtime::LoadedEnsemble m =
      runtime::LoadedEnsemble::from_checkpoint(*runtime::EnsembleTrainer::read_checkpoint(c.checkpoint), c10::kCPU);
  const int64_t exported = runtime::export_members(c.output, m.first(), m.run().feature_names, c.members);
  fmt::print(stderr,
             "packtrain export: {} member(s) -> {} (load with torch.load; see scripts/load_packtrain_export.py)\n",
             exported, c.output);
  return 0;
}

struct AcquireCommand {
  std::string checkpoint, pool, output;
  int64_t count = 10;
  runtime::AcquisitionOptions options;
  bool strategy_given = false;
  bool json = false;
  std::string device = "auto";
  runtime::DataArgs format;
};

int run_acquire(AcquireCommand c) {
  check_outputs({{"-o", c.output}}, {{"checkpoint", c.checkpoint}, {"pool", c.pool}});
  const runtime::LoadedEnsemble m = runtime::LoadedEnsemble::load(c.checkpoint, pick_device(c.device));
  const bool cls = m.first().options().head() == runtime::Head::kClassification;
  if (!c.strategy_given) c.options.strategy = runtime::default_strategy(cls);
  try {  // before the pool is read and scored
    runtime::check_acquisition_options(c.options, cls);
  } catch (const UserError& e) {
    throw UsageError(
        fmt::format("--strategy {}: {}", runtime::kAcquisitionStrategyNames.name(c.options.strategy), e.what()));
  }
  runtime::Table table = read_rows(c.pool, c.format);
  const at::Tensor x = model_inputs(table, m, /*with_target=*/false);
  release_cells(table);
  if (c.count > x.size(0)) {
    throw UsageError(fmt::format("--count {}: the pool {} has only {} rows", c.count, c.pool, x.size(0)));
  }
  const bool batchbald = c.options.strategy == runtime::AcquisitionStrategy::kBatchBald;
  std::vector<int64_t> chosen;
  std::vector<double> score;  // the chosen rows': a row's score, or BatchBALD's gain in joint mutual information
  if (batchbald) {
    const runtime::BatchBaldSelection s = [&] {
      try {
        return runtime::batchbald_in_chunks(checked_predict(m, table_rows(table)), x, c.count, c.options,
                                            chunk_rows(m));
      } catch (const UserError& e) {  // a pool whose member probabilities would not fit
        throw UsageError(fmt::format("--strategy batchbald on {}: {}", c.pool, e.what()));
      }
    }();
    chosen = s.rows;
    for (size_t i = 0; i < s.rows.size(); ++i) {
      score.push_back(s.joint_mutual_information[i] - (i == 0 ? 0.0 : s.joint_mutual_information[i - 1]));
    }
  } else {
    // Chunk by chunk, keeping each row's score only (the pool's per-member predictions
    // would take members x rows x hidden).
    const at::Tensor scores =
        runtime::acquisition_scores_in_chunks(checked_predict(m, table_rows(table)), x, c.options, chunk_rows(m));
    try {
      chosen = runtime::select_batch(scores, c.count, c.options);
    } catch (const UserError& e) {  // --selection power on negative scores (ucb)
      throw UsageError(
          fmt::format("--selection {}: {}", runtime::kBatchSelectionNames.name(c.options.selection), e.what()));
    }
    const at::Tensor all = scores.contiguous();
    for (const int64_t row : chosen) score.push_back(all.data_ptr<double>()[row]);
  }
  const std::string strategy(runtime::kAcquisitionStrategyNames.name(c.options.strategy));
  const std::string selection(runtime::kBatchSelectionNames.name(c.options.selection));
  std::string text;
  if (c.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < chosen.size(); ++i) {
      rows.push_back({{"rank", i + 1}, {"row", chosen[i]}, {"score", score[i]}});
    }
    nlohmann::json out{{"checkpoint", c.checkpoint}, {"pool", c.pool},         {"pool_rows", x.size(0)},
                       {"strategy", strategy},       {"selection", selection}, {"count", c.count},
                       {"seed", c.options.seed},     {"chosen", rows}};
    if (c.options.strategy == runtime::AcquisitionStrategy::kUcb) out["ucb_beta"] = c.options.ucb_beta;
    if (c.options.selection != runtime::BatchSelection::kTop) out["power"] = c.options.power;
    if (batchbald) out["score_meaning"] = "gain in the batch's joint mutual information (nats)";
    text = out.dump(2) + "\n";
  } else {
    text = "rank,row,score\n";
    for (size_t i = 0; i < chosen.size(); ++i) text += fmt::format("{},{},{:.9g}\n", i + 1, chosen[i], score[i]);
  }
  if (c.output.empty() || c.output == "-") {
    std::cout << text;
  } else {
    runtime::write_file_atomically(c.output, text);
  }
  fmt::print(stderr, "packtrain acquire: {} of {} pool rows by {} ({}){}\n", c.count, x.size(0), strategy, selection,
             c.output.empty() || c.output == "-" ? "" : " -> " + c.output);
  return 0;
}

void add_table_format_options(CLI::App* app, runtime::DataArgs& a) {
  app->add_option("--delimiter", a.delimiter, "auto, comma, tab, semicolon or space")->capture_default_str();
  app->add_option("--header", a.header, "Does the table have a header row: auto, yes or no")->capture_default_str();
}

// The `predict` command: a checkpoint's predictions for a table of feature rows.
void add_predict_command(CLI::App& app, int& status) {
  auto predict = std::make_shared<PredictCommand>();
  CLI::App* p = app.add_subcommand(
      "predict",
      "Predict with a checkpoint: a CSV/TSV of feature rows in, a CSV out. Regression, per row: the\n"
      "ensemble mean; its total std split into aleatoric (the noise the members predict) and epistemic\n"
      "(their disagreement), std² = aleatoric² + epistemic²; and central intervals of the members'\n"
      "mixture itself (--interval). Classification: the predicted label and class probabilities.\n"
      "Columns are matched by the training feature names when the file has a header, else taken in order.");
  p->add_option("checkpoint", predict->checkpoint,
                "Checkpoint written by `packtrain train --checkpoint` (or a --member-parallel run's manifest)")
      ->required();
  p->add_option("input", predict->input, "CSV/TSV/whitespace table of feature rows")->required();
  p->add_option("-o,--output", predict->output, "Output CSV (written atomically; default: stdout)");
  p->add_flag("--members", predict->members, "Also one column per member");
  p->add_option("--interval", predict->intervals,
                "Regression: a central prediction interval of the ensemble's mixture at this level, as columns\n"
                "lower_L,upper_L (repeatable; e.g. --interval 0.5 --interval 0.95)")
      ->capture_default_str()
      ->check(interval_level())
      ->each([predict](const std::string&) { predict->intervals_given = true; });
  p->add_option("--device", predict->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  add_table_format_options(p, predict->format);
  p->callback([predict, &status] {
    status = within_memory("the prediction for " + predict->input, "predict fewer rows at a time (split the file)",
                           [&] { return run_predict(*predict); });
  });
}

// The `evaluate` command: a checkpoint's metrics per member and for the ensemble.
void add_evaluate_command(CLI::App& app, int& status) {
  auto evaluate = std::make_shared<EvaluateCommand>();
  CLI::App* e = app.add_subcommand(
      "evaluate",
      "Metrics of a checkpoint per member and for the ensemble: on the test rows of the run's own data\n"
      "(default), or on a table with the feature columns and the target column. The ensemble's\n"
      "scores and calibration follow, with a verdict in words. Regression: RMSE, NLL of the mixture and\n"
      "of its moment-matched Gaussian (what deep-ensemble papers report), CRPS, coverage and mean width of\n"
      "central intervals (--interval), miscalibration area. Classification: accuracy, NLL, Brier score,\n"
      "expected calibration error (15 equal-width confidence bins).");
  e->add_option("checkpoint", evaluate->checkpoint,
                "Checkpoint written by `packtrain train --checkpoint` (or a --member-parallel run's manifest)")
      ->required();
  e->add_option("input", evaluate->input, "Table with features and target (default: the run's test rows)");
  e->add_option("--device", evaluate->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  e->add_flag("--json", evaluate->json, "Print the metrics as JSON (every number, the calibration curve included)");
  e->add_option("--interval", evaluate->intervals,
                "Regression: the coverage of the mixture's central interval at this level (repeatable)")
      ->capture_default_str()
      ->check(interval_level())
      ->each([evaluate](const std::string&) { evaluate->intervals_given = true; });
  e->add_option("--reliability", evaluate->reliability,
                "Also write the reliability diagram (SVG): coverage against level, or accuracy against confidence");
  add_table_format_options(e, evaluate->format);
  e->callback([evaluate, &status] {
    status = within_memory("the evaluation on " + (evaluate->input.empty() ? "the run's test rows" : evaluate->input),
                           "evaluate fewer rows at a time (split the file)", [&] { return run_evaluate(*evaluate); });
  });
}

// The `acquire` command: the pool rows to label next.
void add_acquire_command(CLI::App& app, int& status) {
  auto acquire = std::make_shared<AcquireCommand>();
  CLI::App* a = app.add_subcommand(
      "acquire",
      "Choose which unlabelled rows to label next: score every row of a pool (a table of feature\n"
      "columns, as for predict) with the checkpoint's ensemble and write the chosen rows' index (0-based\n"
      "among the data rows), score and rank as CSV (or --json). Regression: epistemic (the members'\n"
      "disagreement; default), variance (total predictive variance), ucb (mean + beta * std).\n"
      "Classification: bald (mutual information; default), entropy, margin, variation-ratio, batchbald\n"
      "(rows chosen greedily for the batch's joint mutual information, Kirsch et al. 2019; its score is\n"
      "each pick's gain). random for a baseline. --selection power or softmax draws the batch at random in\n"
      "proportion to the scores (seeded), which keeps a batch from filling with near-duplicates of one region.");
  a->add_option("checkpoint", acquire->checkpoint,
                "Checkpoint written by `packtrain train --checkpoint` (or a --member-parallel run's manifest)")
      ->required();
  a->add_option("pool", acquire->pool, "CSV/TSV/whitespace table of unlabelled feature rows")->required();
  a->add_option("--count,-b", acquire->count, "Rows to choose (the batch size b)")
      ->capture_default_str()
      ->check(positive());
  // --strategy, --selection, --power, --ucb-beta, --seed: their schema (acquisition.h).
  add_schema_flags(a, runtime::acquisition_option_schema(), acquire->options);
  // A negative --seed is refused by the uint64 range alone (make_integer_options_exact:
  // "must be an integer between 0 and 18446744073709551615"), as acquire always did.
  a->get_option("--seed")->get_validator()->active(false);  // its only check so far: non_negative()
  a->get_option("--strategy")->default_str("epistemic|bald")->each([acquire](const std::string&) {
    acquire->strategy_given = true;
  });
  a->add_option("-o,--output", acquire->output, "Output file (written atomically; default: stdout)");
  a->add_flag("--json", acquire->json, "Write JSON instead of CSV");
  a->add_option("--device", acquire->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  add_table_format_options(a, acquire->format);
  a->callback([acquire, &status] {
    status = within_memory("scoring the pool " + acquire->pool, "acquire from a pool of fewer rows",
                           [&] { return run_acquire(*acquire); });
  });
}

// The `export` command: members of a checkpoint for Python PyTorch.
void add_export_command(CLI::App& app, int& status) {
  auto exporter = std::make_shared<ExportCommand>();
  CLI::App* x = app.add_subcommand(
      "export",
      "Write members of a checkpoint for Python PyTorch: one torch.load(path) gives their state dicts\n"
      "(torch.nn.Sequential names), architecture, standardization and head.");
  x->add_option("checkpoint", exporter->checkpoint, "Checkpoint written by `packtrain train --checkpoint`")->required();
  x->add_option("output", exporter->output, "Export file (.pt)")->required();
  x->add_option("--member", exporter->members,
                "Member index to export (repeatable; default: the ensemble's members, those predict uses)");
  x->callback([exporter, &status] { status = run_export(*exporter); });
}

}  // namespace

void add_predict_commands(CLI::App& app, int& status) {
  add_predict_command(app, status);
  add_evaluate_command(app, status);
  add_acquire_command(app, status);
  add_export_command(app, status);
}

}  // namespace packtrain::cli
