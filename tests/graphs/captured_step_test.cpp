// CapturedStep and GraphCache: the same step function eagerly (CPU, capture off)
// and captured (CUDA), input validation, the eager fallback of a step that cannot be
// captured (on a GPU, and on any machine through a scripted backend), and the
// bounded cache of graphs by input shape.
#include "packtrain/graphs/captured_step.h"
#include "packtrain/graphs/graph_cache.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
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
  CapturedStep reference("acc", device(), {{"x", {3}}}, eager.step(),
                         CaptureOptions().capture(false).log([](auto&) {}));
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

// A step that waits for the device cannot be captured: it goes on eagerly, the
// reason logged once, and every call still performs exactly one step.
TEST_P(CapturedStepTest, AStepThatSynchronizesTheHostRunsEagerlyOneStepPerCall) {
  if (!device().is_cuda()) GTEST_SKIP() << "a CPU step has no host synchronization to notice";
  std::vector<std::string> log;
  at::Tensor acc = at::zeros({3}, at::TensorOptions().device(device()));
  CapturedStep step(
      "syncing", device(), {{"x", {3}}},
      [&](const std::vector<at::Tensor>& in) {
        if (in[0].sum().item<float>() > 0) acc.add_(in[0]);  // .item(): waits for the device
      },
      CaptureOptions().log([&](const std::string& m) { log.push_back(m); }));
  for (int i = 0; i < 6; ++i) step.run({at::ones({3}, acc.options())});
  EXPECT_TRUE(all_equal(acc.cpu(), at::full({3}, 6.0))) << "one step per call, none twice, none lost";
  EXPECT_EQ(step.mode(), StepMode::kEager);
  EXPECT_EQ(step.captures(), 0);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_TRUE(contains(log[0], "'syncing' runs eagerly")) << log[0];
  EXPECT_TRUE(contains(log[0], "synchronizes the host")) << log[0];
  EXPECT_EQ(acc.add(1).sum().item<float>(), 21.0f) << "the device and the allocator remain usable";
}

// Graphs of one pool warm up and capture on the pool's one stream, so the second
// graph reuses the block the first one's temporary left in the pool (the caching
// allocator hands a freed block only to its own stream): the memory estimate's
// largest-graph budget holds.
TEST_P(CapturedStepTest, GraphsOfOnePoolReuseEachOthersTemporaries) {
  if (!device().is_cuda()) GTEST_SKIP() << "a CPU step captures no graph and reserves no pool";
  const auto reserved = [&] {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device().index()).reserved_bytes[0].current;
  };
  const int64_t n = int64_t{16} << 20;  // 64 MiB of float32 per temporary
  at::Tensor total = at::zeros({}, at::TensorOptions().device(device()));
  const auto pool = std::make_shared<GraphPool>(device());
  const StepFunction step = [&](const std::vector<at::Tensor>& in) { total.add_((in[0] * 2).sum()); };
  CapturedStep a("a", device(), {{"x", {n}}}, step, CaptureOptions().log([](auto&) {}), pool);
  CapturedStep b("b", device(), {{"x", {n}}}, step, CaptureOptions().log([](auto&) {}), pool);
  for (int i = 0; i < 5; ++i) a.run();
  ASSERT_EQ(a.mode(), StepMode::kGraph);
  const int64_t after_a = reserved();
  for (int i = 0; i < 5; ++i) b.run();
  ASSERT_EQ(b.mode(), StepMode::kGraph);
  EXPECT_LT(reserved() - after_a, n * 4 / 2) << "the second graph took a new block for its temporary";
}

