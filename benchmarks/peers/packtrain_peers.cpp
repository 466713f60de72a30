// packtrain_peers: packtrain's side of the peers comparison (benchmarks/peers/).
//
//   reference  writes one packtrain_bench workload for the Python peers to load —
//              the initial packed weights (seed 1), the fixed batch (seed 7), the
//              hyperparameters — and packtrain's per-member loss at every step of a
//              short training from them, through runtime::EnsembleSteps (the
//              trainer's step: captured on a GPU, eager on CPU). Every peer must
//              reproduce that loss curve before its speed is reported.
//              --model cnn: the CNN workload instead — PackedCNN, packtrain's default
//              cnn shape (conv blocks of 32 and 64 channels, kernel 3 "same", ReLU,
//              max-pool 2, flatten, a 64-wide ReLU hidden layer, 10 logits) on the
//              digits network's input 1x8x8 or MNIST-1D's 1x40 (--network), cross-
//              entropy against class indices; with --time-repeats R it also times
//              that trainer's step (median member-steps/s of R runs of at least
//              --min-time seconds each), packtrain's figure in the CNN rows.
//   plot       draws member-steps/s against members, log-log, one line per system,
//              for one shape (depth, hidden; or --network for the CNN rows) from the
//              harness's results JSON (runtime/svg_plot).
//
// Files: DIR/manifest.json names each tensor's shape and raw file (float32,
// little-endian, C order): x (B, 8), y (B, 1), linear<i>.weight (K, I, O),
// linear<i>.bias (K, 1, O). CNN: x (B, I) (I = C*H*W or C*L, C order), y (B) class
// indices (exact in float32), and the pack's parameters in the order the standalone
// member builds them (manifest "parameters"): conv<b>.weight (K, Cout, Cin, k[, k]),
// conv<b>.bias (K, Cout), fc<l>.weight (K, I, O), fc<l>.bias (K, 1, O), output.weight,
// output.bias.
#include "benchmarks/bench_workload.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_cnn.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/io/svg_plot.h"
#include "packtrain/runtime/measure/cpu_memory.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_steps.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace packtrain;

struct ReferenceArgs {
  int64_t members = 8, hidden = 64, depth = 1, batch = 128, steps = 20;
  std::string device = "cpu";
  std::string out;
  std::string model = "mlp";
  std::string network = "digits";        // cnn: digits (1x8x8) or mnist1d (1x40)
  int64_t time_repeats = 0;              // cnn: time the trainer's step this many runs (0: not)
  double min_time = 0.3;                 // seconds per timed run, at least
  std::vector<uint64_t> order_seeds{0};  // cnn: the loss curve under each of these batch-row orders
  std::string precision = "fp32";        // the pack's arithmetic (ensemble/precision.h)
};

// The CNN rows' networks: packtrain's default cnn shape on each bundled image set's input.
constexpr int64_t kCnnClasses = 10;

std::vector<int64_t> cnn_input_shape(const std::string& network) {
  if (network == "digits") return {1, 8, 8};
  if (network == "mnist1d") return {1, 40};
  throw std::invalid_argument("--network must be digits or mnist1d, got " + network);
}

ensemble::PackedCNNOptions cnn_options(const ReferenceArgs& a, c10::Device device) {
  return ensemble::PackedCNNOptions(cnn_input_shape(a.network), kCnnClasses)
      .members(a.members)
      .channels(ensemble::kDefaultCnnChannels)
      .kernel_size(3)
      .hidden(64)
      .depth(1)
      .seed(1)
      .device(device);
}

void synchronize(c10::Device device) {
  if (device.is_cpu()) return;
  c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index() < 0 ? 0 : device.index());
}

json write_tensor(const fs::path& dir, const std::string& name, const at::Tensor& t) {
  const at::Tensor host = t.detach().to(at::kCPU, at::kFloat).contiguous();
  const std::string file = name + ".f32";
  runtime::write_file_atomically(dir / file,
                                 std::string_view(static_cast<const char*>(host.data_ptr()), host.nbytes()));
  return {{"shape", host.sizes().vec()}, {"file", file}};
}

int reference_cnn(const ReferenceArgs& a);

json adamw_json(const ensemble::AdamOptions& adam) {
  return {{"lr", adam.lr()},
          {"beta1", adam.beta1()},
          {"beta2", adam.beta2()},
          {"eps", adam.eps()},
          {"weight_decay", adam.weight_decay()}};
}

// Runs `count` steps of one epoch and returns each step's per-member mean loss.
json loss_curve(runtime::EnsembleSteps& steps, int64_t count) {
  steps.batcher().start_epoch();
  steps.run_steps(count);
  json losses = json::array();
  for (const runtime::LossReport& r : steps.wait_losses()) {
    const at::Tensor mean = r.mean.to(at::kDouble).contiguous();
    losses.push_back(std::vector<double>(mean.data_ptr<double>(), mean.data_ptr<double>() + mean.numel()));
  }
  return losses;
}

