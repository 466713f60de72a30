// `packtrain info` (versions, devices, CUDA/NCCL availability) and `packtrain
// profile` (how much of a training step is kernel launches).
#include "packtrain/runtime/cli/cli_common.h"
#include "packtrain/runtime/cli/commands.h"
#include "packtrain/runtime/cli/range_checks.h"
#include "packtrain/runtime/cli/schema_flags.h"
#include "packtrain/runtime/data/dataset.h"
#include "packtrain/runtime/distributed/nccl_communicator.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/measure/cpu_memory.h"
#include "packtrain/runtime/measure/launch_profile.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer_options.h"
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"
#include "packtrain/runtime/trainers/uncertainty/active_learning.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>

#ifndef PACKTRAIN_VERSION
#define PACKTRAIN_VERSION "0.0.0"
#endif

namespace packtrain::cli {

namespace {

nlohmann::json info_json() {
  nlohmann::json j;
  j["packtrain"] = PACKTRAIN_VERSION;
  j["libtorch"] = TORCH_VERSION;
  try {  // CUDART_VERSION of the LibTorch build, e.g. 13000; throws without LibTorch's CUDA library
    const long v = at::detail::getCUDAHooks().versionCUDART();
    j["cuda_build"] = fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
  } catch (const c10::Error&) {
    j["cuda_build"] = "none";
  }
  j["cuda_available"] = at::hasCUDA();
  j["cpu_threads"] = at::get_num_threads();
  // Where --precision bf16-mixed can beat fp32 on this CPU (ensemble/precision.h).
  j["cpu_bf16_matrix_units"] = ensemble::cpu_has_bf16_matrix_units();
  j["data_dir"] = runtime::bundled_data_dir().string();
  nlohmann::json devices = nlohmann::json::array();
  devices.push_back({{"device", "cpu"}, {"name", "host CPU"}});
  if (at::hasCUDA()) {
    for (int i = 0; i < static_cast<int>(at::cuda::device_count()); ++i) {
      const cudaDeviceProp* prop = at::cuda::getDeviceProperties(i);
      devices.push_back({{"device", fmt::format("cuda:{}", i)},
                         {"name", prop->name},
                         {"memory_gib", static_cast<double>(prop->totalGlobalMem) / (1 << 30)},
                         {"compute_capability", fmt::format("{}.{}", prop->major, prop->minor)}});
    }
  }
  j["devices"] = devices;
  // The NCCL library loaded in this process (LibTorch's, which packtrain links).
  j["nccl"] = runtime::distributed::NcclCommunicator::available()
                  ? runtime::distributed::NcclCommunicator::version() +
                        (at::hasCUDA() ? "" : " (no CUDA device: collectives unusable here)")
                  : "not available in this build";

#ifdef PACKTRAIN_HAVE_NVTX
  j["nvtx"] = true;
#else
  j["nvtx"] = false;
#endif
  return j;
}

// Joins the run this process belongs to (rank_info_from_environment: torchrun,
// Slurm or packtrain launch variables; none: one process) and checks an all-reduce
// and a broadcast give what they must.
nlohmann::json collectives_check(c10::Device device) {
  using namespace runtime::distributed;
  const RankInfo info = rank_info_from_environment();
  auto group = ProcessGroup::join(info, collective_timeout(), device);
  const auto W = static_cast<double>(info.world_size);
  // The same checks over Gloo (CPU tensors) and, on a GPU, over NCCL (its tensors).
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  if (device.is_cuda()) devices.push_back(device);
  bool all_reduce_ok = true, broadcast_ok = true;
  for (const c10::Device d : devices) {
    const auto f64 = at::TensorOptions().dtype(at::kDouble).device(d);
    at::Tensor sum = at::tensor({static_cast<double>(info.rank + 1), 1.0}, f64);
    group->all_reduce_sum_(sum, "check all-reduce");
    at::Tensor from_root = at::full({3}, static_cast<double>(info.rank == 0 ? 42 : -1), f64);
    group->broadcast_(from_root, 0, "check broadcast");
    group->wait_device("check collectives");
    const at::Tensor s = sum.cpu();
    all_reduce_ok = all_reduce_ok && s[0].item<double>() == W * (W + 1) / 2 && s[1].item<double>() == W;
    broadcast_ok = broadcast_ok && (from_root.cpu() == 42).all().item<bool>();
  }
  group->barrier();
  return {{"rank", info.rank},
          {"world_size", info.world_size},
          {"local_rank", info.local_rank},
          {"source", info.source},
          {"backend", group->backends()},
          {"device", group->device().str()},
          {"all_reduce_ok", all_reduce_ok},
          {"broadcast_ok", broadcast_ok},
          {"describe", info.describe()}};
}

int run_info(bool json, bool collectives, const std::string& device) {
  nlohmann::json j = info_json();
  j["gloo"] = runtime::distributed::ProcessGroup::gloo_available();
  j["nccl_collectives"] = runtime::distributed::ProcessGroup::nccl_available();
  if (collectives) {
    j["collectives"] = collectives_check(pick_device(device));
    if (!json) {
      const auto& c = j["collectives"];
      fmt::print("{} ({} on {}): all-reduce {}, broadcast {}\n", c["describe"].get<std::string>(),
                 c["backend"].get<std::string>(), c["device"].get<std::string>(),
                 c["all_reduce_ok"].get<bool>() ? "ok" : "WRONG", c["broadcast_ok"].get<bool>() ? "ok" : "WRONG");
      return c["all_reduce_ok"].get<bool>() && c["broadcast_ok"].get<bool>() ? 0 : 1;
    }
  }
  if (json) {
    std::cout << j.dump(2) << "\n";
    if (collectives)
      return j["collectives"]["all_reduce_ok"].get<bool>() && j["collectives"]["broadcast_ok"].get<bool>() ? 0 : 1;
    return 0;
  }
  fmt::print("packtrain {}\nLibTorch {} (CUDA runtime in this build: {})\n", j["packtrain"].get<std::string>(),
             j["libtorch"].get<std::string>(), j["cuda_build"].get<std::string>());
  fmt::print(
      "CUDA available: {}\nNCCL: {}\nNVTX ranges: {}\nCPU threads: {}\nCPU bfloat16 matrix units (AVX-512 BF16 or "
      "AMX): {}\nBundled data: {}\nDevices:\n",
      j["cuda_available"].get<bool>() ? "yes" : "no", j["nccl"].get<std::string>(),
      j["nvtx"].get<bool>() ? "yes" : "no", j["cpu_threads"].get<int>(),
      j["cpu_bf16_matrix_units"].get<bool>() ? "yes" : "no", j["data_dir"].get<std::string>());
  for (const auto& d : j["devices"]) {
    fmt::print("  {:<8} {}{}\n", d["device"].get<std::string>(), d["name"].get<std::string>(),
               d.contains("memory_gib") ? fmt::format(" ({:.0f} GiB, compute {})", d["memory_gib"].get<double>(),
                                                      d["compute_capability"].get<std::string>())
                                        : "");
  }
  return 0;
}

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
  std::string precision = "fp32";
  bool collectives = false;
  int64_t collective_repeats = 20;
};

// All-reduce time against message size over this run's process group (launch it
// with packtrain launch / torchrun): the measured half of the data-parallel scaling
// model in benchmarks/RESULTS.md. Median of `repeats` timed calls per size.
int run_collectives_profile(const ProfileArgs& args) {
  using namespace runtime::distributed;
  const RankInfo info = rank_info_from_environment();
  const c10::Device device = pick_device(args.device);
  auto group = ProcessGroup::join(info, collective_timeout(), device);
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t bytes = 4 << 10; bytes <= (int64_t{64} << 20); bytes *= 4) {
    at::Tensor t = at::ones({bytes / 4}, at::TensorOptions().dtype(at::kFloat).device(device));
    for (int i = 0; i < 3; ++i) group->all_reduce_mean_(t, "warm-up all-reduce");  // connections, buffers
    group->wait_device("warm-up all-reduce");
    std::vector<double> us;
    for (int64_t r = 0; r < args.collective_repeats; ++r) {
      group->barrier();
      if (device.is_cuda()) {  // device time between two events around the enqueued call
        at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
        const auto stream = c10::cuda::getCurrentCUDAStream(device.index());
        start.record(stream);
        group->all_reduce_mean_(t, "timed all-reduce");
        end.record(stream);
        group->wait_device("timed all-reduce");
        us.push_back(static_cast<double>(start.elapsed_time(end)) * 1000.0);
        continue;
      }
      const auto start = std::chrono::steady_clock::now();
      group->all_reduce_mean_(t, "timed all-reduce");
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(us.begin(), us.end());
    const double median = us[us.size() / 2];
    // Ring all-reduce moves 2 (W-1)/W of the buffer through each rank's link.
    const double W = static_cast<double>(info.world_size);
    const double bus_gb_s = W > 1 ? 2 * (W - 1) / W * static_cast<double>(bytes) / (median * 1e-6) / 1e9 : 0;
    rows.push_back({{"bytes", bytes}, {"median_us", median}, {"bus_bandwidth_gb_s", bus_gb_s}});
  }
  if (info.rank != 0) return 0;
  const std::string backend = device.is_cuda() ? "NCCL" : "Gloo";
  const nlohmann::json out = {{"world_size", info.world_size},
                              {"backend", backend},
                              {"device", device.str()},
                              {"repeats", args.collective_repeats},
                              {"allreduce", rows}};
  if (args.json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  fmt::print("all-reduce (mean, float32) over {} rank(s), {} on {}, median of {}{}:\n", info.world_size, backend,
             device.str(), args.collective_repeats, device.is_cuda() ? " (device time between CUDA events)" : "");
  fmt::print("{:>12} {:>12} {:>16}\n", "bytes", "median us", "bus GB/s");
  for (const auto& r : rows) {
    fmt::print("{:>12} {:>12.1f} {:>16.3f}\n", r["bytes"].get<int64_t>(), r["median_us"].get<double>(),
               r["bus_bandwidth_gb_s"].get<double>());
  }
  return 0;
}

int run_profile(const ProfileArgs& args) {
  if (args.collectives) return run_collectives_profile(args);
  runtime::ProfileRequest request;
  request.workload = runtime::WorkloadOptions()
                         .members(args.members)
                         .hidden(args.hidden)
                         .depth(args.depth)
                         .batch(args.batch)
                         .precision(ensemble::parse_precision(args.precision))
                         .device(pick_device(args.device));
  request.graph = !args.eager;
  request.unroll = args.unroll;
  request.steps = args.steps;
  request.trace_path = args.trace;
  if (request.workload.device().is_cpu()) runtime::retain_freed_cpu_memory();
  if (!args.json) {
    fmt::print(stderr, "profiling {} on {} ({} timed steps per path)...\n", request.workload.describe(),
               request.workload.device().str(), args.steps);
  }
  const profiling::LaunchReport report = runtime::profile_launches(request);
  std::cout << (args.json ? report.json() + "\n" : report.text());
  if (!args.trace.empty() && !args.json) {
    fmt::print(stderr, "Chrome trace written to {} (open in ui.perfetto.dev)\n", args.trace);
  }
  return 0;
}

// An options schema with its defaults: the markdown table the docs hold, or (json)
// the schema itself.
template <typename O>
void print_options(const OptionSchema<O>& schema, bool json) {
  const O defaults;
  std::cout << (json ? schema.describe(defaults).dump(2) + "\n" : option_table_markdown(schema, defaults));
}

}  // namespace

void add_info_commands(CLI::App& app, int& status) {
  auto json = std::make_shared<bool>(false);
  CLI::App* info = app.add_subcommand("info", "Versions, devices, and whether CUDA, NCCL and NVTX are usable here.");
  info->add_flag("--json", *json, "Print as JSON");
  auto collectives = std::make_shared<bool>(false);
  info->add_flag("--collectives", *collectives,
                 "Join this process's multi-process run (torchrun, Slurm or packtrain launch variables) and check an "
                 "all-reduce and a broadcast over Gloo, and over NCCL when --device is a GPU");
  auto device = std::make_shared<std::string>("cpu");
  info->add_option("--device", *device,
                   "With --collectives: cpu (Gloo only), cuda or cuda:N (NCCL too; under a "
                   "launcher \"cuda\" is this rank's GPU)")
      ->capture_default_str();
  auto options = std::make_shared<bool>(false);
  info->add_flag("--options", *options,
                 "Print train's trainer options (generated from their schema) as a markdown table; with --json, the "
                 "schema itself (each option's name, kind, flag, default, range, choices)");
  auto multitask_options = std::make_shared<bool>(false);
  info->add_flag("--multitask-options", *multitask_options,
                 "The same for `multitask train`'s trainer options (their schema)");
  auto active_learning_options = std::make_shared<bool>(false);
  info->add_flag("--active-learning-options", *active_learning_options,
                 "The same for `active-learn`'s loop and acquisition options (beside train's trainer options)");
  auto acquisition_options = std::make_shared<bool>(false);
  info->add_flag("--acquisition-options", *acquisition_options, "The same for `acquire`'s acquisition options");
  info->callback(
      [json, collectives, device, options, multitask_options, active_learning_options, acquisition_options, &status] {
        if (*options || *multitask_options || *active_learning_options || *acquisition_options) {
          if (*options)
            print_options(runtime::trainer_option_schema(), *json);
          else if (*multitask_options)
            print_options(runtime::multitask_option_schema(), *json);
          else if (*active_learning_options)
            print_options(runtime::active_learning_option_schema(), *json);
          else
            print_options(runtime::acquisition_option_schema(), *json);
          status = 0;
          return;
        }
        status = run_info(*json, *collectives, *device);
      });

  auto p = std::make_shared<ProfileArgs>();
  CLI::App* profile = app.add_subcommand(
      "profile",
      "Measure how much of a training step is kernel launches: host and device microseconds per step,\n"
      "kernels per step, eager versus captured, and a plain verdict (launch-bound or compute-bound).\n"
      "Workload: K MLP regressors (8 inputs, 1 output, ReLU, MSE, AdamW) on synthetic data on the device.");
  profile->add_option("--members", p->members, "Ensemble members K")->capture_default_str()->check(positive());
  profile->add_option("--hidden", p->hidden, "Width of each hidden layer")->capture_default_str()->check(positive());
  profile->add_option("--depth", p->depth, "Number of hidden layers")->capture_default_str()->check(non_negative());
  profile->add_option("--batch", p->batch, "Mini-batch size")->capture_default_str()->check(positive());
  profile->add_option("--unroll", p->unroll, "Steps per graph replay on the captured path")
      ->capture_default_str()
      ->check(positive());
  profile->add_option("--steps", p->steps, "Timed steps per path")->capture_default_str()->check(positive());
  profile->add_option("--device", p->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  profile->add_option("--precision", p->precision, "fp32 or bf16-mixed (train's --precision)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16-mixed"}));
  auto* graph_flag = profile->add_flag("--graph", p->graph, "Profile the captured step (the default on a GPU)");
  profile->add_flag("--eager", p->eager, "Profile the eager step")->excludes(graph_flag);
  profile->add_flag("--json", p->json, "Print the report as JSON on stdout");
  profile->add_option("--trace", p->trace, "Also write the profiled path's ranges as Chrome trace JSON to this file");
  profile->add_flag("--collectives", p->collectives,
                    "Instead: time all-reduces of 4 KiB to 64 MiB over this run's ranks (start it with packtrain "
                    "launch or torchrun; alone: world size 1): Gloo on CPU, NCCL on a GPU (--device)");
  profile->add_option("--repeats", p->collective_repeats, "Timed all-reduces per size (with --collectives)")
      ->check(positive())
      ->capture_default_str();
  profile->callback([p, &status] { status = run_profile(*p); });
}

}  // namespace packtrain::cli
