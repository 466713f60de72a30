// packtrain._core: the Python binding of runtime::EnsembleTrainer. A thin layer:
// no training logic here — options go through the trainer's own JSON (so the
// defaults are the CLI's), tensors cross without copies through torch's pybind11
// casters, the GIL is released while C++ trains, and the epoch callback (which
// holds it again) is where Ctrl-C is seen, as the CLI sees it between epochs.
#include "packtrain/runtime/data/data_split.h"
#include "packtrain/runtime/data/run_data.h"
#include "packtrain/runtime/trainers/ensemble_trainer.h"
#include "packtrain/runtime/trainers/loaded_ensemble.h"
#include "packtrain/runtime/trainers/multitask_trainer.h"
#include "packtrain/runtime/data/labelled_texts.h"

#include <ATen/ATen.h>
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
// options_from_json, values by validate()).
packtrain::runtime::EnsembleTrainerOptions options_from(const std::string& overrides_json) {
  nlohmann::json merged = nlohmann::json::parse(packtrain::runtime::to_json(packtrain::runtime::EnsembleTrainerOptions()));
  const nlohmann::json overrides = nlohmann::json::parse(overrides_json);
  for (const auto& [key, value] : overrides.items()) {
    if (!merged.contains(key)) throw py::value_error("unknown trainer option '" + key + "'");
    merged[key] = value;
  }
  packtrain::runtime::EnsembleTrainerOptions options = packtrain::runtime::options_from_json(merged.dump());
  options.log(to_python_logging);
  options.validate();
  return options;
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

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "packtrain's C++ runtime (use the estimators in packtrain, not this module)";
  m.attr("torch_version") = TORCH_VERSION;  // the torch this module was built against
  m.def("default_options", [] { return packtrain::runtime::to_json(packtrain::runtime::EnsembleTrainerOptions()); },
        "The trainer's default options as JSON (the CLI's defaults).");
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
      .def("predict", [](const LoadedEnsemble& e, const at::Tensor& x) {
        return prediction_dict(without_gil([&] { return e.predict(x); }));
      }, py::arg("x"))
      .def_property_readonly("members", &LoadedEnsemble::members)
      .def_property_readonly("shards", &LoadedEnsemble::shards)
      .def_property_readonly("options_json", [](const LoadedEnsemble& e) { return packtrain::runtime::to_json(e.first().options()); })
      .def_property_readonly("in_features", [](const LoadedEnsemble& e) { return e.first().in_features(); })
      .def_property_readonly("classes", [](const LoadedEnsemble& e) { return e.first().classes(); });

  // The multi-task transformer (runtime::MultiTaskTrainer): options as its JSON.
  m.def("default_multitask_options", [] { return packtrain::runtime::to_json(packtrain::runtime::MultiTaskTrainerOptions()); });
  py::class_<MultiTaskTrainer>(m, "MultiTask")
      .def(py::init([](const std::string& options_json, const std::string& device) {
             packtrain::runtime::MultiTaskTrainerOptions o = packtrain::runtime::multitask_options_from_json(options_json);
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
          "train_epoch",
          [](MultiTaskTrainer& t) {
            const packtrain::runtime::MultiTaskEpochReport r = without_gil([&] { return t.train_epoch(); });
            py::dict d;
            d["epoch"] = r.epoch;
            d["steps"] = r.steps;
            d["classification_loss"] = r.classification_loss;
            d["lm_loss"] = r.lm_loss;
            d["seconds"] = r.seconds;
            return d;
          })
      .def(
          "evaluate",
          [](MultiTaskTrainer& t, const std::vector<std::string>& texts, const std::vector<int64_t>& labels) {
            const auto data = labelled_texts(texts, labels);
            return task_metrics_dict(without_gil([&] { return t.evaluate(data); }));
          },
          py::arg("texts"), py::arg("labels"))
      .def("score", &MultiTaskTrainer::score, py::arg("texts"), py::call_guard<py::gil_scoped_release>())
      .def(
          "generate",
          [](MultiTaskTrainer& t, const std::string& prompt, int64_t max_new_tokens, double temperature, int64_t top_k,
             uint64_t seed) {
            packtrain::runtime::GenerateOptions g;
            g.max_new_tokens = max_new_tokens;
            g.temperature = temperature;
            g.top_k = top_k;
            g.seed = seed;
            return t.generate(prompt, g);
          },
          py::arg("prompt"), py::arg("max_new_tokens"), py::arg("temperature"), py::arg("top_k"), py::arg("seed"),
          py::call_guard<py::gil_scoped_release>())
      .def("save", [](const MultiTaskTrainer& t, const std::string& path) { t.save(path); }, py::arg("path"),
           py::call_guard<py::gil_scoped_release>())
      .def_static(
          "load",
          [](const std::string& path, const std::string& device) {
            return MultiTaskTrainer::load(path, c10::Device(device), nullptr, to_python_logging);
          },
          py::arg("path"), py::arg("device") = "cpu")
      .def_property_readonly("options_json", [](const MultiTaskTrainer& t) { return packtrain::runtime::to_json(t.options()); })
      .def_property_readonly("epochs_done", &MultiTaskTrainer::epochs_done)
      .def_property_readonly("steps_done", &MultiTaskTrainer::steps_done);

  py::class_<EnsembleTrainer>(m, "Trainer")
      .def(py::init([](const std::string& options_json) { return std::make_unique<EnsembleTrainer>(options_from(options_json)); }),
           py::arg("options_json"))
      .def(
          "prepare",
          [](EnsembleTrainer& t, const at::Tensor& x, const at::Tensor& y, const std::optional<at::Tensor>& val_x,
             const std::optional<at::Tensor>& val_y) {
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
          [](const EnsembleTrainer& t, const at::Tensor& x, const at::Tensor& y) {
            const packtrain::runtime::EnsembleMetrics e = without_gil([&] { return t.evaluate(x, y); });
            py::list members;
            for (const auto& mm : e.members) members.append(metrics_dict(mm));
            py::dict d;
            d["members"] = members;
            d["ensemble"] = metrics_dict(e.ensemble);
            return d;
          },
          py::arg("x"), py::arg("y"))
      .def(
          "reinitialize",
          [](EnsembleTrainer& t, uint64_t seed) { t.reinitialize(seed); }, py::arg("seed"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "save",
          [](const EnsembleTrainer& t, const std::string& path, const std::vector<std::string>& feature_names,
             const std::string& target_name) {
            t.save(path, run_description(feature_names, target_name));
          },
          py::arg("path"), py::arg("feature_names"), py::arg("target_name"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("options_json", [](const EnsembleTrainer& t) { return packtrain::runtime::to_json(t.options()); })
      .def_property_readonly("prepared", &EnsembleTrainer::prepared)
      // Identifies the prepared steps (and so their captured graphs): unchanged when
      // prepare() on data of the same shapes kept them.
      .def_property_readonly("steps_id", [](EnsembleTrainer& t) {
        return t.prepared() ? reinterpret_cast<uintptr_t>(&t.steps()) : uintptr_t{0};
      })
      .def_property_readonly("epoch", &EnsembleTrainer::epoch)
      .def_property_readonly("steps_taken", &EnsembleTrainer::steps_taken)
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
