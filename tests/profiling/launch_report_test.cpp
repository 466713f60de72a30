// The launch-overhead report: its verdict follows the measurements (launch-bound
// when replaying the same kernels as a graph is much faster than the eager step),
// the JSON parses, and the measuring helpers count what they claim to.
#include "packtrain/profiling/launch_report.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <thread>

namespace {

using namespace packtrain::profiling;

LaunchReport gpu_report(double eager_device_us, double graph_device_us) {
  LaunchReport r;
  r.device = "cuda:0 (test)";
  r.workload = "members 64";
  r.profiled = "graph";
  r.eager = StepCost{900, eager_device_us, 212, {}};
  r.graph = StepCost{4, graph_device_us, 212, {}};
  return r;
}

TEST(LaunchReport, LaunchBoundWhenTheGraphRunsTheSameKernelsMuchFaster) {
  const LaunchReport r = gpu_report(1000, 100);
  const std::string v = r.verdict();
  EXPECT_EQ(v.rfind("launch-bound", 0), 0u) << v;
  EXPECT_NE(v.find("900.0 us"), std::string::npos) << "names the saving: " << v;
  EXPECT_NE(v.find("10.0x"), std::string::npos) << v;
}

TEST(LaunchReport, ComputeBoundWhenTheGraphBarelyHelps) {
  const LaunchReport r = gpu_report(1100, 1000);
  const std::string v = r.verdict();
  EXPECT_EQ(v.rfind("compute-bound", 0), 0u) << v;
  EXPECT_NE(v.find("100.0 us"), std::string::npos) << v;
}

TEST(LaunchReport, TheGraphsNodesPerStepByKindAreInTheTextAndTheJson) {
  LaunchReport r = gpu_report(1000, 100);
  r.graph->nodes_by_kind = {{"kernel", 20.5}, {"memset", 1}, {"memcpy", 0}};
  const nlohmann::json j = nlohmann::json::parse(r.json());
  EXPECT_DOUBLE_EQ(j.at("graph").at("nodes_per_step_by_kind").at("kernel").get<double>(), 20.5);
  EXPECT_DOUBLE_EQ(j.at("graph").at("nodes_per_step_by_kind").at("memset").get<double>(), 1.0);
  EXPECT_FALSE(j.at("eager").contains("nodes_per_step_by_kind")) << "an eager step has no graph";
  EXPECT_NE(r.text().find("graph nodes per step: kernel 20.5 memset 1.0 memcpy 0.0"), std::string::npos) << r.text();
}

TEST(LaunchReport, CpuVerdictSaysThereIsNothingToCapture) {
  LaunchReport r;
  r.device = "cpu";
  r.profiled = "eager";
  r.eager = StepCost{300, 300, 150, {}};
  r.note = "CUDA graphs need a CUDA device";
  EXPECT_NE(r.verdict().find("CPU run"), std::string::npos) << r.verdict();
  EXPECT_NE(r.verdict().find("150 ATen ops"), std::string::npos) << r.verdict();
  const nlohmann::json j = nlohmann::json::parse(r.json());
  EXPECT_EQ(j.at("device"), "cpu");
  EXPECT_TRUE(j.at("graph").is_null());
  EXPECT_DOUBLE_EQ(j.at("eager").at("kernels_per_step").get<double>(), 150.0);
  EXPECT_EQ(j.at("verdict"), r.verdict());
  EXPECT_NE(r.text().find("graph  not measured"), std::string::npos) << r.text();
}

TEST(LaunchReport, MeasureStepCostTimesEachStepOnTheCpu) {
  int calls = 0;
  const StepCost cost = measure_step_cost(
      [&] {
        ++calls;
        std::this_thread::sleep_for(std::chrono::microseconds(300));
      },
      c10::Device(c10::kCPU), /*steps=*/10, /*warmup=*/2);
  EXPECT_EQ(calls, 12);
  EXPECT_GE(cost.host_us_per_step, 290.0);
  EXPECT_LT(cost.host_us_per_step, 300000.0);
  EXPECT_GE(cost.device_us_per_step, 290.0) << "on CPU the device clock is the host clock";
}

TEST(LaunchReport, MeasureStepCostDividesUnrolledCallsIntoSteps) {
  int calls = 0;
  const StepCost cost = measure_step_cost(
      [&] {
        ++calls;
        std::this_thread::sleep_for(std::chrono::microseconds(800));
      },
      c10::Device(c10::kCPU), /*steps=*/8, /*warmup=*/0, /*steps_per_call=*/4);
  EXPECT_EQ(calls, 2);
  EXPECT_GE(cost.host_us_per_step, 190.0);  // 800 us per call of 4 steps
}

TEST(LaunchReport, CountsAtenOpsOfOneCall) {
  const at::Tensor a = at::ones({4});
  const int64_t three = count_aten_ops([&] {
    at::Tensor b = a.add(1);
    b.mul_(2);
    b.sub_(a);
  });
  EXPECT_GE(three, 3);
  const int64_t six = count_aten_ops([&] {
    for (int i = 0; i < 2; ++i) {
      at::Tensor b = a.add(1);
      b.mul_(2);
      b.sub_(a);
    }
  });
  EXPECT_EQ(six, 2 * three) << "twice the work, twice the ops";
  EXPECT_EQ(count_aten_ops([] {}), 0);
}

}  // namespace
