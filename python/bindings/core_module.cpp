// packtrain._core: the Python binding of runtime::EnsembleTrainer. A thin layer:
// no training logic here — options go through the trainer's own JSON (so the
// defaults are the CLI's), tensors cross without copies through torch's pybind11
// casters, the GIL is released while C++ trains, and the epoch callback (which
// holds it again) is where Ctrl-C is seen, as the CLI sees it between epochs.
#include "packtrain/base/option_schema.h"
#include "packtrain/base/user_error.h"
#include "packtrain/runtime/data/bpe_tokenizer.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/data_split.h"
#include "packtrain/runtime/data/labelled_texts.h"
#include "packtrain/runtime/data/run_data.h"
#include "packtrain/runtime/data/text_tokenizer.h"
#include "packtrain/runtime/measure/cpu_memory.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "packtrain/runtime/trainers/ensemble/hyperparameter_sweep.h"
#include "packtrain/runtime/trainers/ensemble/loaded_ensemble.h"
#include "packtrain/runtime/trainers/ensemble/run_resume.h"
#include "packtrain/runtime/trainers/memory_estimate.h"
#include "packtrain/runtime/trainers/multitask/multitask_resume.h"
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"
#include "packtrain/runtime/trainers/multitask/pretrained_trunk.h"
#include "packtrain/runtime/trainers/uncertainty/acquisition.h"
#include "packtrain/runtime/trainers/uncertainty/active_learning.h"
#include "packtrain/runtime/trainers/uncertainty/calibration.h"
#include "packtrain/runtime/trainers/uncertainty/predictive_distribution.h"
#include "packtrain/runtime/trainers/uncertainty/variance_calibration.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;
using packtrain::runtime::EnsembleTrainer;
using packtrain::runtime::LoadedEnsemble;

namespace {

// Capture decisions and fallbacks (which the CLI prints on stderr) go to Python's
// logging, logger "packtrain", level INFO: not printed into a notebook unless asked.
void to_python_logging(const std::string& message) {
  py::gil_scoped_acquire gil;
  py::module_::import("logging").attr("getLogger")("packtrain").attr("info")(message);
}

// The trainer's options with every key the caller gave replaced (types checked by
// options_from_json, values by validate()), over `packtrain train`'s defaults; a bad
// value is a ValueError, as scikit-learn's estimators raise for invalid parameters.
// The swept options (hidden, lr, weight_decay, dropout) may be lists, as the CLI's comma
// lists, and channels a list of lists (the CLI's /-separated lists): more than one value is a sweep of their cross
// product, `members` seeds each, in one pack (runtime/trainers/ensemble/hyperparameter_sweep.h); `grid` gets the lists
// and the options their first values.
packtrain::runtime::EnsembleTrainerOptions scalar_options(const std::string& overrides_json,
                                                          packtrain::runtime::SweepGrid& grid) {
  nlohmann::json merged =
      nlohmann::json::parse(packtrain::runtime::to_json(packtrain::runtime::EnsembleTrainerOptions()));
  const nlohmann::json overrides = nlohmann::json::parse(overrides_json);
  grid = {{merged.at("lr").get<double>()},
          {merged.at("weight_decay").get<double>()},
          1,
          {merged.at("dropout").get<double>()},
          {},
          {}};
  for (const auto& [key, value] : overrides.items()) {
    if (!merged.contains(key)) throw py::value_error("unknown trainer option '" + key + "'");
    if (key == "hidden" && value.is_array()) {  // widths: integers (the estimators checked each)
      if (value.empty()) throw py::value_error("hidden: an empty list; give one width, or several to sweep them");
      grid.hidden = value.get<std::vector<int64_t>>();
      merged[key] = grid.hidden.front();
      continue;
    }
    // cnn channel lists: a list of lists (the estimators checked each count) sweeps them.
    if (key == "channels" && value.is_array() && !value.empty() && value.front().is_array()) {
      grid.channels = value.get<std::vector<std::vector<int64_t>>>();
      merged[key] = grid.channels.front();
      if (grid.channels.size() == 1) grid.channels.clear();
      continue;
    }
    std::vector<double>* list = key == "lr"             ? &grid.lr
                                : key == "weight_decay" ? &grid.weight_decay
                                : key == "dropout"      ? &grid.dropout
                                                        : nullptr;
    if (list != nullptr && value.is_array()) {
      if (value.empty()) throw py::value_error(key + ": an empty list; give one value, or several to sweep them");
      list->clear();
      for (const nlohmann::json& v : value) {
        if (!v.is_number()) throw py::type_error(key + ": every value of the list must be a number, got " + v.dump());
        list->push_back(v.get<double>());
      }
      merged[key] = list->front();
    } else {
      if (list != nullptr && value.is_number()) *list = {value.get<double>()};
      merged[key] = value;
    }
  }
  try {
    packtrain::runtime::EnsembleTrainerOptions options = packtrain::runtime::options_from_json(merged.dump());
    options.log(to_python_logging);
    options.validate();
    grid.seeds = options.members();
    return options;
  } catch (const c10::Error& e) {
    throw py::value_error(e.what_without_backtrace());
  }
}

packtrain::runtime::EnsembleTrainerOptions options_from(const std::string& overrides_json) {
  packtrain::runtime::SweepGrid grid;
  packtrain::runtime::EnsembleTrainerOptions options = scalar_options(overrides_json, grid);
  if (!grid.sweeps()) return options;
  try {
    options = packtrain::runtime::sweep_options(options, grid);
    options.validate();
    return options;
  } catch (const c10::Error& e) {
    throw py::value_error(e.what_without_backtrace());
  }
}

// Refuses a fit whose memory the runtime's estimate says will not fit (as `train`
// does before it allocates: runtime/trainers/memory_estimate.h), before the options
// expand a sweep's per-member values: MemoryError naming the estimate.
void check_fit_memory(const std::string& overrides_json, int64_t rows, int64_t features, int64_t classes,
                      int64_t validation_rows) {
  packtrain::runtime::SweepGrid grid;
  packtrain::runtime::EnsembleTrainerOptions options = scalar_options(overrides_json, grid);
  const double configurations = static_cast<double>(grid.configurations());
  const double members = configurations * static_cast<double>(options.members());
  if (members > 9.2e18) {
    throw py::value_error("members=" + std::to_string(options.members()) + " x " +
                          std::to_string(static_cast<int64_t>(configurations)) +
                          " swept configurations is more members than a pack can count: lower members");
  }
  options.members(static_cast<int64_t>(members));
  for (const std::vector<int64_t>& list : grid.channels) {  // the pack is the widest in each block
    std::vector<int64_t> widest = options.channels();
    for (size_t b = 0; b < std::min(widest.size(), list.size()); ++b) widest[b] = std::max(widest[b], list[b]);
    options.channels(widest);
  }
  packtrain::runtime::EnsembleRunSizes sizes;
  sizes.features = features;
  sizes.classes = classes;
  sizes.rows = rows;
  sizes.validation_rows = validation_rows;
  sizes.predict_rows = rows;
  try {
    packtrain::runtime::check_memory(packtrain::runtime::estimate_ensemble_run(options, sizes),
                                     "lower members, hidden, depth or batch_size (or fit where more memory is free)");
  } catch (const packtrain::runtime::DataError& e) {
    PyErr_SetString(PyExc_MemoryError, e.what());
    throw py::error_already_set();
  }
}

py::dict report_dict(const packtrain::runtime::EpochReport& r) {
  py::dict d;
  d["epoch"] = r.epoch;
  d["epochs"] = r.epochs;
  d["steps"] = r.steps;
  d["train_loss"] = r.train_loss;
  d["val_loss"] = r.val_loss;
  d["active"] = r.active;
  d["member_train_loss"] = r.member_train_loss;
  d["member_val_loss"] = r.member_val_loss;
  d["events"] = r.events;
  return d;
}

// Runs the trainer's epochs with the GIL released. After each epoch the callback
// (if any) gets the report; Ctrl-C (a pending KeyboardInterrupt) or an exception in
// the callback stops training after that epoch — the weights are then consistent —
// and is raised here.
void train(EnsembleTrainer& trainer, const py::object& callback) {
  std::unique_ptr<py::error_already_set> pending;
  const packtrain::runtime::EpochCallback on_epoch = [&](const packtrain::runtime::EpochReport& report) {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      pending = std::make_unique<py::error_already_set>();
      return false;
    }
    if (callback.is_none()) return true;
    try {
      const py::object keep_going = callback(report_dict(report));
      return keep_going.is_none() || keep_going.cast<bool>();
    } catch (py::error_already_set& e) {
      pending = std::make_unique<py::error_already_set>(std::move(e));
      return false;
    }
  };
  {
    py::gil_scoped_release no_gil;
    trainer.train(on_epoch);
  }
  if (pending) throw std::move(*pending);
}

