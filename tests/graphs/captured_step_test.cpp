// CapturedStep and GraphCache: the same step function eagerly (CPU, capture off)
// and captured (CUDA), input validation, the refusal of host synchronization, and
// the bounded cache of graphs by input shape.
#include "packtrain/graphs/capture_error.h"
#include "packtrain/graphs/captured_step.h"
#include "packtrain/graphs/graph_cache.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using namespace packtrain::graphs;
using packtrain::testing::all_close;
using packtrain::testing::all_equal;
using packtrain::testing::DeviceTest;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

// A step with state: acc = acc * 0.5 + x * counter, counter += 1, all on the device.
struct Accumulator {
  explicit Accumulator(c10::Device d)
      : acc(at::zeros({3}, at::TensorOptions().device(d))), counter(at::zeros({}, at::TensorOptions().device(d))) {}
  StepFunction step() {
    return [this](const std::vector<at::Tensor>& in) {
      acc.mul_(0.5).add_(in[0] * counter);
      counter.add_(1);
    };
  }
  at::Tensor acc, counter;
};

class CapturedStepTest : public DeviceTest {};

TEST_P(CapturedStepTest, EveryCallIsOneStepAndMatchesTheEagerStep) {
  std::vector<std::string> log;
  Accumulator captured(device()), eager(device());
  CapturedStep step("acc", device(), {{"x", {3}}}, captured.step(),
                    CaptureOptions().warmup_steps(2).log([&](const std::string& m) { log.push_back(m); }));
  CapturedStep reference("acc", device(), {{"x", {3}}}, eager.step(), CaptureOptions().capture(false).log([](auto&) {}));
  for (int i = 0; i < 120; ++i) {
    const at::Tensor x = at::full({3}, static_cast<double>(i % 7), at::TensorOptions().device(device()));
    step.run({x});
    reference.run({x});
  }
  EXPECT_TRUE(all_equal(captured.acc, eager.acc));
  EXPECT_EQ(captured.counter.item<double>(), 120) << "a counter baked in as a constant would stop advancing";
  EXPECT_EQ(step.calls(), 120);
  if (device().is_cuda()) {
    EXPECT_EQ(step.mode(), StepMode::kGraph);
    EXPECT_GT(step.graph_nodes(), 0);
    int64_t by_kind = 0, kernels = 0;
    for (const auto& [kind, n] : step.graph_nodes_by_kind()) {
      by_kind += n;
      if (kind == "kernel") kernels = n;
    }
    EXPECT_EQ(by_kind, step.graph_nodes()) << "every node has one kind";
    EXPECT_GT(kernels, 0) << "the step's arithmetic is kernels";
    EXPECT_TRUE(log.empty()) << log.front();
  } else {
    EXPECT_EQ(step.mode(), StepMode::kEager);
    EXPECT_TRUE(contains(step.eager_reason(), "CPU")) << step.eager_reason();
    ASSERT_EQ(log.size(), 1u) << "the fallback is logged once, with its reason";
    EXPECT_TRUE(contains(log[0], "'acc' runs eagerly")) << log[0];
  }
  EXPECT_EQ(reference.mode(), StepMode::kEager);
  EXPECT_EQ(reference.eager_reason(), "capture is switched off");
}

TEST_P(CapturedStepTest, RejectsInputsThatDoNotMatchTheirBuffersNamingBothShapes) {
  Accumulator a(device());
  CapturedStep step("acc", device(), {{"x", {3}}}, a.step(), CaptureOptions().log([](auto&) {}));
  const auto opts = at::TensorOptions().device(device());
  const std::string shape = error_of([&] { step.run({at::zeros({4}, opts)}); });
  EXPECT_TRUE(contains(shape, "input 'x'")) << shape;
  EXPECT_TRUE(contains(shape, "[3]")) << shape;
  EXPECT_TRUE(contains(shape, "[4]")) << shape;
  const std::string dtype = error_of([&] { step.run({at::zeros({3}, opts.dtype(at::kDouble))}); });
  EXPECT_TRUE(contains(dtype, "Double")) << dtype;
  EXPECT_TRUE(contains(dtype, "Float")) << dtype;
  if (device().is_cuda()) {
    const std::string dev = error_of([&] { step.run({at::zeros({3})}); });
    EXPECT_TRUE(contains(dev, "cpu")) << dev;
  }
  const std::string count = error_of([&] { step.run({}); });
  EXPECT_TRUE(contains(count, "takes 1 inputs, got 0")) << count;
  EXPECT_EQ(step.calls(), 0) << "a rejected call runs nothing";
  EXPECT_TRUE(all_equal(a.acc, at::zeros({3}, opts)));
}

