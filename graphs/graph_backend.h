// GraphBackend: what CapturedStep asks of a device to warm a step up, capture it
// and replay it. The product's backend is CUDA graphs on a side stream
// (make_cuda_graph_backend); a test substitutes a scripted one to drive the life
// cycle — failed warm-ups and captures included — on a machine without a GPU.
#pragma once

#include "packtrain/graphs/graph_pool.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace packtrain::graphs {

class GraphBackend {
 public:
  virtual ~GraphBackend() = default;
  // Runs `step` once, eagerly, as capture will run it. Returns empty, or why the
  // step cannot be captured (it synchronized the host): it still ran exactly once,
  // to the end. Any other error propagates.
  virtual std::string warm_up(const std::function<void()>& step) = 0;
  // Records `step` into a graph without performing it. On failure throws, having
  // applied nothing of the step, and leaves the device usable for eager steps.
  virtual void capture(const std::function<void()>& step) = 0;
  // Performs the captured step once.
  virtual void replay() = 0;
  // The captured graph's nodes by kind, in this order: kernel, memset, memcpy,
  // event (record/wait), host, other.
  virtual std::vector<std::pair<std::string, int64_t>> nodes_by_kind() const = 0;
};

// Makes the backend of one step (each step owns its graph).
using GraphBackendFactory = std::function<std::unique_ptr<GraphBackend>()>;

// CUDA graphs for a step on `device` (indexed), capturing into `pool`.
std::unique_ptr<GraphBackend> make_cuda_graph_backend(c10::Device device, std::shared_ptr<GraphPool> pool);

}  // namespace packtrain::graphs
