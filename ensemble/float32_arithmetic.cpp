#include "packtrain/ensemble/float32_arithmetic.h"

#include <ATen/Context.h>

#include <mutex>

namespace packtrain::ensemble {

namespace {

using at::Float32Backend, at::Float32Op, at::Float32Precision;

// The flags before the first open scope, and how many scopes are open.
struct Saved {
  std::mutex mutex;
  int open = 0;
  Float32Precision conv = Float32Precision::NONE, matmul = Float32Precision::NONE;
  bool deterministic = false;
};

Saved& saved() {
  static Saved s;
  return s;
}

}  // namespace

ExactFloat32Scope::ExactFloat32Scope() {
  Saved& s = saved();
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (s.open++ > 0) return;
  at::Context& context = at::globalContext();
  s.conv = context.float32Precision(Float32Backend::CUDA, Float32Op::CONV);
  s.matmul = context.float32Precision(Float32Backend::CUDA, Float32Op::MATMUL);
  s.deterministic = context.deterministicCuDNN();
  context.setFloat32Precision(Float32Backend::CUDA, Float32Op::CONV, Float32Precision::IEEE);
  context.setFloat32Precision(Float32Backend::CUDA, Float32Op::MATMUL, Float32Precision::IEEE);
  context.setDeterministicCuDNN(true);
}

ExactFloat32Scope::~ExactFloat32Scope() {
  Saved& s = saved();
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (--s.open > 0) return;
  at::Context& context = at::globalContext();
  context.setFloat32Precision(Float32Backend::CUDA, Float32Op::CONV, s.conv);
  context.setFloat32Precision(Float32Backend::CUDA, Float32Op::MATMUL, s.matmul);
  context.setDeterministicCuDNN(s.deterministic);
}

}  // namespace packtrain::ensemble
