// The packtrain command line. `packtrain train` trains a packed deep ensemble on
// a bundled UCI data set (or any data set directory in that format) and prints
// per-member and ensemble test metrics; `packtrain profile` reports how much of a
// training step is kernel launches (profiling/launch_report.h).
//
// Exit status: 0 success, 2 bad input (data, options), 1 internal error.
#include "profiling/trace.h"
#include "runtime/cpu_memory.h"
#include "runtime/data_error.h"
#include "runtime/ensemble_trainer.h"
#include "runtime/launch_profile.h"
#include "runtime/uci_dataset.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace packtrain;

namespace {

// Where the bundled data sets are: $PACKTRAIN_DATA_DIR, else data/ beside the
// build tree's bin/ (build/bin/../../data), else the source tree's data/.
fs::path bundled_data_dir() {
  if (const char* env = std::getenv("PACKTRAIN_DATA_DIR")) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& candidate : {exe.parent_path() / "../../data", exe.parent_path() / "../share/packtrain/data"}) {
      if (fs::is_directory(candidate)) return fs::weakly_canonical(candidate);
    }
  }
  return PACKTRAIN_SOURCE_DATA_DIR;
}

struct TrainArgs {
  std::string data = "concrete";
  int split = 0;
  int64_t members = 16;
  int64_t hidden = 64;
  int64_t depth = 2;
  std::string activation = "relu";
  int64_t epochs = 200;
  int64_t batch = 64;
  double lr = 3e-3;
  double weight_decay = 1e-4;
  uint64_t seed = 0;
  std::string device = "auto";
  bool json = false;
  bool quiet = false;
  bool eager = false;
  int64_t unroll = 8;
  std::string trace;
};

struct ProfileArgs {
  int64_t members = 64;
  int64_t hidden = 64;
  int64_t depth = 1;
  int64_t batch = 128;
  int64_t unroll = 1;
  int64_t steps = 200;
  std::string device = "auto";
  bool graph = false;
  bool eager = false;
  bool json = false;
  std::string trace;
};

c10::Device pick_device(const std::string& name) {
  if (name == "auto") return at::hasCUDA() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  const c10::Device device(name);
  TORCH_CHECK(!device.is_cuda() || at::hasCUDA(), "device '", name, "' requested but no CUDA device is available");
  return device;
}

