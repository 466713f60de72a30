// NVTX ranges reach an NVTX tool: this binary runs with NVTX_INJECTION64_PATH set
// to tests/profiling/nvtx_recorder.cpp's library (as Nsight Systems injects its
// own), which records pushes and pops in the `packtrain` domain.
#include "packtrain/profiling/nvtx.h"
#include "packtrain/runtime/measure/synthetic_workload.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {

using packtrain::profiling::NvtxRange;

class NvtxInjection : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!packtrain::profiling::nvtx_compiled_in()) GTEST_SKIP() << "packtrain was built without NVTX";
    const char* path = std::getenv("NVTX_INJECTION64_PATH");
    if (path == nullptr) GTEST_SKIP() << "NVTX_INJECTION64_PATH is not set (run this test through ctest)";
    {
      NvtxRange first("init");  // the first NVTX call loads the injection library
    }
    handle_ = ::dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(handle_, nullptr) << "NVTX did not load the injection library " << path;
    events_ = reinterpret_cast<size_t (*)(char*, size_t)>(::dlsym(handle_, "packtrain_nvtx_recorder_events"));
    clear_ = reinterpret_cast<void (*)()>(::dlsym(handle_, "packtrain_nvtx_recorder_clear"));
    ASSERT_NE(events_, nullptr);
    ASSERT_NE(clear_, nullptr);
    clear_();
  }
  void TearDown() override {
    if (handle_ != nullptr) ::dlclose(handle_);
  }

  std::vector<std::string> recorded() const {
    std::string text(events_(nullptr, 0) + 1, '\0');
    events_(text.data(), text.size());
    std::vector<std::string> lines;
    std::istringstream in(text.c_str());
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  void* handle_ = nullptr;
  size_t (*events_)(char*, size_t) = nullptr;
  void (*clear_)() = nullptr;
};

TEST_F(NvtxInjection, NestedRangesArePushedAndPoppedInOrder) {
  {
    NvtxRange step("step");
    { NvtxRange forward("forward"); }
    { PACKTRAIN_NVTX_RANGE("backward"); }
  }
  const std::vector<std::string> expected{"+step", "+forward", "-", "+backward", "-", "-"};
  EXPECT_EQ(recorded(), expected);
}

TEST_F(NvtxInjection, ATrainingEpochEmitsItsPhases) {
  packtrain::runtime::SyntheticWorkload w(
      packtrain::runtime::WorkloadOptions().members(4).hidden(8).batch(16).unroll(2).log([](const std::string&) {}));
  clear_();  // what construction emitted (its first shuffle) is not part of the epoch
  w.steps().run_epoch();
  w.steps().evaluate(w.steps().batcher().data()[0], w.steps().batcher().data()[1]);
  const std::vector<std::string> events = recorded();
  const auto count = [&](const std::string& e) { return std::count(events.begin(), events.end(), e); };
  EXPECT_EQ(count("+epoch"), 1);
  EXPECT_EQ(count("+shuffle"), 1);
  // On CPU the step is the fused member-wise one: one range for forward and backward.
  EXPECT_EQ(count("+forward+backward"), w.steps().steps_per_epoch());
  EXPECT_EQ(count("+forward"), 0);
  EXPECT_EQ(count("+backward"), 0);
  EXPECT_EQ(count("+optimizer"), w.steps().steps_per_epoch());
  EXPECT_EQ(count("+gather"), w.steps().steps_per_epoch());
  EXPECT_GE(count("+eval"), 1);
  int64_t pushes = 0;
  for (const std::string& e : events) pushes += e[0] == '+';
  EXPECT_EQ(count("-"), pushes) << "every range pushed is popped";
}

}  // namespace