// f() with the GIL released: C++ work that touches no Python object.
template <typename F>
auto without_gil(F&& f) {
  py::gil_scoped_release no_gil;
  return f();
}

py::dict prediction_dict(const packtrain::runtime::EnsemblePrediction& p) {
  py::dict d;
  const auto put = [&](const char* name, const at::Tensor& t) {
    if (t.defined()) d[name] = t;
  };
  put("member_mean", p.member_mean);
  put("member_variance", p.member_variance);
  put("mean", p.mean);
  put("variance", p.variance);
  put("spread", p.spread);
  put("member_probabilities", p.member_probabilities);
  put("probabilities", p.probabilities);
  put("predicted", p.predicted);
  d["included"] = p.included;
  return d;
}

// A prediction dict (predict()'s, or one a caller builds from member tensors) back
// as the runtime's EnsemblePrediction; `included` defaults to every member.
packtrain::runtime::EnsemblePrediction prediction_from(const py::dict& d) {
  packtrain::runtime::EnsemblePrediction p;
  const auto get = [&](const char* name) {
    return d.contains(name) && !d[name].is_none() ? d[name].cast<at::Tensor>().to(at::kDouble).cpu() : at::Tensor();
  };
  p.member_mean = get("member_mean");
  p.member_variance = get("member_variance");
  p.member_probabilities = get("member_probabilities");
  const at::Tensor& first = p.member_probabilities.defined() ? p.member_probabilities : p.member_mean;
  if (!first.defined())
    throw py::value_error("a prediction needs member_mean (K, N) or member_probabilities (K, N, C)");
  if (d.contains("included") && !d["included"].is_none()) {
    p.included = d["included"].cast<std::vector<int64_t>>();
  } else {
    for (int64_t k = 0; k < first.size(0); ++k) p.included.push_back(k);
  }
  return p;
}

py::dict regression_calibration_dict(const packtrain::runtime::RegressionCalibration& c) {
  py::dict d;
  d["rows"] = c.rows;
  d["rmse"] = c.rmse;
  d["mixture_nll"] = c.mixture_nll;
  d["gaussian_nll"] = c.gaussian_nll;
  d["crps"] = c.crps;
  py::list intervals;
  for (const auto& i : c.intervals) {
    py::dict one;
    one["level"] = i.level;
    one["coverage"] = i.coverage;
    one["mean_width"] = i.mean_width;
    intervals.append(one);
  }
  d["intervals"] = intervals;
  d["expected"] = c.expected;
  d["observed"] = c.observed;
  d["miscalibration_area"] = c.miscalibration_area;
  d["summary"] = packtrain::runtime::calibration_summary(c);
  return d;
}