int run_train(const TrainArgs& args) {
  fs::path dir = args.data;
  if (!fs::is_directory(dir)) dir = bundled_data_dir() / args.data;
  if (!fs::is_directory(dir)) {
    throw runtime::DataError(args.data + ": no such data set directory (nor a bundled data set in " +
                             bundled_data_dir().string() + ")");
  }
  const runtime::RegressionData data = runtime::load_uci(dir);
  const runtime::SplitIndices split = runtime::load_uci_split(dir, args.split, data.features.size(0));
  const auto rows = [](const at::Tensor& t, const std::vector<int64_t>& idx) {
    return t.index_select(0, at::tensor(idx, at::kLong));
  };
  const c10::Device device = pick_device(args.device);
  if (device.is_cpu()) runtime::retain_freed_cpu_memory();
  std::vector<std::string> log_lines;  // graph decisions; in the JSON when --json
  runtime::EnsembleTrainer trainer(runtime::EnsembleTrainerOptions()
                                       .members(args.members)
                                       .hidden(args.hidden)
                                       .depth(args.depth)
                                       .activation(ensemble::parse_activation(args.activation))
                                       .epochs(args.epochs)
                                       .batch_size(args.batch)
                                       .lr(args.lr)
                                       .weight_decay(args.weight_decay)
                                       .seed(args.seed)
                                       .device(device)
                                       .capture(!args.eager)
                                       .unroll(args.unroll)
                                       .log([&](const std::string& line) {
                                         if (args.json) {
                                           log_lines.push_back(line);
                                         } else {
                                           fmt::print(stderr, "[packtrain] {}\n", line);
                                         }
                                       }));
  const bool progress = !args.quiet && !args.json;
  const bool tty = isatty(fileno(stderr));
  if (progress) {
    fmt::print(stderr, "packtrain train: {} split {} ({} train / {} test rows, {} features) on {}; {} members, {}x{} {}, {} epochs, batch {}\n",
               data.name, args.split, split.train.size(), split.test.size(), data.features.size(1), device.str(),
               args.members, args.depth, args.hidden, args.activation, args.epochs, args.batch);
  }
  if (!args.trace.empty()) profiling::trace_start();
  const auto start = std::chrono::steady_clock::now();
  const int64_t batches_per_epoch = static_cast<int64_t>(split.train.size()) / args.batch;
  trainer.fit(rows(data.features, split.train), rows(data.targets, split.train), [&](int64_t epoch, double loss) {
    if (!progress) return;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const bool report = tty || (epoch + 1) % 20 == 0 || epoch + 1 == args.epochs;
    if (!report) return;
    const double rate = static_cast<double>((epoch + 1) * batches_per_epoch * args.members) / seconds;
    const double eta = seconds / static_cast<double>(epoch + 1) * static_cast<double>(args.epochs - epoch - 1);
    fmt::print(stderr, "{}epoch {:>4}/{}  train nll {:8.4f}  {:9.0f} member-steps/s  ETA {:5.1f}s{}", tty ? "\r" : "",
               epoch + 1, args.epochs, loss, rate, eta, tty ? "" : "\n");
  });
  if (progress && tty) fmt::print(stderr, "\n");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!args.trace.empty()) {
    profiling::trace_stop();
    profiling::write_chrome_trace(args.trace);
    if (progress) fmt::print(stderr, "Chrome trace of the training ranges written to {}\n", args.trace);
  }
  const runtime::EnsembleMetrics m = trainer.evaluate(rows(data.features, split.test), rows(data.targets, split.test));

  if (args.json) {
    nlohmann::json out;
    out["data"] = data.name;
    out["split"] = args.split;
    out["device"] = device.str();
    out["members"] = args.members;
    out["epochs"] = args.epochs;
    out["train_seconds"] = seconds;
    for (const auto& member : m.members) out["member_metrics"].push_back({{"rmse", member.rmse}, {"nll", member.nll}});
    out["ensemble"] = {{"rmse", m.ensemble.rmse}, {"nll", m.ensemble.nll}};
    out["log"] = log_lines;
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  fmt::print("\nTest metrics on {} split {} ({} rows), original units:\n", data.name, args.split, split.test.size());
  fmt::print("  {:>8}  {:>10}  {:>10}\n", "member", "RMSE", "NLL");
  for (size_t k = 0; k < m.members.size(); ++k) {
    fmt::print("  {:>8}  {:>10.4f}  {:>10.4f}\n", k, m.members[k].rmse, m.members[k].nll);
  }
  double mean_rmse = 0;
  for (const auto& member : m.members) mean_rmse += member.rmse / static_cast<double>(m.members.size());
  fmt::print("  {:>8}  {:>10.4f}  {:>10}\n", "mean", mean_rmse, "");
  fmt::print("  {:>8}  {:>10.4f}  {:>10.4f}   <- the ensemble (uniform mixture)\n", "ensemble", m.ensemble.rmse, m.ensemble.nll);
  fmt::print("\nTrained {} members x {} steps in {:.2f} s ({:.0f} member-steps/s) on {}.\n", args.members,
             trainer.steps_taken(), seconds, static_cast<double>(trainer.steps_taken() * args.members) / seconds,
             device.str());
  return 0;
}