TEST_P(CapturedStepTest, WarmupStepsMustBePositive) {
  Accumulator a(device());
  const std::string what =
      error_of([&] { CapturedStep("acc", device(), {}, a.step(), CaptureOptions().warmup_steps(0)); });
  EXPECT_TRUE(contains(what, "warmup_steps must be at least 1")) << what;
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(CapturedStepTest);

// The life cycle through a scripted backend, on any machine: warm-up runs the step
// (reporting a host synchronization on the warm-up call asked to), capture records
// the step without running it — as a CUDA graph capture does — or fails when asked,
// replay runs what was recorded.
struct Script {
  int64_t sync_at_warm_up = -1;  // 1-based warm-up call that "synchronizes the host"; -1: none
  bool fail_capture = false;
  int64_t warm_ups = 0, captures = 0, replays = 0;
};

class ScriptedBackend : public GraphBackend {
 public:
  explicit ScriptedBackend(Script& script) : script_(script) {}
  std::string warm_up(const std::function<void()>& step) override {
    step();
    return ++script_.warm_ups == script_.sync_at_warm_up ? "it synchronizes the host (scripted)" : "";
  }
  void capture(const std::function<void()>& step) override {
    ++script_.captures;
    if (script_.fail_capture) throw std::runtime_error("scripted capture failure\nsecond line");
    recorded_ = step;
  }
  void replay() override {
    ++script_.replays;
    recorded_();
  }
  std::vector<std::pair<std::string, int64_t>> nodes_by_kind() const override { return {{"kernel", 2}}; }

 private:
  Script& script_;
  std::function<void()> recorded_;
};

// Runs 10 calls of the accumulator step through `script` and through the eager step;
// both must end equal, every call one step.
struct ScriptedRun {
  explicit ScriptedRun(Script& script)
      : step(
            "acc", c10::kCPU, {{"x", {3}}}, captured.step(),
            CaptureOptions().warmup_steps(3).log([this](const std::string& m) { log.push_back(m); }).backend([&script] {
              return std::make_unique<ScriptedBackend>(script);
            })) {
    CapturedStep reference("acc", c10::kCPU, {{"x", {3}}}, eager.step(),
                           CaptureOptions().capture(false).log([](auto&) {}));
    for (int i = 0; i < 10; ++i) {
      const at::Tensor x = at::full({3}, static_cast<double>(i % 4 + 1));
      step.run({x});
      reference.run({x});
    }
  }
  Accumulator captured{c10::kCPU}, eager{c10::kCPU};
  std::vector<std::string> log;
  CapturedStep step;
};

TEST(CapturedStepLifecycle, WarmsUpThenCapturesOnceAndReplaysEveryLaterCall) {
  Script script;
  ScriptedRun run(script);
  EXPECT_EQ(run.step.mode(), StepMode::kGraph);
  EXPECT_EQ(run.step.captures(), 1);
  EXPECT_EQ(run.step.graph_nodes(), 2);
  EXPECT_EQ(script.warm_ups, 3);
  EXPECT_EQ(script.replays, 7) << "the capturing call replays once, then calls 5..10";
  EXPECT_EQ(run.captured.counter.item<double>(), 10);
  EXPECT_TRUE(all_equal(run.captured.acc, run.eager.acc));
  EXPECT_TRUE(run.log.empty());
}

TEST(CapturedStepLifecycle, AWarmUpThatSynchronizesTheHostGoesOnEagerlyWithoutRepeatingTheStep) {
  Script script;
  script.sync_at_warm_up = 2;
  ScriptedRun run(script);
  EXPECT_EQ(run.step.mode(), StepMode::kEager);
  EXPECT_EQ(script.warm_ups, 2) << "no warm-up after the one that synchronized";
  EXPECT_EQ(script.captures, 0) << "no capture is tried";
  EXPECT_EQ(run.captured.counter.item<double>(), 10) << "the warm-up step counted once, every call one step";
  EXPECT_TRUE(all_equal(run.captured.acc, run.eager.acc));
  ASSERT_EQ(run.log.size(), 1u) << "the reason is logged once";
  EXPECT_TRUE(contains(run.log[0], "step 'acc' runs eagerly: it cannot be captured as a CUDA graph: it synchronizes"))
      << run.log[0];
}

TEST(CapturedStepLifecycle, AFailedCaptureRunsThatCallsStepEagerlyAndEveryLaterOne) {
  Script script;
  script.fail_capture = true;
  ScriptedRun run(script);
  EXPECT_EQ(run.step.mode(), StepMode::kEager);
  EXPECT_EQ(run.step.captures(), 0);
  EXPECT_EQ(script.captures, 1) << "a capture that failed is not retried";
  EXPECT_EQ(script.replays, 0);
  EXPECT_EQ(run.captured.counter.item<double>(), 10) << "the failed capture's call ran its step: none lost";
  EXPECT_TRUE(all_equal(run.captured.acc, run.eager.acc));
  ASSERT_EQ(run.log.size(), 1u);
  EXPECT_TRUE(contains(run.log[0], "its capture failed: scripted capture failure")) << run.log[0];
  EXPECT_FALSE(contains(run.log[0], "second line")) << "one line";
}

class GraphCacheTest : public DeviceTest {};

TEST_P(GraphCacheTest, OneStepPerShapeUpToCapacityThenEagerAndLoggedOnce) {
  std::vector<std::string> log;
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device()));
  GraphCache cache(
      "sum", device(), {{"x", 2, at::kFloat}}, [&](const std::vector<at::Tensor>& in) { total.add_(in[0].sum()); },
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
  GraphCache cache(
      "sum", device(), {{"x", 2, at::kFloat}}, [](const std::vector<at::Tensor>&) {},
      CaptureOptions().log([](auto&) {}));
  const auto opts = at::TensorOptions().device(device());
  const std::string rank = error_of([&] { cache.run({at::ones({4}, opts)}); });
  EXPECT_TRUE(contains(rank, "input 'x' must be a 2-d Float tensor")) << rank;
  EXPECT_TRUE(contains(rank, "got [4] Float")) << rank;
  const std::string dtype = error_of([&] { cache.run({at::ones({4, 2}, opts.dtype(at::kLong))}); });
  EXPECT_TRUE(contains(dtype, "got [4, 2] Long")) << dtype;
  EXPECT_EQ(cache.size(), 0u);
}

// "cuda" (no index) names the current device: the cache, its pool and its steps
// accept the device's own (indexed) tensors.
TEST_P(GraphCacheTest, AnUnindexedDeviceIsIndexedAtTheBoundary) {
  const c10::Device unindexed(device().type());
  EXPECT_EQ(indexed_device(unindexed), device().is_cuda() ? c10::Device(c10::kCUDA, 0) : unindexed);
  EXPECT_EQ(GraphPool(unindexed).device(), indexed_device(unindexed));
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device()));
  GraphCache cache(
      "sum", unindexed, {{"x", 1, at::kFloat}}, [&](const std::vector<at::Tensor>& in) { total.add_(in[0].sum()); },
      CaptureOptions().log([](auto&) {}));
  for (int i = 0; i < 5; ++i) cache.run({at::ones({4}, at::TensorOptions().device(device()))});
  EXPECT_EQ(total.item<double>(), 20.0);
  if (device().is_cuda()) {
    EXPECT_EQ(cache.find({{4}})->mode(), StepMode::kGraph);
  }
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(GraphCacheTest);

}  // namespace