py::dict classification_calibration_dict(const packtrain::runtime::ClassificationCalibration& c) {
  py::dict d;
  d["rows"] = c.rows;
  d["accuracy"] = c.accuracy;
  d["nll"] = c.nll;
  d["brier"] = c.brier;
  d["ece"] = c.ece;
  d["mean_confidence"] = c.mean_confidence;
  py::list bins;
  for (const auto& b : c.bins) {
    py::dict one;
    one["lower"] = b.lower;
    one["upper"] = b.upper;
    one["count"] = b.count;
    one["confidence"] = b.confidence;
    one["accuracy"] = b.accuracy;
    bins.append(one);
  }
  d["bins"] = bins;
  d["summary"] = packtrain::runtime::calibration_summary(c);
  return d;
}

py::dict metrics_dict(const packtrain::runtime::Metrics& m) {
  py::dict d;
  d["rmse"] = m.rmse;
  d["nll"] = m.nll;
  d["accuracy"] = m.accuracy;
  return d;
}

// What the CLI's checkpoints record about a run besides the trainer: for a run
// from Python, the features' names (predict matches table columns by them) and
// where the data came from ("python": evaluate must be given a table).
std::string run_description(const std::vector<std::string>& feature_names, const std::string& target_name) {
  packtrain::runtime::RunDescription run;
  run.data.data = "python";
  run.feature_names = feature_names;
  run.target_name = target_name;
  return packtrain::runtime::to_json(run);
}

using packtrain::runtime::MultiTaskTrainer;

packtrain::runtime::LabelledTexts labelled_texts(const std::vector<std::string>& texts,
                                                 const std::vector<int64_t>& labels) {
  if (texts.size() != labels.size()) {
    throw py::value_error("texts and labels differ in length: " + std::to_string(texts.size()) + " and " +
                          std::to_string(labels.size()));
  }
  return {texts, labels, "python"};
}

py::dict task_metrics_dict(const packtrain::runtime::TaskMetrics& m) {
  py::dict d;
  d["accuracy"] = m.accuracy;
  d["mcc"] = m.mcc;
  d["lm_loss"] = m.lm_loss;
  d["perplexity"] = m.perplexity;
  d["examples"] = m.examples;
  d["tokens"] = m.tokens;
  return d;
}

// Resuming a run (runtime/trainers/ensemble/run_resume.h): a checkpoint of `packtrain train`
// (its data reloaded and checked to be the run's) or of an estimator's save() (its
// training and validation rows given again, checked against the checkpoint's); a
// member-parallel manifest resumes whole in this process. Returns the trainer,
// restored and ready to train, with the run's feature and target names.
void add_resume(py::module_& m) {
  namespace rt = packtrain::runtime;
  using Rows = std::optional<at::Tensor>;
  m.def(
      "resume",
      [](const std::string& path, const std::string& device, int64_t epochs, const Rows& x, const Rows& y,
         const Rows& val_x, const Rows& val_y) {
        const rt::ResumeOptions options{.epochs = epochs, .device = c10::Device(device), .log = to_python_logging};
        auto [trainer, run] = without_gil([&] {
          const rt::ResumeSource source = rt::open_resume(path);
          if (rt::describes_its_data(source.run)) {
            if (x || y) {
              throw packtrain::UserError(path + ": this run reloads its own data (" + source.run.data.data +
                                         ") and checks them: give no X or y");
            }
            return std::pair(std::move(rt::resume(source, options).trainer), source.run);
          }
          if (!x || !y) {
            throw packtrain::UserError(path +
                                       ": this run was fitted from Python and its rows are not in the "
                                       "checkpoint: give X and y (and X_val, y_val), the rows fit() trained on");
          }
          return std::pair(
              rt::resume_with_data(source, options, *x, *y, val_x.value_or(at::Tensor()), val_y.value_or(at::Tensor())),
              source.run);
        });
        return py::make_tuple(py::cast(std::move(trainer)), run.feature_names, run.target_name);
      },
      py::arg("path"), py::arg("device") = "cpu", py::arg("epochs") = 0, py::arg("x") = py::none(),
      py::arg("y") = py::none(), py::arg("val_x") = py::none(), py::arg("val_y") = py::none());
}

// The trainer's options and schema, memory checks, data options and splits, devices.
void add_options_and_data(py::module_& m) {
  m.def(
      "default_options", [] { return packtrain::runtime::to_json(packtrain::runtime::EnsembleTrainerOptions()); },
      "The trainer's default options as JSON: `packtrain train`'s (the struct's own).");
  m.def(
      "option_schema", [] { return packtrain::runtime::trainer_option_schema().describe().dump(); },
      "The trainer's options schema as JSON: each field's name, kind, flag, help, default, range, choices.");
  m.def("check_fit_memory", &check_fit_memory, py::arg("options_json"), py::arg("rows"), py::arg("features"),
        py::arg("classes"), py::arg("validation_rows"),
        "MemoryError when a fit of these options and data sizes would not fit in memory (`train`'s estimate).");
  m.def(
      "default_data_options",
      [] {
        const packtrain::runtime::DataArgs d;
        py::dict out;
        out["val_fraction"] = d.val_fraction;
        out["split_seed"] = d.split_seed;
        return out;
      },
      "The CLI's defaults for holding out validation rows.");
  m.def(
      "carve_validation",
      [](int64_t rows, double fraction, uint64_t seed) {
        packtrain::runtime::DataSplit split;
        for (int64_t r = 0; r < rows; ++r) split.train.push_back(r);
        packtrain::runtime::carve_validation(split, fraction, seed);
        return py::make_tuple(split.train, split.validation);
      },
      py::arg("rows"), py::arg("fraction"), py::arg("seed"),
      "The training and validation rows the CLI's --val-fraction/--split-seed hold out of `rows` rows.");
  m.def("cuda_available", [] { return at::hasCUDA(); });
  m.def(
      "load_data",
      [](const std::string& data, int split, double test_fraction, uint64_t split_seed) {
        packtrain::runtime::DataArgs args;
        args.data = data;
        args.split = split;
        args.val_fraction = 0;  // the estimators hold out validation rows themselves, as the CLI does
        args.test_fraction = test_fraction;
        args.split_seed = split_seed;
        packtrain::runtime::SplitData loaded = without_gil([&] { return packtrain::runtime::load_split_data(args); });
        // Table order, as the CLI's training rows are once it has held out validation rows.
        std::sort(loaded.split.train.begin(), loaded.split.train.end());
        const packtrain::runtime::Dataset train = loaded.train(), test = loaded.test();
        py::dict out;
        out["x_train"] = train.features;
        out["y_train"] = train.targets.reshape({-1});
        out["x_test"] = test.features;
        out["y_test"] = test.targets.reshape({-1});
        out["feature_names"] = loaded.all.feature_names;
        out["target_name"] = loaded.all.target_name;
        out["description"] = loaded.description;
        return out;
      },
      py::arg("data"), py::arg("split") = 0, py::arg("test_fraction") = 0.2, py::arg("split_seed") = 0,
      "A bundled data set, UCI directory or table, split as the CLI splits it (training rows in table order).");
}