TEST_P(CapturedStepTest, StaticInputsAreAllocatedOnTheDeviceAndRunWithoutInputsReadsThem) {
  Accumulator a(device());
  CapturedStep step("acc", device(), {{"x", {3}}}, a.step(), CaptureOptions().log([](auto&) {}));
  ASSERT_EQ(step.static_inputs().size(), 1u);
  EXPECT_EQ(step.static_inputs()[0].device(), device());
  step.static_inputs()[0].fill_(2);
  step.run();  // counter 0: acc stays 0
  step.run();  // acc = 0 * 0.5 + 2 * 1
  EXPECT_TRUE(all_equal(a.acc.cpu(), at::full({3}, 2.0)));
}

TEST_P(CapturedStepTest, HostSynchronizationInsideTheStepIsRefused) {
  if (!device().is_cuda()) GTEST_SKIP() << "a CPU step has no host synchronization to refuse";
  at::Tensor acc = at::zeros({3}, at::TensorOptions().device(device()));
  CapturedStep step("syncing", device(), {{"x", {3}}}, [&](const std::vector<at::Tensor>& in) {
    if (in[0].sum().item<float>() > 0) acc.add_(in[0]);  // .item(): waits for the device
  });
  const std::string what = error_of([&] { step.run({at::ones({3}, acc.options())}); });
  EXPECT_TRUE(contains(what, "step 'syncing' cannot be captured")) << what;
  EXPECT_TRUE(contains(what, "synchronizes the host")) << what;
  // The device and the allocator remain usable.
  EXPECT_EQ(acc.add(1).sum().item<float>(), 3.0f);
}

TEST_P(CapturedStepTest, WarmupStepsMustBePositive) {
  Accumulator a(device());
  const std::string what = error_of([&] { CapturedStep("acc", device(), {}, a.step(), CaptureOptions().warmup_steps(0)); });
  EXPECT_TRUE(contains(what, "warmup_steps must be at least 1")) << what;
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(CapturedStepTest);

class GraphCacheTest : public DeviceTest {};

TEST_P(GraphCacheTest, OneStepPerShapeUpToCapacityThenEagerAndLoggedOnce) {
  std::vector<std::string> log;
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device()));
  GraphCache cache(
      "sum", device(), {{"x", 2, at::kFloat}},
      [&](const std::vector<at::Tensor>& in) { total.add_(in[0].sum()); },
      CaptureOptions().log([&](const std::string& m) { log.push_back(m); }), nullptr, /*capacity=*/2);
  const auto opts = at::TensorOptions().device(device());
  double expected = 0;
  for (int round = 0; round < 6; ++round) {
    for (int64_t rows : {4, 3, 2}) {  // the third shape does not fit
      cache.run({at::ones({rows, 5}, opts)});
      expected += static_cast<double>(rows * 5);
    }
  }
  EXPECT_EQ(total.item<double>(), expected) << "every call ran once, through a graph or eagerly";
  EXPECT_EQ(cache.size(), 2u);
  ASSERT_NE(cache.find({{4, 5}}), nullptr);
  ASSERT_NE(cache.find({{3, 5}}), nullptr);
  EXPECT_EQ(cache.find({{2, 5}}), nullptr);
  EXPECT_EQ(cache.eager_overflow_calls(), 6);
  const auto overflow = std::count_if(log.begin(), log.end(), [](const std::string& m) {
    return contains(m, "[2, 5]") && contains(m, "graph cache holds 2 shapes");
  });
  EXPECT_EQ(overflow, 1) << "logged once per shape";
  if (device().is_cuda()) {
    EXPECT_EQ(cache.find({{4, 5}})->mode(), StepMode::kGraph);
    EXPECT_EQ(cache.find({{3, 5}})->mode(), StepMode::kGraph);
  }
}

TEST_P(GraphCacheTest, RejectsRankDtypeAndDeviceMismatches) {
  GraphCache cache("sum", device(), {{"x", 2, at::kFloat}}, [](const std::vector<at::Tensor>&) {},
                   CaptureOptions().log([](auto&) {}));
  const auto opts = at::TensorOptions().device(device());
  const std::string rank = error_of([&] { cache.run({at::ones({4}, opts)}); });
  EXPECT_TRUE(contains(rank, "input 'x' must be a 2-d Float tensor")) << rank;
  EXPECT_TRUE(contains(rank, "got [4] Float")) << rank;
  const std::string dtype = error_of([&] { cache.run({at::ones({4, 2}, opts.dtype(at::kLong))}); });
  EXPECT_TRUE(contains(dtype, "got [4, 2] Long")) << dtype;
  EXPECT_EQ(cache.size(), 0u);
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(GraphCacheTest);

}  // namespace