int reference(const ReferenceArgs& a) {
  if (a.model == "cnn") return reference_cnn(a);
  const c10::Device device(a.device);
  const fs::path dir(a.out);
  fs::create_directories(dir);
  ensemble::PackedMLP model(benchmarks::workload_options(a.members, a.hidden, a.depth, device));
  model.set_precision(ensemble::parse_precision(a.precision));
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
  const json losses = loss_curve(steps, a.steps);
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
                         {"adamw", adamw_json(adam)},
                         {"device", device.str()},
                         {"precision", a.precision},
                         {"path", captured ? "EnsembleSteps, captured (CUDA graph)" : "EnsembleSteps, eager"},
                         {"tensors", tensors},
                         {"losses", losses}};
  runtime::write_file_atomically(dir / "manifest.json", manifest.dump(1));
  std::printf("%s: %zu steps of %lld members, %s\n", (dir / "manifest.json").c_str(), losses.size(),
              static_cast<long long>(a.members), manifest["path"].get<std::string>().c_str());
  return 0;
}

// The trainer's step over the fixed batch, timed: one warm step, n steps per run so a
// run takes at least min_time, the median of `repeats` runs (as peers.py times a peer).
json time_steps(runtime::EnsembleSteps& steps, int64_t members, int64_t repeats, double min_time, c10::Device device) {
  using clock = std::chrono::steady_clock;
  const auto run = [&](int64_t n) {
    const auto t0 = clock::now();
    steps.run_steps(n);
    steps.wait_losses();
    synchronize(device);
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  run(1);
  const double one = run(1);
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(min_time / std::max(one, 1e-9))));
  std::vector<double> rates;
  for (int64_t r = 0; r < repeats; ++r) rates.push_back(static_cast<double>(n * members) / run(n));
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  const size_t m = sorted.size();
  const double median = m % 2 ? sorted[m / 2] : (sorted[m / 2 - 1] + sorted[m / 2]) / 2;
  return {{"member_steps_per_s", median},
          {"runs", rates},
          {"steps_per_run", n},
          {"seconds_per_step", static_cast<double>(members) / median}};
}

int reference_cnn(const ReferenceArgs& a) {
  const c10::Device device(a.device);
  if (device.is_cpu()) runtime::retain_freed_cpu_memory();  // as `packtrain train` does
  const fs::path dir(a.out);
  fs::create_directories(dir);
  const ensemble::PackedCNNOptions options = cnn_options(a, device);
  ensemble::PackedCNN model(options);
  model.set_precision(ensemble::parse_precision(a.precision));
  const ensemble::AdamOptions adam = ensemble::adamw_options().lr(benchmarks::kWorkloadLr);
  ensemble::PackedAdam optimizer(model.parameters(), adam);
  // The fixed batch (seed 7): standard normal inputs of the network's shape and
  // uniform class indices (a step's time does not depend on the values).
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor x = at::randn({a.batch, options.in_features()}, gen).to(device);
  const at::Tensor y = at::randint(kCnnClasses, {a.batch}, gen, at::kLong).to(device);

  json tensors, names = json::array();
  tensors["x"] = write_tensor(dir, "x", x);
  tensors["y"] = write_tensor(dir, "y", y);
  const ensemble::PackedParameters& params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params.spec(i).name;
    tensors[name] = write_tensor(dir, name, params[i]);
    names.push_back(name);
  }
  // As for the MLP: the data set is the batch, every step trains on all of it.
  const auto steps_options = [&] {
    return runtime::EnsembleStepsOptions()
        .batch_size(a.batch)
        .loss(ensemble::LossKind::kCrossEntropy)
        .capture(graphs::CaptureOptions().log(graphs::log_to_stderr));
  };
  // The loss curve from the initial weights under each batch-row order (the trainer's
  // step sums the rows in the order it draws; each curve is as much packtrain's as the
  // next): "losses" is the first, "losses_by_order" all of them.
  const at::Tensor initial = model.parameters().flat().clone();
  json curves = json::array();
  bool captured = false;
  for (const uint64_t seed : a.order_seeds) {
    {
      at::NoGradGuard no_grad;
      model.parameters().flat().copy_(initial);
    }
    ensemble::PackedAdam fresh(model.parameters(), adam);
    runtime::EnsembleSteps steps(model, fresh, {x, y}, steps_options().unroll(1).readback_steps(1).seed(seed));
    curves.push_back(loss_curve(steps, a.steps));
    captured = steps.unrolled_step().mode() == graphs::StepMode::kGraph;
  }
  const json& losses = curves.front();
  json timing;
  if (a.time_repeats > 0) {
    // The trainer's step as the trainer runs it (its default unroll and readback),
    // continuing from the trained weights.
    runtime::EnsembleSteps steps(model, optimizer, {x, y}, steps_options());
    steps.batcher().start_epoch();
    timing = time_steps(steps, a.members, a.time_repeats, a.min_time, device);
    timing["unroll"] = steps.options().unroll();
    timing["path"] = steps.unrolled_step().mode() == graphs::StepMode::kGraph ? "EnsembleSteps, captured (CUDA graph)"
                                                                              : "EnsembleSteps, eager";
  }

  json shape = options.input_shape();
  json manifest = {{"workload",
                    {{"model", "cnn"},
                     {"network", a.network},
                     {"members", a.members},
                     {"batch", a.batch},
                     {"input_shape", shape},
                     {"classes", kCnnClasses},
                     {"channels", options.channels()},
                     {"kernel_size", options.kernel_size()},
                     {"padding", "same"},
                     {"pool", 2},
                     {"hidden", options.hidden()},
                     {"depth", options.depth()},
                     {"activation", "relu"},
                     {"loss", "cross_entropy"}}},
                   {"adamw", adamw_json(adam)},
                   {"device", device.str()},
                   {"precision", a.precision},
                   {"path", captured ? "EnsembleSteps, captured (CUDA graph)" : "EnsembleSteps, eager"},
                   {"parameters", names},
                   {"tensors", tensors},
                   {"losses", losses}};
  if (curves.size() > 1) {
    manifest["losses_by_order"] = curves;
    manifest["order_seeds"] = a.order_seeds;
  }
  if (!timing.is_null()) manifest["timing"] = timing;
  runtime::write_file_atomically(dir / "manifest.json", manifest.dump(1));
  std::printf("%s: %zu steps of %lld %s cnn members, %s%s\n", (dir / "manifest.json").c_str(), losses.size(),
              static_cast<long long>(a.members), a.network.c_str(), manifest["path"].get<std::string>().c_str(),
              timing.is_null()
                  ? ""
                  : fmt::format("; {:.0f} member-steps/s", timing["member_steps_per_s"].get<double>()).c_str());
  return 0;
}