// The uncertainty, calibration and acquisition math of runtime/trainers, on a
// prediction dict: what the estimators call, and what the tests hold against
// reference libraries.
void add_uncertainty(py::module_& m) {
  namespace rt = packtrain::runtime;
  m.def(
      "decompose",
      [](const py::dict& prediction) {
        const rt::EnsemblePrediction p = prediction_from(prediction);
        py::dict d;
        if (p.member_probabilities.defined()) {
          const rt::ClassUncertaintyDecomposition c = rt::decompose_class_uncertainty(p);
          d["entropy"] = c.entropy;
          d["aleatoric_entropy"] = c.aleatoric;
          d["mutual_information"] = c.mutual_information;
        } else {
          const rt::UncertaintyDecomposition u = rt::decompose_uncertainty(p);
          d["mean"] = u.mean;
          d["total_std"] = u.total_std;
          d["aleatoric_std"] = u.aleatoric_std;
          d["epistemic_std"] = u.epistemic_std;
        }
        return d;
      },
      py::arg("prediction"));
  // Recalibration (runtime/trainers/uncertainty/variance_calibration.h) of a regression prediction dict.
  const auto combined = [](const py::dict& p) {
    rt::EnsemblePrediction e = prediction_from(p);
    const rt::Head head = e.member_variance.defined() ? rt::Head::kGaussian : rt::Head::kMean;
    return rt::combine_members(std::move(e), head);
  };
  m.def(
      "fit_variance_scale",
      [combined](const py::dict& p, const at::Tensor& y) { return rt::fit_variance_scale(combined(p), y); },
      py::arg("prediction"), py::arg("y"));
  m.def(
      "scale_variance",
      [combined](const py::dict& p, double scale) { return prediction_dict(rt::scale_variance(combined(p), scale)); },
      py::arg("prediction"), py::arg("scale"));
  m.def(
      "mixture_cdf", [](const py::dict& p, const at::Tensor& y) { return rt::mixture_cdf(prediction_from(p), y); },
      py::arg("prediction"), py::arg("y"));
  m.def(
      "mixture_log_density",
      [](const py::dict& p, const at::Tensor& y) { return rt::mixture_log_density(prediction_from(p), y); },
      py::arg("prediction"), py::arg("y"));
  m.def(
      "mixture_crps", [](const py::dict& p, const at::Tensor& y) { return rt::mixture_crps(prediction_from(p), y); },
      py::arg("prediction"), py::arg("y"));
  m.def(
      "mixture_quantiles",
      [](const py::dict& p, const std::vector<double>& q) { return rt::mixture_quantiles(prediction_from(p), q); },
      py::arg("prediction"), py::arg("probabilities"));
  m.def(
      "central_intervals",
      [](const py::dict& p, const std::vector<double>& levels) {
        py::list out;
        for (const rt::PredictionInterval& i : rt::central_intervals(prediction_from(p), levels)) {
          out.append(py::make_tuple(i.level, i.lower, i.upper));
        }
        return out;
      },
      py::arg("prediction"), py::arg("levels"));
}

// Calibration and acquisition (runtime/trainers/uncertainty/calibration.h, acquisition.h) on a
// prediction dict.
void add_calibration_and_acquisition(py::module_& m) {
  namespace rt = packtrain::runtime;
  m.def(
      "regression_calibration",
      [](const py::dict& p, const at::Tensor& y, const std::vector<double>& levels, int64_t points) {
        return regression_calibration_dict(rt::regression_calibration(prediction_from(p), y, levels, points));
      },
      py::arg("prediction"), py::arg("y"), py::arg("levels") = rt::kDefaultIntervalLevels,
      py::arg("points") = rt::kDefaultCalibrationPoints);
  m.def(
      "classification_calibration",
      [](const at::Tensor& probabilities, const at::Tensor& target, int64_t bins) {
        return classification_calibration_dict(rt::classification_calibration(probabilities, target, bins));
      },
      py::arg("probabilities"), py::arg("target"), py::arg("bins") = rt::kDefaultConfidenceBins);
  m.def(
      "acquisition_option_schema", [] { return rt::acquisition_option_schema().describe().dump(); },
      "`acquire`'s options schema as JSON (as option_schema for the trainer's): acquire()'s defaults.");
  m.def(
      "active_learning_option_schema", [] { return rt::active_learning_option_schema().describe().dump(); },
      "`active-learn`'s loop and acquisition options schema as JSON.");
  m.def("acquisition_strategies", [] {
    std::vector<std::string> names;
    for (const auto& [value, name] : rt::kAcquisitionStrategyNames.entries) names.emplace_back(name);
    return names;
  });
  m.def(
      "acquisition_scores",
      [](const py::dict& p, const std::string& strategy, double ucb_beta, uint64_t seed) {
        rt::AcquisitionOptions o;
        o.strategy = rt::kAcquisitionStrategyNames.parse(strategy);
        o.ucb_beta = ucb_beta;
        o.seed = seed;
        return rt::acquisition_scores(prediction_from(p), o);
      },
      py::arg("prediction"), py::arg("strategy"), py::arg("ucb_beta") = rt::AcquisitionOptions().ucb_beta,
      py::arg("seed") = rt::AcquisitionOptions().seed);
  m.def(
      "select_batch",
      [](const at::Tensor& scores, int64_t count, const std::string& selection, double power, uint64_t seed) {
        rt::AcquisitionOptions o;
        o.selection = rt::kBatchSelectionNames.parse(selection);
        o.power = power;
        o.seed = seed;
        return rt::select_batch(scores, count, o);
      },
      py::arg("scores"), py::arg("count"),
      py::arg("selection") = std::string(rt::kBatchSelectionNames.name(rt::AcquisitionOptions().selection)),
      py::arg("power") = rt::AcquisitionOptions().power, py::arg("seed") = rt::AcquisitionOptions().seed);
  m.def(
      "batchbald_select",
      [](const at::Tensor& member_probabilities, int64_t count, int64_t samples, uint64_t seed) {
        const rt::BatchBaldSelection s = [&] {
          py::gil_scoped_release release;
          return rt::batchbald_select(member_probabilities, count, samples, seed);
        }();
        return py::make_tuple(s.rows, s.joint_mutual_information);
      },
      py::arg("member_probabilities"), py::arg("count"), py::arg("samples") = rt::kDefaultBatchBaldSamples,
      py::arg("seed") = rt::AcquisitionOptions().seed,
      "BatchBALD's batch from member probabilities (K, N, C): (rows in the order chosen, the joint mutual "
      "information after each pick), runtime/trainers/uncertainty/batchbald.h.");
}