int run_profile(const ProfileArgs& args) {
  runtime::ProfileRequest request;
  request.workload = runtime::WorkloadOptions()
                         .members(args.members)
                         .hidden(args.hidden)
                         .depth(args.depth)
                         .batch(args.batch)
                         .device(pick_device(args.device));
  request.graph = !args.eager;
  request.unroll = args.unroll;
  request.steps = args.steps;
  request.trace_path = args.trace;
  if (request.workload.device().is_cpu()) runtime::retain_freed_cpu_memory();
  if (!args.json) fmt::print(stderr, "profiling {} on {} ({} timed steps per path)...\n", request.workload.describe(),
                             request.workload.device().str(), args.steps);
  const profiling::LaunchReport report = runtime::profile_launches(request);
  std::cout << (args.json ? report.json() + "\n" : report.text());
  if (!args.trace.empty() && !args.json) fmt::print(stderr, "Chrome trace written to {} (open in ui.perfetto.dev)\n", args.trace);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"packtrain: train many small models as one (packed ensembles, captured training steps)"};
  app.require_subcommand(1);
  TrainArgs args;
  CLI::App* train = app.add_subcommand(
      "train", "Train a packed deep ensemble (Gaussian mean+variance heads) and print per-member and ensemble test metrics.\n"
               "With no arguments: 16 members on the bundled UCI concrete data set, standard split 0.");
  train->add_option("--data", args.data, "Bundled data set name (concrete, energy, yacht) or a directory in the UCI format")
      ->capture_default_str();
  train->add_option("--split", args.split, "Standard split index (index_train_<k>.txt / index_test_<k>.txt)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  train->add_option("--members", args.members, "Ensemble members K, trained as one pack")->capture_default_str();
  train->add_option("--hidden", args.hidden, "Width of each hidden layer")->capture_default_str()->check(CLI::PositiveNumber);
  train->add_option("--depth", args.depth, "Number of hidden layers")->capture_default_str()->check(CLI::NonNegativeNumber);
  train->add_option("--activation", args.activation, "relu, gelu, silu or tanh")->capture_default_str();
  train->add_option("--epochs", args.epochs, "Passes over the training split")->capture_default_str();
  train->add_option("--batch", args.batch, "Mini-batch size (all members see the same batch)")->capture_default_str();
  train->add_option("--lr", args.lr, "AdamW learning rate")->capture_default_str();
  train->add_option("--weight-decay", args.weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  train->add_option("--seed", args.seed, "Seed: member i is initialized from (seed, i)")->capture_default_str();
  train->add_option("--device", args.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  train->add_flag("--json", args.json, "Print the result as JSON on stdout (no progress)");
  train->add_flag("--quiet", args.quiet, "No progress lines on stderr");
  train->add_flag("--eager", args.eager, "Run every step eagerly (no CUDA graph capture)");
  train->add_option("--unroll", args.unroll, "Training steps per CUDA graph replay")->capture_default_str()->check(CLI::PositiveNumber);
  train->add_option("--trace", args.trace, "Write the run's NVTX ranges as Chrome trace JSON to this file (Perfetto)");

  ProfileArgs pargs;
  CLI::App* profile = app.add_subcommand(
      "profile", "Measure how much of a training step is kernel launches: host and device microseconds per step,\n"
                 "kernels per step, eager versus captured, and a plain verdict (launch-bound or compute-bound).\n"
                 "Workload: K MLP regressors (8 inputs, 1 output, ReLU, MSE, AdamW) on synthetic data on the device.");
  profile->add_option("--members", pargs.members, "Ensemble members K")->capture_default_str()->check(CLI::PositiveNumber);
  profile->add_option("--hidden", pargs.hidden, "Width of each hidden layer")->capture_default_str()->check(CLI::PositiveNumber);
  profile->add_option("--depth", pargs.depth, "Number of hidden layers")->capture_default_str()->check(CLI::NonNegativeNumber);
  profile->add_option("--batch", pargs.batch, "Mini-batch size")->capture_default_str()->check(CLI::PositiveNumber);
  profile->add_option("--unroll", pargs.unroll, "Steps per graph replay on the captured path")->capture_default_str()->check(CLI::PositiveNumber);
  profile->add_option("--steps", pargs.steps, "Timed steps per path")->capture_default_str()->check(CLI::PositiveNumber);
  profile->add_option("--device", pargs.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  auto* graph_flag = profile->add_flag("--graph", pargs.graph, "Profile the captured step (the default on a GPU)");
  profile->add_flag("--eager", pargs.eager, "Profile the eager step")->excludes(graph_flag);
  profile->add_flag("--json", pargs.json, "Print the report as JSON on stdout");
  profile->add_option("--trace", pargs.trace, "Also write the profiled path's ranges as Chrome trace JSON to this file");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (train->parsed()) return run_train(args);
    if (profile->parsed()) return run_profile(pargs);
  } catch (const runtime::DataError& e) {
    fmt::print(stderr, "packtrain: error: {}\n", e.what());
    return 2;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "packtrain: error: {}\n", e.what_without_backtrace());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "packtrain: internal error: {}\n", e.what());
    return 1;
  }
  return 0;
}
