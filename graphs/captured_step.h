// CapturedStep: one step function over static buffers, captured once as a CUDA
// graph and replayed. It knows nothing about what the step computes (ensembles,
// multi-task models and data-parallel runs all use it).
//
// Life of a CUDA step: the first `warmup_steps` calls run eagerly on a side stream
// (cuBLAS workspaces, autograd state), the next call captures the step into the
// shared pool and replays it, every later call only replays. A step that
// synchronizes the host during warm-up, or whose capture fails, runs eagerly from
// then on, the reason logged once: the warm-up step that synchronized still ran to
// its end, and the call whose capture failed (capture performs nothing) runs its step
// eagerly, so each call performs exactly one step and results equal the eager step's
// call for call. On CPU, or with capture off, every call runs the same function
// eagerly, and the reason is logged at the first call. The device work goes through
// a GraphBackend (graph_backend.h): CUDA graphs, or a test's scripted stand-in.
#pragma once

#include "packtrain/base/enum_names.h"

#include "packtrain/graphs/graph_backend.h"
#include "packtrain/graphs/graph_log.h"
#include "packtrain/graphs/graph_pool.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace packtrain::graphs {

// One static input buffer: its name (for errors), shape and dtype.
struct StaticInput {
  std::string name;
  std::vector<int64_t> shape;
  c10::ScalarType dtype = c10::ScalarType::Float;
};

// Reads the static inputs (in declaration order) and writes only into tensors that
// exist before capture (parameters, gradients, optimizer state, accumulators).
using StepFunction = std::function<void(const std::vector<at::Tensor>& inputs)>;

struct CaptureOptions {
  /// Example: CaptureOptions().capture(false).warmup_steps(5)
  TORCH_ARG(bool, capture) = true;       // false: always eager (logged once)
  TORCH_ARG(int64_t, warmup_steps) = 3;  // eager calls before capture, at least 1
  TORCH_ARG(GraphLog, log) = log_to_stderr;
  // Null: CUDA graphs on a CUDA device, eager on the CPU. Set: this backend warms up,
  // captures and replays on any device (tests drive the life cycle on a CPU).
  TORCH_ARG(GraphBackendFactory, backend) = nullptr;
};

enum class StepMode { kEager, kWarmingUp, kGraph };
inline constexpr EnumNames<StepMode, 3> kStepModeNames{
    "step mode", {{{StepMode::kEager, "eager"}, {StepMode::kWarmingUp, "warming up"}, {StepMode::kGraph, "graph"}}}};
inline const char* to_string(StepMode mode) { return kStepModeNames.name(mode).data(); }  // names are literals

class CapturedStep {
 public:
  // `pool`: the trainer's shared pool; a private one is made when null.
  CapturedStep(std::string name, c10::Device device, std::vector<StaticInput> inputs, StepFunction step,
               CaptureOptions options = {}, std::shared_ptr<GraphPool> pool = nullptr);
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  // Copies `inputs` into the static buffers, then runs one step. Throws naming both
  // shapes (and dtypes, devices) when an input differs from its buffer.
  void run(const std::vector<at::Tensor>& inputs);
  // Runs one step on what the static buffers already hold.
  void run();

  const std::string& name() const { return name_; }
  c10::Device device() const { return device_; }
  const std::vector<StaticInput>& input_specs() const { return specs_; }
  const std::vector<at::Tensor>& static_inputs() const { return static_inputs_; }
  StepMode mode() const { return mode_; }
  // Why the step runs eagerly; empty while it warms up or replays a graph.
  const std::string& eager_reason() const { return eager_reason_; }
  // Nodes (kernels, memsets, copies) of the captured graph; 0 before capture.
  int64_t graph_nodes() const { return graph_nodes_; }
  // The same by kind (cudaGraphNodeGetType), in a fixed order: kernel, memset,
  // memcpy, event (record/wait), host, other (empty, child graph, allocation, ...).
  // Zeros before capture.
  const std::vector<std::pair<std::string, int64_t>>& graph_nodes_by_kind() const { return graph_nodes_by_kind_; }
  int64_t calls() const { return calls_; }
  // Graphs captured so far: 1 once replaying, never more (re-initializing state in
  // place keeps the graph).
  int64_t captures() const { return captures_; }

 private:
  void run_eager();
  void warm_up();
  void capture_and_replay();
  void fall_back(std::string reason);
  void run_step() { step_(static_inputs_); }

  std::string name_;
  c10::Device device_;
  std::vector<StaticInput> specs_;
  std::vector<at::Tensor> static_inputs_;
  StepFunction step_;
  CaptureOptions options_;
  std::shared_ptr<GraphPool> pool_;
  StepMode mode_ = StepMode::kEager;
  std::string eager_reason_;
  bool fallback_logged_ = false;
  int64_t warmed_up_ = 0;
  int64_t calls_ = 0;
  int64_t graph_nodes_ = 0;
  std::vector<std::pair<std::string, int64_t>> graph_nodes_by_kind_;
  int64_t captures_ = 0;
  std::unique_ptr<GraphBackend> backend_;  // null while eager from the start
};

// "[64, 8] float32 on cuda:0": how errors name a tensor.
std::string describe(const at::Tensor& tensor);

}  // namespace packtrain::graphs