void add_checkpoints(py::module_& m) {
  // A checkpoint read back: a single checkpoint's trainer (everything a fitted
  // estimator does), or a member-parallel manifest's shards (predict only).
  m.def(
      "load",
      [](const std::string& path, const std::string& device) -> py::object {
        LoadedEnsemble loaded =
            without_gil([&] { return LoadedEnsemble::load(path, c10::Device(device), to_python_logging); });
        if (!loaded.sharded()) return py::cast(loaded.take_trainer());
        return py::cast(std::make_unique<LoadedEnsemble>(std::move(loaded)));
      },
      py::arg("path"), py::arg("device") = "cpu");

  py::class_<LoadedEnsemble, std::unique_ptr<LoadedEnsemble>>(m, "ShardedEnsemble")
      .def(
          "predict",
          [](const LoadedEnsemble& e, const at::Tensor& x) {
            return prediction_dict(without_gil([&] { return e.predict(x); }));
          },
          py::arg("x"))
      .def_property_readonly("members", &LoadedEnsemble::members)
      .def_property_readonly("shards", &LoadedEnsemble::shards)
      .def_property_readonly("options_json",
                             [](const LoadedEnsemble& e) { return packtrain::runtime::to_json(e.first().options()); })
      .def_property_readonly("in_features", [](const LoadedEnsemble& e) { return e.first().in_features(); })
      .def_property_readonly("classes", [](const LoadedEnsemble& e) { return e.first().classes(); });
}

py::dict epoch_report_dict(const packtrain::runtime::MultiTaskEpochReport& r) {
  py::dict d;
  d["epoch"] = r.epoch;
  d["steps"] = r.steps;
  d["classification_loss"] = r.classification_loss;
  d["lm_loss"] = r.lm_loss;
  d["seconds"] = r.seconds;
  if (!r.member_validation_loss.empty()) {
    d["member_validation_loss"] = r.member_validation_loss;
    d["members_training"] = r.members_training;
    d["events"] = r.events;
  }
  return d;
}

// MultiTask.generate: each member's continuation as str. Tokens may end inside a
// UTF-8 character: U+FFFD for what does not decode, as the CLI prints.
py::list generate_texts(packtrain::runtime::MultiTaskTrainer& t, const std::string& prompt, int64_t max_new_tokens,
                        double temperature, int64_t top_k, uint64_t seed) {
  packtrain::runtime::GenerateOptions g;
  g.max_new_tokens = max_new_tokens;
  g.temperature = temperature;
  g.top_k = top_k;
  g.seed = seed;
  const std::vector<std::string> texts = without_gil([&] { return t.generate(prompt, g); });
  py::list out;
  for (const std::string& text : texts) {
    PyObject* decoded = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
    if (decoded == nullptr) throw py::error_already_set();
    out.append(py::reinterpret_steal<py::str>(decoded));
  }
  return out;
}

