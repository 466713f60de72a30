// ExactFloat32Scope: IEEE float32 convolutions and matmuls and deterministic cuDNN
// inside, the user's own settings back outside, however scopes nest or overlap.
// The flags are process-wide and readable without a GPU, so this runs everywhere;
// what they do to a GPU step is tested by the CUDA resume tests (a CNN pack resumed
// from a checkpoint equals the uninterrupted run, runtime_tests).

#include "packtrain/ensemble/float32_arithmetic.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace packtrain::ensemble {
namespace {

using at::Float32Backend, at::Float32Op, at::Float32Precision;

struct Flags {
  Float32Precision conv, matmul;
  bool deterministic;
  bool operator==(const Flags&) const = default;
};

Flags now() {
  const at::Context& c = at::globalContext();
  return {c.float32Precision(Float32Backend::CUDA, Float32Op::CONV),
          c.float32Precision(Float32Backend::CUDA, Float32Op::MATMUL), c.deterministicCuDNN()};
}

void set(const Flags& f) {
  at::Context& c = at::globalContext();
  c.setFloat32Precision(Float32Backend::CUDA, Float32Op::CONV, f.conv);
  c.setFloat32Precision(Float32Backend::CUDA, Float32Op::MATMUL, f.matmul);
  c.setDeterministicCuDNN(f.deterministic);
}

const Flags kExact{Float32Precision::IEEE, Float32Precision::IEEE, true};
const Flags kUsers{Float32Precision::TF32, Float32Precision::TF32, false};  // a user who asked for TF32

class ExactFloat32 : public ::testing::Test {
 protected:
  void SetUp() override {
    before_ = now();
    set(kUsers);
  }
  void TearDown() override { set(before_); }
  Flags before_{};
};

TEST_F(ExactFloat32, InsideTheScopeFloat32IsIeeeAndCudnnDeterministicOutsideTheUsersSettingsStand) {
  {
    const ExactFloat32Scope exact;
    EXPECT_EQ(now(), kExact);
  }
  EXPECT_EQ(now(), kUsers);
}

TEST_F(ExactFloat32, ANestedScopeClosingLeavesTheOuterOneExact) {
  {
    const ExactFloat32Scope outer;
    { const ExactFloat32Scope inner; }
    EXPECT_EQ(now(), kExact) << "the inner scope restored the user's flags while the outer one was open";
  }
  EXPECT_EQ(now(), kUsers);
}

TEST_F(ExactFloat32, ScopesOverlappingInThreadsSeeExactFlagsUntilTheLastCloses) {
  std::atomic<int> not_exact{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        const ExactFloat32Scope exact;
        if (!(now() == kExact)) ++not_exact;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(not_exact.load(), 0);
  EXPECT_EQ(now(), kUsers);
}

}  // namespace
}  // namespace packtrain::ensemble
