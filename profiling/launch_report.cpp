#include "packtrain/profiling/launch_report.h"

#include "packtrain/profiling/step_timer.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>

namespace packtrain::profiling {

StepCost measure_step_cost(const std::function<void()>& step, c10::Device device, int64_t steps, int64_t warmup,
                           int64_t steps_per_call) {
  TORCH_CHECK(steps > 0 && steps_per_call > 0, "measure_step_cost: steps must be positive");
  for (int64_t i = 0; i < warmup; ++i) step();
  StepTimer timer(device);
  StepTimer drain(device);  // waits for the warm-up before timing starts
  drain.begin();
  drain.end(0);
  drain.read();
  const int64_t calls = (steps + steps_per_call - 1) / steps_per_call;
  timer.begin();
  const auto host_start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) step();
  const auto host_stop = std::chrono::steady_clock::now();
  timer.end(calls * steps_per_call);
  const StepTiming timing = timer.read();
  StepCost cost;
  cost.host_us_per_step = std::chrono::duration<double, std::micro>(host_stop - host_start).count() /
                          static_cast<double>(calls * steps_per_call);
  cost.device_us_per_step = timing.us_per_step();
  return cost;
}

int64_t count_aten_ops(const std::function<void()>& step) {
  static std::atomic<int64_t> counter{0};
  counter.store(0);
  const at::CallbackHandle handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
        counter.fetch_add(1, std::memory_order_relaxed);
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  try {
    step();
  } catch (...) {
    at::removeCallback(handle);
    throw;
  }
  at::removeCallback(handle);
  return counter.load();
}

std::string LaunchReport::verdict() const {
  if (eager && graph) {
    const double e = eager->device_us_per_step, g = graph->device_us_per_step;
    const double saving = e - g, ratio = g > 0 ? e / g : 0.0;
    if (e > 1.5 * g) {
      return fmt::format(
          "launch-bound: an eager step keeps the device busy for {:.1f} us, but its {:.0f} kernels need only "
          "{:.1f} us when replayed as one graph; the rest is the device waiting for the host, which takes "
          "{:.1f} us to launch them. The graph saves {:.1f} us per step ({:.1f}x).",
          e, eager->kernels_per_step, g, eager->host_us_per_step, saving, ratio);
    }
    return fmt::format(
        "compute-bound: the kernels need {:.1f} us of the eager step's {:.1f} us; launches are mostly hidden "
        "behind them, so the graph saves only {:.1f} us per step ({:.2f}x). Faster steps need less work "
        "(smaller models, fewer members per device), not fewer launches.",
        g, e, saving, ratio);
  }
  if (eager && device == "cpu") {
    const double per_op = eager->kernels_per_step > 0 ? eager->host_us_per_step / eager->kernels_per_step : 0.0;
    return fmt::format(
        "CPU run: no kernel launches to save. A step dispatches {:.0f} ATen ops in {:.1f} us ({:.2f} us per op "
        "on average, compute included). CUDA graphs need a CUDA device; run this on a GPU for the launch "
        "analysis.",
        eager->kernels_per_step, eager->host_us_per_step, per_op);
  }
  if (eager) {
    const bool starved = eager->host_us_per_step >= 0.8 * eager->device_us_per_step;
    return fmt::format(
        "{}: the host needs {:.1f} us to issue a step that the device finishes in {:.1f} us; no "
        "graph was measured ({}).",
        starved ? "likely launch-bound" : "likely compute-bound", eager->host_us_per_step, eager->device_us_per_step,
        note.empty() ? "capture unavailable" : note);
  }
  if (graph)
    return fmt::format("graph only: {:.1f} us per step on the device; no eager step was measured.",
                       graph->device_us_per_step);
  return "nothing was measured";
}

namespace {
nlohmann::json cost_json(const std::optional<StepCost>& cost) {
  if (!cost) return nullptr;
  nlohmann::json j = {{"host_us_per_step", cost->host_us_per_step},
                      {"device_us_per_step", cost->device_us_per_step},
                      {"kernels_per_step", cost->kernels_per_step}};
  if (!cost->nodes_by_kind.empty()) {
    nlohmann::json kinds = nlohmann::json::object();
    for (const auto& [kind, n] : cost->nodes_by_kind) kinds[kind] = n;
    j["nodes_per_step_by_kind"] = kinds;
  }
  return j;
}

std::string cost_line(const char* name, const std::optional<StepCost>& cost, const char* kernels) {
  if (!cost) return fmt::format("  {:<6} not measured\n", name);
  std::string line =
      fmt::format("  {:<6} host {:>10.1f} us/step   device {:>10.1f} us/step   {:>7.1f} {} per step\n", name,
                  cost->host_us_per_step, cost->device_us_per_step, cost->kernels_per_step, kernels);
  if (!cost->nodes_by_kind.empty()) {
    line += "         graph nodes per step:";
    for (const auto& [kind, n] : cost->nodes_by_kind) line += fmt::format(" {} {:.1f}", kind, n);
    line += "\n";
  }
  return line;
}
}  // namespace

std::string LaunchReport::text() const {
  const char* kernels = device == "cpu" ? "ATen ops" : "kernels";
  std::string out = fmt::format("packtrain profile: {}\n  device {}\n  profiled path: {}{}\n", workload, device,
                                profiled, unroll > 1 ? fmt::format(" (graph unrolled x{})", unroll) : "");
  out += cost_line("eager", eager, kernels);
  out += cost_line("graph", graph, kernels);
  if (!note.empty()) out += "  note: " + note + "\n";
  out += "verdict: " + verdict() + "\n";
  return out;
}

std::string LaunchReport::json() const {
  return nlohmann::json({{"device", device},
                         {"workload", workload},
                         {"profiled", profiled},
                         {"unroll", unroll},
                         {"eager", cost_json(eager)},
                         {"graph", cost_json(graph)},
                         {"note", note},
                         {"verdict", verdict()}})
      .dump(2);
}

}  // namespace packtrain::profiling
