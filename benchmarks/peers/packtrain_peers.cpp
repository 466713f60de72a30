// packtrain_peers: packtrain's side of the peers comparison (benchmarks/peers/).
//
//   reference  writes one packtrain_bench workload for the Python peers to load —
//              the initial packed weights (seed 1), the fixed batch (seed 7), the
//              hyperparameters — and packtrain's per-member loss at every step of a
//              short training from them, through runtime::EnsembleSteps (the
//              trainer's step: captured on a GPU, eager on CPU). Every peer must
//              reproduce that loss curve before its speed is reported.
//   plot       draws member-steps/s against members, log-log, one line per system,
//              for one shape (depth, hidden) from the harness's results JSON
//              (runtime/svg_plot).
//
// Files: DIR/manifest.json names each tensor's shape and raw file (float32,
// little-endian, C order): x (B, 8), y (B, 1), linear<i>.weight (K, I, O),
// linear<i>.bias (K, 1, O).
#include "benchmarks/bench_workload.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/io/svg_plot.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_steps.h"

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace packtrain;

struct ReferenceArgs {
  int64_t members = 8, hidden = 64, depth = 1, batch = 128, steps = 20;
  std::string device = "cpu";
  std::string out;
};

json write_tensor(const fs::path& dir, const std::string& name, const at::Tensor& t) {
  const at::Tensor host = t.detach().to(at::kCPU, at::kFloat).contiguous();
  const std::string file = name + ".f32";
  runtime::write_file_atomically(dir / file,
                                 std::string_view(static_cast<const char*>(host.data_ptr()), host.nbytes()));
  return {{"shape", host.sizes().vec()}, {"file", file}};
}

int reference(const ReferenceArgs& a) {
  const c10::Device device(a.device);
  const fs::path dir(a.out);
  fs::create_directories(dir);
  ensemble::PackedMLP model(benchmarks::workload_options(a.members, a.hidden, a.depth, device));
  const ensemble::AdamOptions adam = ensemble::adamw_options().lr(benchmarks::kWorkloadLr);
  ensemble::PackedAdam optimizer(model.parameters(), adam);
  const benchmarks::FixedBatch data = benchmarks::fixed_batch(a.batch, device);

  json tensors;
  tensors["x"] = write_tensor(dir, "x", data.x);
  tensors["y"] = write_tensor(dir, "y", data.y);
  for (size_t i = 0; i < model.linears().size(); ++i) {
    tensors[fmt::format("linear{}.weight", i)] =
        write_tensor(dir, fmt::format("linear{}.weight", i), model.linears()[i].weight());
    tensors[fmt::format("linear{}.bias", i)] =
        write_tensor(dir, fmt::format("linear{}.bias", i), model.linears()[i].bias());
  }

  // The data set is the fixed batch itself (rows == batch), so every step trains on
  // all of it: the peers' fixed-batch step, up to the order of the rows in the mean.
  runtime::EnsembleSteps steps(model, optimizer, {data.x, data.y},
                               runtime::EnsembleStepsOptions()
                                   .batch_size(a.batch)
                                   .loss(ensemble::LossKind::kMSE)
                                   .unroll(1)
                                   .readback_steps(1)
                                   .capture(graphs::CaptureOptions().log(graphs::log_to_stderr)));
  steps.batcher().start_epoch();
  steps.run_steps(a.steps);
  json losses = json::array();
  for (const runtime::LossReport& r : steps.wait_losses()) {
    const at::Tensor mean = r.mean.to(at::kDouble).contiguous();
    losses.push_back(std::vector<double>(mean.data_ptr<double>(), mean.data_ptr<double>() + mean.numel()));
  }
  const bool captured = steps.unrolled_step().mode() == graphs::StepMode::kGraph;

  const json manifest = {{"workload",
                          {{"members", a.members},
                           {"hidden", a.hidden},
                           {"depth", a.depth},
                           {"batch", a.batch},
                           {"inputs", benchmarks::kWorkloadInputs},
                           {"outputs", benchmarks::kWorkloadOutputs},
                           {"activation", "relu"},
                           {"loss", "mse"}}},
                         {"adamw",
                          {{"lr", adam.lr()},
                           {"beta1", adam.beta1()},
                           {"beta2", adam.beta2()},
                           {"eps", adam.eps()},
                           {"weight_decay", adam.weight_decay()}}},
                         {"device", device.str()},
                         {"path", captured ? "EnsembleSteps, captured (CUDA graph)" : "EnsembleSteps, eager"},
                         {"tensors", tensors},
                         {"losses", losses}};
  runtime::write_file_atomically(dir / "manifest.json", manifest.dump(1));
  std::printf("%s: %zu steps of %lld members, %s\n", (dir / "manifest.json").c_str(), losses.size(),
              static_cast<long long>(a.members), manifest["path"].get<std::string>().c_str());
  return 0;
}