// results.json (benchmarks/peers/run_peers.py): {"device": ..., "rows": [{"workload":
// {"members", "hidden", "depth", ...}, "systems": {name: {"member_steps_per_s": x | null}}}]}.
int plot(const std::string& results_path, const std::string& out, int64_t hidden, int64_t depth,
         const std::string& network) {
  std::ifstream in(results_path);
  if (!in) throw std::runtime_error("cannot read " + results_path);
  const json results = json::parse(in);
  std::map<std::string, runtime::PlotSeries> by_system;
  for (const json& row : results.at("rows")) {
    const json& workload = row.at("workload");
    if (!network.empty()) {
      if (workload.value("network", std::string()) != network) continue;
    } else if (workload.value("model", std::string("mlp")) != "mlp" || workload.at("hidden").get<int64_t>() != hidden ||
               workload.value("depth", int64_t{1}) != depth) {
      continue;
    }
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
  const std::string where = results.value("device_name", results.value("device", std::string("?")));
  options.title = network.empty()
                      ? fmt::format("Member-steps/s vs members (depth {}, hidden {}, {})", depth, hidden, where)
                      : fmt::format("Member-steps/s vs members (cnn, {} network, {})", network, where);
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
  reference_cmd->add_option("--precision", ref.precision, "fp32 or bf16-mixed (the pack's arithmetic)")
      ->check(CLI::IsMember({"fp32", "bf16-mixed"}));
  reference_cmd->add_option("--out", ref.out, "directory to write")->required();
  reference_cmd->add_option("--model", ref.model, "mlp (the regression MLP) or cnn (PackedCNN, cross-entropy)")
      ->check(CLI::IsMember({"mlp", "cnn"}))
      ->capture_default_str();
  reference_cmd->add_option("--network", ref.network, "cnn: digits (input 1x8x8) or mnist1d (1x40)")
      ->check(CLI::IsMember({"digits", "mnist1d"}))
      ->capture_default_str();
  reference_cmd->add_option("--time-repeats", ref.time_repeats, "cnn: also time the trainer's step, this many runs")
      ->check(CLI::NonNegativeNumber);
  reference_cmd->add_option("--min-time", ref.min_time, "cnn: seconds per timed run, at least")
      ->check(CLI::PositiveNumber);
  reference_cmd->add_option("--order-seeds", ref.order_seeds, "cnn: record the loss curve under these batch orders")
      ->delimiter(',');
  std::string results, svg;
  int64_t hidden = 64, depth = 2;
  auto* plot_cmd = app.add_subcommand("plot", "Draw member-steps/s vs members (log-log) from results.json");
  plot_cmd->add_option("--results", results, "the harness's results.json")->required()->check(CLI::ExistingFile);
  plot_cmd->add_option("--out", svg, "SVG file to write")->required();
  plot_cmd->add_option("--hidden", hidden, "the workloads of this hidden width")->capture_default_str();
  plot_cmd->add_option("--depth", depth, "the workloads of this depth (hidden layers)")->capture_default_str();
  std::string network;
  plot_cmd->add_option("--network", network, "the CNN rows of this network (digits, mnist1d) instead");
  CLI11_PARSE(app, argc, argv);
  try {
    if (*reference_cmd) return reference(ref);
    return plot(results, svg, hidden, depth, network);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "packtrain_peers: %s\n", e.what());
    return 1;
  }
}