void add_multitask(py::module_& m) {
  // The multi-task transformer (runtime::MultiTaskTrainer): options as its JSON.
  m.def("default_multitask_options",
        [] { return packtrain::runtime::to_json(packtrain::runtime::MultiTaskTrainerOptions()); });
  m.def(
      "multitask_option_schema", [] { return packtrain::runtime::multitask_option_schema().describe().dump(); },
      "The multi-task trainer's options schema as JSON (as option_schema for the ensemble trainer's).");
  py::class_<MultiTaskTrainer>(m, "MultiTask")
      .def(py::init([](const std::string& options_json, const std::string& device) {
             packtrain::runtime::MultiTaskTrainerOptions o =
                 packtrain::runtime::multitask_options_from_json(options_json);
             o.model().device(c10::Device(device));
             o.log(to_python_logging);
             o.validate();
             return std::make_unique<MultiTaskTrainer>(o);
           }),
           py::arg("options_json"), py::arg("device") = "cpu")
      .def(
          "set_training_data",
          [](MultiTaskTrainer& t, const std::vector<std::string>& texts, const std::vector<int64_t>& labels) {
            const auto data = labelled_texts(texts, labels);
            return without_gil([&] { return t.set_training_data(data); });
          },
          py::arg("texts"), py::arg("labels"))
      .def(
          "set_validation_data",
          [](MultiTaskTrainer& t, const std::vector<std::string>& texts, const std::vector<int64_t>& labels) {
            t.set_validation_data(labelled_texts(texts, labels));
          },
          py::arg("texts"), py::arg("labels"))
      .def("train_epoch",
           [](MultiTaskTrainer& t) { return epoch_report_dict(without_gil([&] { return t.train_epoch(); })); })
      .def_property_readonly("members_training", &MultiTaskTrainer::members_training)
      .def("restore_best_members", &MultiTaskTrainer::restore_best_members, py::call_guard<py::gil_scoped_release>())
      .def(
          "evaluate",
          [](MultiTaskTrainer& t, const std::vector<std::string>& texts, const std::vector<int64_t>& labels) {
            const auto data = labelled_texts(texts, labels);
            return task_metrics_dict(without_gil([&] { return t.evaluate(data); }));
          },
          py::arg("texts"), py::arg("labels"))
      .def("score", &MultiTaskTrainer::score, py::arg("texts"), py::call_guard<py::gil_scoped_release>())
      .def("member_scores", &MultiTaskTrainer::member_scores, py::arg("texts"),
           py::call_guard<py::gil_scoped_release>())
      .def("generate", &generate_texts, py::arg("prompt"), py::arg("max_new_tokens"), py::arg("temperature"),
           py::arg("top_k"), py::arg("seed"))
      .def(
          "save", [](const MultiTaskTrainer& t, const std::string& path) { t.save(path); }, py::arg("path"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "save_pretrained",
          [](const MultiTaskTrainer& t, const std::string& dir, int64_t member) { t.save_pretrained(dir, member); },
          py::arg("dir"), py::arg("member") = 0, py::call_guard<py::gil_scoped_release>())
      .def_static(
          "load",
          [](const std::string& path, const std::string& device) {
            return MultiTaskTrainer::load(path, c10::Device(device), nullptr, to_python_logging);
          },
          py::arg("path"), py::arg("device") = "cpu")
      .def_property_readonly("options_json",
                             [](const MultiTaskTrainer& t) { return packtrain::runtime::to_json(t.options()); })
      .def_property_readonly("epochs_done", &MultiTaskTrainer::epochs_done)
      .def_property_readonly("steps_done", &MultiTaskTrainer::steps_done);
  // Resuming a run of `packtrain multitask train` (runtime/trainers/multitask/multitask_resume.h):
  // its sentence files reloaded and checked against their fingerprints, the trainer
  // ready for train_epoch() until the run's (or `epochs`) total. Returns the trainer,
  // that total and the training sentences cut to the longest bucket.
  m.def(
      "resume_multitask",
      [](const std::string& path, const std::string& device, int64_t epochs) {
        packtrain::runtime::ResumedMultiTask run = without_gil([&] {
          return packtrain::runtime::resume_multitask(
              packtrain::runtime::MultiTaskCheckpoint::read(path),
              {.epochs = epochs, .device = c10::Device(device), .log = to_python_logging, .note = to_python_logging});
        });
        return py::make_tuple(py::cast(std::move(run.trainer)), run.files.epochs, run.truncated);
      },
      py::arg("path"), py::arg("device") = "cpu", py::arg("epochs") = 0);
}

// What a trainer reports: its options, progress, losses and members.
// Greedy decoding of `model` through its KV cache (decode_step, one token at a time,
// as `multitask generate` runs it): the prompt's ids in, the new ids out.
std::vector<int64_t> greedy_decode(const packtrain::ensemble::PackedTransformer& t, const std::vector<int64_t>& prompt,
                                   int64_t new_tokens) {
  const int64_t n = static_cast<int64_t>(prompt.size()), V = t.options().vocab();
  if (n < 1 || new_tokens < 1 || n + new_tokens > t.options().max_length()) {
    throw py::value_error("greedy: a prompt of >= 1 tokens and >= 1 new tokens, " +
                          std::to_string(t.options().max_length()) + " positions in all");
  }
  py::gil_scoped_release release;
  at::NoGradGuard no_grad;
  const auto longs = at::TensorOptions().dtype(at::kLong).device(t.parameters().flat().device());
  packtrain::ensemble::KvCache cache = t.make_cache(1);
  const at::Tensor position = at::zeros({1}, longs);
  std::vector<int64_t> out;
  int64_t token = prompt.front();
  for (int64_t i = 0; i + 1 < n + new_tokens; ++i) {
    position.fill_(i);
    const at::Tensor hidden = t.decode_step(at::full({1, 1}, token, longs), position, cache);
    if (i + 1 < n) {
      token = prompt[static_cast<size_t>(i + 1)];
      continue;
    }
    token = t.lm_logits(hidden.unsqueeze(2)).view({V}).argmax().item<int64_t>();
    out.push_back(token);
  }
  return out;
}

// A Hugging Face GPT-2 checkpoint folder loaded as the multi-task trunk (one member,
// runtime/trainers/multitask/pretrained_trunk.h): its LM logits for token ids, the
// next-token loss and its gradients under transformers' names, and saving it back.
// What the tests compare against transformers itself.
void add_pretrained(py::module_& m) {
  using packtrain::ensemble::PackedTransformer;
  const auto named_dict = [](const std::vector<std::pair<std::string, at::Tensor>>& named) {
    py::dict out;
    for (const auto& [name, value] : named) out[py::str(name)] = value;
    return out;
  };
  py::class_<PackedTransformer>(m, "PretrainedTrunk")
      // members > 1 with lora_rank r > 0: K adapters on the one loaded trunk.
      .def(py::init([](const std::string& dir, int64_t classes, uint64_t seed, const std::string& device,
                       int64_t members, int64_t lora_rank, double lora_alpha) {
             auto model = std::make_unique<PackedTransformer>(packtrain::runtime::pretrained_trunk_options(dir, classes)
                                                                  .seed(seed)
                                                                  .device(c10::Device(device))
                                                                  .members(members)
                                                                  .lora_rank(lora_rank)
                                                                  .lora_alpha(lora_alpha));
             packtrain::runtime::load_pretrained_weights(dir, *model);
             return model;
           }),
           py::arg("dir"), py::arg("classes") = 2, py::arg("seed") = 0, py::arg("device") = "cpu",
           py::arg("members") = 1, py::arg("lora_rank") = 0, py::arg("lora_alpha") = 16.0)
      // The live (K, ...) tensor of a parameter the members train (the adapters' with
      // lora_rank): writable in place under torch.no_grad().
      .def(
          "parameter", [](PackedTransformer& t, const std::string& name) { return t.parameters().at(name); },
          py::arg("name"))
      .def_property_readonly("options",
                             [](const PackedTransformer& t) {
                               const auto& o = t.options();
                               py::dict d;
                               d["vocab"] = o.vocab();
                               d["width"] = o.width();
                               d["layers"] = o.layers();
                               d["heads"] = o.heads();
                               d["mlp_ratio"] = o.mlp_ratio();
                               d["max_length"] = o.max_length();
                               d["classes"] = o.classes();
                               d["gelu_tanh"] = o.gelu_tanh();
                               d["norm_eps"] = o.norm_eps();
                               return d;
                             })
      // tokens (B, T) int64 -> next-token logits (B, T, V)
      .def(
          "lm_logits",
          [](const PackedTransformer& t, const at::Tensor& tokens, int64_t member) {
            at::NoGradGuard no_grad;
            return t.lm_logits(t.trunk(tokens))[member];
          },
          py::arg("tokens"), py::arg("member") = 0, py::call_guard<py::gil_scoped_release>())
      // The mean cross-entropy of each next token (positions 1..T-1) and its gradients
      // (named=False: the loss only, the gradients left in the model, as a timed step).
      .def(
          "lm_loss_and_gradients",
          [named_dict](PackedTransformer& t, const at::Tensor& tokens, bool named) {
            t.parameters().zero_grad();
            at::Tensor loss;
            {
              py::gil_scoped_release release;
              const at::Tensor logits = t.lm_logits(t.trunk(tokens))[0];
              // Labels shifted, the last position ignored (as transformers does): no slice of the logits.
              const int64_t B = tokens.size(0), T = tokens.size(1), V = logits.size(-1);
              const at::Tensor targets =
                  at::cat({tokens.narrow(1, 1, T - 1), at::full({B, 1}, -100, tokens.options())}, 1);
              loss =
                  at::cross_entropy_loss(logits.reshape({-1, V}), targets.reshape({-1}), {}, at::Reduction::Mean, -100);
              loss.backward();
            }
            if (!named) return py::make_tuple(loss.item<double>(), py::none());
            return py::make_tuple(loss.item<double>(),
                                  named_dict(packtrain::runtime::pretrained_named_tensors(t, 0, true)));
          },
          py::arg("tokens"), py::arg("named") = true)
      // Greedy decoding through the KV cache, as `multitask generate` runs it.
      .def("greedy", &greedy_decode, py::arg("prompt"), py::arg("new_tokens"))
      .def("named_tensors",
           [named_dict](const PackedTransformer& t) {
             return named_dict(packtrain::runtime::pretrained_named_tensors(t, 0, false));
           })
      .def(
          "save",
          [](const PackedTransformer& t, const std::string& dir) { packtrain::runtime::save_pretrained_trunk(t, dir); },
          py::arg("dir"), py::call_guard<py::gil_scoped_release>());
}

// GPT-2's byte-level BPE from a tokenizer folder (runtime/data/bpe_tokenizer.h), and
// a checkpoint folder's tokenizer as the multi-task model reads text with it
// (runtime/data/text_tokenizer.h: Llama's SentencePiece or GPT-2's BPE, with the
// model's BOS/EOS convention).
void add_tokenizers(py::module_& m) {
  using packtrain::runtime::BpeTokenizer;
  py::class_<BpeTokenizer>(m, "BpeTokenizer")
      .def(py::init([](const std::string& dir) { return BpeTokenizer::from_folder(dir); }), py::arg("dir"))
      .def("encode", &BpeTokenizer::encode, py::arg("text"), py::call_guard<py::gil_scoped_release>())
      .def(
          "decode", [](const BpeTokenizer& t, const std::vector<int64_t>& ids) { return py::bytes(t.decode(ids)); },
          py::arg("ids"))
      .def_property_readonly("vocab_size", &BpeTokenizer::vocab_size)
      .def("token_id", &BpeTokenizer::token_id, py::arg("token"));
  using packtrain::runtime::TextTokenizer;
  py::class_<TextTokenizer>(m, "CheckpointTokenizer")
      .def(py::init([](const std::string& dir) { return packtrain::runtime::make_checkpoint_text_tokenizer(dir); }),
           py::arg("dir"))
      .def(
          "encode",
          [](const TextTokenizer& t, const std::string& text, int64_t max_tokens) {
            return t.encode(text, max_tokens, nullptr);
          },
          py::arg("text"), py::arg("max_tokens"))
      .def("encode_prompt", &TextTokenizer::encode_prompt, py::arg("text"), py::arg("max_tokens"))
      .def(
          "decode", [](const TextTokenizer& t, const std::vector<int64_t>& ids) { return py::bytes(t.decode(ids)); },
          py::arg("ids"))
      .def_property_readonly("pad", &TextTokenizer::pad)
      .def_property_readonly("end", &TextTokenizer::end)
      .def_property_readonly("vocab", &TextTokenizer::vocab);
}

void add_trainer_state(py::class_<EnsembleTrainer>& trainer) {
  trainer
      .def_property_readonly("options_json",
                             [](const EnsembleTrainer& t) { return packtrain::runtime::to_json(t.options()); })
      .def_property_readonly("prepared", &EnsembleTrainer::prepared)
      // Identifies the prepared steps (and so their captured graphs): unchanged when
      // prepare() on data of the same shapes kept them.
      .def_property_readonly(
          "steps_id",
          [](EnsembleTrainer& t) { return t.prepared() ? reinterpret_cast<uintptr_t>(&t.steps()) : uintptr_t{0}; })
      .def_property_readonly("variance_scale", &EnsembleTrainer::variance_scale)
      .def_property_readonly("epoch", &EnsembleTrainer::epoch)
      .def_property_readonly("steps_taken", &EnsembleTrainer::steps_taken)
      .def_property_readonly("patience", &EnsembleTrainer::patience)
      .def_property_readonly("in_features", &EnsembleTrainer::in_features)
      .def_property_readonly("classes", &EnsembleTrainer::classes)
      .def_property_readonly("train_loss_history", &EnsembleTrainer::train_loss_history)
      .def_property_readonly("val_loss_history", &EnsembleTrainer::val_loss_history)
      .def_property_readonly("member_status", [](const EnsembleTrainer& t) {
        std::vector<std::string> out;
        for (const auto& s : t.member_states()) out.emplace_back(packtrain::runtime::to_string(s.status));
        return out;
      });
}

// The ensemble trainer (runtime::EnsembleTrainer) behind the estimators.
void add_trainer(py::module_& m) {
  py::class_<EnsembleTrainer> trainer(m, "Trainer");
  trainer
      .def(py::init([](const std::string& options_json) {
             return std::make_unique<EnsembleTrainer>(options_from(options_json));
           }),
           py::arg("options_json"))
      .def(
          "prepare",
          [](EnsembleTrainer& t, const at::Tensor& x, const at::Tensor& y, const std::optional<at::Tensor>& val_x,
             const std::optional<at::Tensor>& val_y) {
            // Freed CPU memory stays in the process for the run, as `packtrain train`
            // keeps it (runtime/measure/cpu_memory.h: CNN steps 1.5x faster).
            if (t.options().device().is_cpu()) packtrain::runtime::retain_freed_cpu_memory();
            t.prepare(x, y, val_x.value_or(at::Tensor()), val_y.value_or(at::Tensor()));
          },
          py::arg("x"), py::arg("y"), py::arg("val_x") = py::none(), py::arg("val_y") = py::none(),
          py::call_guard<py::gil_scoped_release>())
      .def("train", &train, py::arg("callback") = py::none())
      .def(
          "predict",
          [](const EnsembleTrainer& t, const at::Tensor& x) {
            return prediction_dict(without_gil([&] { return t.predict(x); }));
          },
          py::arg("x"))
      .def(
          "evaluate",
          [](const EnsembleTrainer& t, const at::Tensor& x, const at::Tensor& y, const std::vector<double>& levels) {
            const packtrain::runtime::EnsembleMetrics e = without_gil([&] {
              return packtrain::runtime::ensemble_metrics(t.predict(x), y, t.options().head(), t.classes(), levels);
            });
            py::list members;
            for (const auto& mm : e.members) members.append(metrics_dict(mm));
            py::dict d;
            d["members"] = members;
            d["ensemble"] = metrics_dict(e.ensemble);
            d["calibration"] = t.options().head() == packtrain::runtime::Head::kClassification
                                   ? classification_calibration_dict(e.classification)
                                   : regression_calibration_dict(e.regression);
            return d;
          },
          py::arg("x"), py::arg("y"), py::arg("levels") = packtrain::runtime::kDefaultIntervalLevels)
      // A sweep's configurations, each scored as its own ensemble on the validation
      // rows (before any is deselected), as `train` reports them; with select_best
      // only the one with the lowest validation loss is kept (`train --select best`).
      .def(
          "sweep",
          [](EnsembleTrainer& t, const std::optional<at::Tensor>& val_x, const std::optional<at::Tensor>& val_y,
             bool select_best) {
            const std::vector<packtrain::runtime::ConfigurationReport> reports = without_gil([&] {
              return packtrain::runtime::report_configurations(
                  t, val_x.value_or(at::Tensor()), val_y.value_or(at::Tensor()), at::Tensor(), at::Tensor());
            });
            py::list out;
            for (const auto& r : reports) {
              py::dict d;
              d["hidden"] = r.configuration.hidden;
              if (!r.configuration.channels.empty()) d["channels"] = r.configuration.channels;
              d["lr"] = r.configuration.lr;
              d["weight_decay"] = r.configuration.weight_decay;
              d["dropout"] = r.configuration.dropout;
              d["first_member"] = r.configuration.first_member;
              d["members"] = r.configuration.members;
              d["usable"] = r.usable;
              d["val_loss"] = r.val_loss;
              d["selected"] = !select_best;
              out.append(d);
            }
            if (select_best) {
              const size_t best = packtrain::runtime::best_configuration(reports);  // UserError: ValueError
              t.keep_members(reports[best].configuration.first_member, reports[best].configuration.members);
              py::dict chosen = out[best];
              chosen["selected"] = true;
            }
            return out;
          },
          py::arg("val_x") = py::none(), py::arg("val_y") = py::none(), py::arg("select_best") = false)
      .def(
          "reinitialize", [](EnsembleTrainer& t, uint64_t seed) { t.reinitialize(seed); }, py::arg("seed"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "save",
          [](const EnsembleTrainer& t, const std::string& path, const std::vector<std::string>& feature_names,
             const std::string& target_name) { t.save(path, run_description(feature_names, target_name)); },
          py::arg("path"), py::arg("feature_names"), py::arg("target_name"), py::call_guard<py::gil_scoped_release>());
  add_trainer_state(trainer);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "packtrain's C++ runtime (use the estimators in packtrain, not this module)";
  m.attr("torch_version") = TORCH_VERSION;  // the torch this module was built against
  // Bad input (packtrain::UserError: DataError, a bad sweep, acquisition or
  // generation option) is the caller's to fix: ValueError, as for Python's own checks.
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const packtrain::UserError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  add_options_and_data(m);
  add_uncertainty(m);
  add_calibration_and_acquisition(m);
  add_checkpoints(m);
  add_resume(m);
  add_multitask(m);
  add_pretrained(m);
  add_tokenizers(m);
  add_trainer(m);
}
