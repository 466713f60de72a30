// GraphCache: a small, bounded set of CapturedSteps of one step function, one per
// input shape signature, for the few shapes a run really has (the full batch, a
// last partial batch, an eval batch). Shapes beyond the capacity run eagerly, and
// each such shape is logged once, so a run that keeps changing shapes is visible
// instead of silently re-capturing.
#pragma once

#include "packtrain/graphs/captured_step.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace packtrain::graphs {

// What a cache's inputs share whatever their shapes: name, rank and dtype.
struct InputKind {
  std::string name;
  int64_t rank = 1;
  c10::ScalarType dtype = c10::ScalarType::Float;
};

class GraphCache {
 public:
  GraphCache(std::string name, c10::Device device, std::vector<InputKind> inputs, StepFunction step,
             CaptureOptions options = {}, std::shared_ptr<GraphPool> pool = nullptr, size_t capacity = 4);

  // Runs one step on `inputs` through the step captured for their shapes (created
  // on first sight), or eagerly once the cache is full. Throws naming the expected
  // and given input when a rank, dtype or device differs.
  void run(const std::vector<at::Tensor>& inputs);

  size_t size() const { return steps_.size(); }
  size_t capacity() const { return capacity_; }
  // The step for these shapes, or null (not seen yet, or beyond capacity).
  const CapturedStep* find(const std::vector<std::vector<int64_t>>& shapes) const;
  int64_t eager_overflow_calls() const { return overflow_calls_; }

 private:
  std::string name_;
  c10::Device device_;
  std::vector<InputKind> kinds_;
  StepFunction step_;
  CaptureOptions options_;
  std::shared_ptr<GraphPool> pool_;
  size_t capacity_;
  std::map<std::vector<std::vector<int64_t>>, std::unique_ptr<CapturedStep>> steps_;
  std::map<std::vector<std::vector<int64_t>>, bool> overflow_logged_;
  int64_t overflow_calls_ = 0;
};

}  // namespace packtrain::graphs