// results.json (benchmarks/peers/run_peers.py): {"device": ..., "rows": [{"workload":
// {"members", "hidden", "depth", ...}, "systems": {name: {"member_steps_per_s": x | null}}}]}.
int plot(const std::string& results_path, const std::string& out, int64_t hidden, int64_t depth) {
  std::ifstream in(results_path);
  if (!in) throw std::runtime_error("cannot read " + results_path);
  const json results = json::parse(in);
  std::map<std::string, runtime::PlotSeries> by_system;
  for (const json& row : results.at("rows")) {
    const json& workload = row.at("workload");
    if (workload.at("hidden").get<int64_t>() != hidden || workload.value("depth", int64_t{1}) != depth) continue;
    const double members = row.at("workload").at("members").get<double>();
    for (const auto& [name, system] : row.at("systems").items()) {
      const json& rate = system.at("member_steps_per_s");
      if (rate.is_null()) continue;  // not run or refused by the same-work check
      runtime::PlotSeries& s = by_system[name];
      s.name = name;
      s.x.push_back(members);
      s.y.push_back(rate.get<double>());
    }
  }
  std::vector<runtime::PlotSeries> series;
  if (by_system.count("packtrain")) series.push_back(by_system.at("packtrain"));  // first: the first colour
  for (auto& [name, s] : by_system)
    if (name != "packtrain") series.push_back(s);
  runtime::PlotOptions options;
  options.title = fmt::format("Member-steps/s vs members (depth {}, hidden {}, {})", depth, hidden,
                              results.value("device_name", results.value("device", std::string("?"))));
  options.x_label = "members K";
  options.y_label = "member-steps/s";
  options.log_x = options.log_y = true;
  runtime::write_file_atomically(out, runtime::line_plot_svg(series, options));
  std::printf("%s: %zu systems\n", out.c_str(), series.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"packtrain's side of the PyTorch/JAX peers benchmark (benchmarks/peers/run.sh drives it)"};
  app.require_subcommand(1);
  ReferenceArgs ref;
  auto* reference_cmd =
      app.add_subcommand("reference", "Write a workload's initial weights, batch and packtrain's loss curve");
  reference_cmd->add_option("--members", ref.members, "K")->check(CLI::PositiveNumber);
  reference_cmd->add_option("--hidden", ref.hidden, "hidden width")->check(CLI::PositiveNumber);
  reference_cmd->add_option("--depth", ref.depth, "hidden layers")->check(CLI::PositiveNumber);
  reference_cmd->add_option("--batch", ref.batch, "batch rows")->check(CLI::PositiveNumber);
  reference_cmd->add_option("--steps", ref.steps, "training steps recorded")->check(CLI::PositiveNumber);
  reference_cmd->add_option("--device", ref.device, "cpu or cuda");
  reference_cmd->add_option("--out", ref.out, "directory to write")->required();
  std::string results, svg;
  int64_t hidden = 64, depth = 2;
  auto* plot_cmd = app.add_subcommand("plot", "Draw member-steps/s vs members (log-log) from results.json");
  plot_cmd->add_option("--results", results, "the harness's results.json")->required()->check(CLI::ExistingFile);
  plot_cmd->add_option("--out", svg, "SVG file to write")->required();
  plot_cmd->add_option("--hidden", hidden, "the workloads of this hidden width")->capture_default_str();
  plot_cmd->add_option("--depth", depth, "the workloads of this depth (hidden layers)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (*reference_cmd) return reference(ref);
    return plot(results, svg, hidden, depth);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "packtrain_peers: %s\n", e.what());
    return 1;
  }
}
