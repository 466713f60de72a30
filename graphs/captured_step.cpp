#include "packtrain/graphs/captured_step.h"

#include "packtrain/graphs/capture_error.h"
#include "packtrain/profiling/nvtx.h"

#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/Exceptions.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <cuda_runtime_api.h>

#include <sstream>

namespace packtrain::graphs {

// CUDA state: one side stream for every warm-up call and the capture (cuBLAS keeps
// a workspace per stream, so warm-up prepares exactly what capture will use), and
// the graph, kept (keep_graph) so its nodes can be counted.
struct CapturedStep::Graph {
  explicit Graph(c10::cuda::CUDAStream s) : side(s) {}
  c10::cuda::CUDAStream side;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
};

std::string describe(const at::Tensor& tensor) {
  if (!tensor.defined()) return "an undefined tensor";
  std::ostringstream out;
  out << tensor.sizes() << ' ' << c10::toString(tensor.scalar_type()) << " on " << tensor.device();
  return out.str();
}

namespace {

std::string describe(const StaticInput& spec, c10::Device device) {
  std::ostringstream out;
  out << c10::IntArrayRef(spec.shape) << ' ' << c10::toString(spec.dtype) << " on " << device;
  return out.str();
}

// Host synchronization is an error while this guard lives (c10's sync debug mode).
class RefuseHostSync {
 public:
  RefuseHostSync() : previous_(c10::cuda::warning_state().get_sync_debug_mode()) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~RefuseHostSync() { c10::cuda::warning_state().set_sync_debug_mode(previous_); }
  RefuseHostSync(const RefuseHostSync&) = delete;
  RefuseHostSync& operator=(const RefuseHostSync&) = delete;

 private:
  c10::cuda::SyncDebugMode previous_;
};

// Orders `from` before `to`: work issued later on `to` waits for what `from` holds now.
void wait_for(const c10::cuda::CUDAStream& from, const c10::cuda::CUDAStream& to) {
  at::cuda::CUDAEvent event;
  event.record(from);
  event.block(to);
}

// Runs `body` on `side` after everything already issued on the ambient stream, and
// makes the ambient stream wait for the side stream however `body` exits.
template <typename Body>
void on_side_stream(const c10::cuda::CUDAStream& side, Body&& body) {
  const c10::cuda::CUDAStream ambient = c10::cuda::getCurrentCUDAStream(side.device_index());
  wait_for(ambient, side);
  struct Rejoin {
    const c10::cuda::CUDAStream& side;
    const c10::cuda::CUDAStream& ambient;
    ~Rejoin() {
      try {
        wait_for(side, ambient);
      } catch (...) {  // never throw from a destructor; the original error propagates
      }
    }
  } rejoin{side, ambient};
  c10::cuda::CUDAStreamGuard stream_guard(side);
  body();
}

bool is_host_sync_error(const std::string& what) {
  return what.find("synchronizing CUDA operation") != std::string::npos ||
         what.find("stream is capturing") != std::string::npos ||
         what.find("during capture") != std::string::npos ||
         (what.find("capture") != std::string::npos && what.find("invalidated") != std::string::npos);
}

std::string sync_refusal(const std::string& step, const std::string& where, const std::string& what) {
  return "step '" + step + "' cannot be captured as a CUDA graph: " + where +
         " it synchronizes the host with the device (an .item(), .cpu(), nonzero, or a shape that depends on "
         "data) or makes another CUDA call that capture forbids. Keep everything the step reads and writes on "
         "the device, or run it with capture off. LibTorch said: " +
         what.substr(0, what.find('\n'));
}

}  // namespace

CapturedStep::CapturedStep(std::string name, c10::Device device, std::vector<StaticInput> inputs, StepFunction step,
                           CaptureOptions options, std::shared_ptr<GraphPool> pool)
    : name_(std::move(name)),
      device_(device),
      specs_(std::move(inputs)),
      step_(std::move(step)),
      options_(std::move(options)),
      pool_(std::move(pool)) {
  TORCH_CHECK(step_, "step '", name_, "': no step function");
  TORCH_CHECK(device_.is_cpu() || device_.is_cuda(), "step '", name_, "': unsupported device ", device_);
  TORCH_CHECK(options_.warmup_steps() >= 1, "step '", name_, "': warmup_steps must be at least 1, got ",
              options_.warmup_steps());
  if (!options_.log()) options_.log(log_to_stderr);
  for (const StaticInput& spec : specs_) {
    static_inputs_.push_back(at::zeros(spec.shape, at::TensorOptions().dtype(spec.dtype).device(device_)));
  }
  if (!options_.capture()) {
    fall_back("capture is switched off");
  } else if (device_.is_cpu()) {
    fall_back("the device is the CPU (CUDA graphs need a CUDA device)");
  } else {
    mode_ = StepMode::kWarmingUp;
    if (device_.index() < 0) device_ = c10::Device(c10::kCUDA, c10::cuda::current_device());
    cuda_ = std::make_unique<Graph>(c10::cuda::getStreamFromPool(false, device_.index()));
    if (!pool_) pool_ = std::make_shared<GraphPool>(device_);
    TORCH_CHECK(pool_->device() == device_, "step '", name_, "': graph pool is on ", pool_->device(),
                ", the step on ", device_);
  }
}

CapturedStep::~CapturedStep() = default;

void CapturedStep::fall_back(std::string reason) {
  mode_ = StepMode::kEager;
  eager_reason_ = std::move(reason);
  fallback_logged_ = false;  // said at the next eager call
}

void CapturedStep::run(const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(inputs.size() == specs_.size(), "step '", name_, "' takes ", specs_.size(), " inputs, got ",
              inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& in = inputs[i];
    const at::Tensor& buffer = static_inputs_[i];
    const bool same = in.defined() && in.sizes() == buffer.sizes() && in.scalar_type() == buffer.scalar_type() &&
                      in.device() == buffer.device();
    TORCH_CHECK(same, "step '", name_, "': input '", specs_[i].name, "' must be ", describe(specs_[i], device_),
                " (its static buffer), got ", describe(in));
    if (in.is_same(buffer)) continue;
    buffer.copy_(in, /*non_blocking=*/true);
  }
  run();
}

void CapturedStep::run() {
  ++calls_;
  switch (mode_) {
    case StepMode::kEager: return run_eager();
    case StepMode::kWarmingUp: return warm_up();
    case StepMode::kGraph: {
      PACKTRAIN_NVTX_RANGE("replay");
      cuda_->graph->replay();
      return;
    }
  }
}

void CapturedStep::run_eager() {
  if (!fallback_logged_) {
    fallback_logged_ = true;
    options_.log()("step '" + name_ + "' runs eagerly: " + eager_reason_);
  }
  PACKTRAIN_NVTX_RANGE("step");
  step_(static_inputs_);
}

void CapturedStep::warm_up() {
  if (warmed_up_ == options_.warmup_steps()) return capture();
  PACKTRAIN_NVTX_RANGE("warmup");
  c10::cuda::CUDAGuard device_guard(device_);
  on_side_stream(cuda_->side, [&] {
    RefuseHostSync refuse;
    try {
      step_(static_inputs_);
    } catch (const c10::Error& e) {
      if (std::string(e.what()).find("synchronizing CUDA operation") != std::string::npos) {
        fall_back("it synchronizes the host (refused during warm-up)");
        throw CaptureError(sync_refusal(name_, "during warm-up", e.what_without_backtrace()));
      }
      throw;
    }
  });
  ++warmed_up_;
}

namespace {
// The captured graph's nodes by kind: what a step costs the device besides its
// kernels (each memset or copy node is a launch of its own on replay).
std::vector<std::pair<std::string, int64_t>> count_nodes_by_kind(cudaGraph_t graph) {
  size_t n = 0;
  AT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) AT_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::vector<std::pair<std::string, int64_t>> counts{{"kernel", 0}, {"memset", 0}, {"memcpy", 0},
                                                      {"event", 0},  {"host", 0},   {"other", 0}};
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    AT_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    switch (type) {
      case cudaGraphNodeTypeKernel: ++counts[0].second; break;
      case cudaGraphNodeTypeMemset: ++counts[1].second; break;
      case cudaGraphNodeTypeMemcpy: ++counts[2].second; break;
      case cudaGraphNodeTypeEventRecord:
      case cudaGraphNodeTypeWaitEvent: ++counts[3].second; break;
      case cudaGraphNodeTypeHost: ++counts[4].second; break;
      default: ++counts[5].second; break;
    }
  }
  return counts;
}
}  // namespace

void CapturedStep::capture() {
  {
    PACKTRAIN_NVTX_RANGE("capture");
    c10::cuda::CUDAGuard device_guard(device_);
    auto graph = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true);
    on_side_stream(cuda_->side, [&] {
      graph->capture_begin(pool_->id(), cudaStreamCaptureModeGlobal);
      try {
        step_(static_inputs_);
      } catch (const std::exception& e) {
        // End the broken capture so the stream and the allocator are usable again.
        // Each end call on its own: recent PyTorch ends the pools inside capture_end()
        // before it reports the broken capture, and ending them twice would throw a
        // second error that hides the first.
        try {
          graph->capture_end();
        } catch (const std::exception&) {
          try {
            c10::cuda::CUDACachingAllocator::endAllocateToPool(device_.index(), pool_->id());
          } catch (const std::exception&) {
          }
          try {
            at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool_->id());
          } catch (const std::exception&) {
          }
        }
        (void)cudaGetLastError();  // capture errors are not sticky; clear the last one
        const c10::Error* torch_error = dynamic_cast<const c10::Error*>(&e);
        const std::string what = torch_error ? torch_error->what_without_backtrace() : e.what();
        // Later calls run eagerly (logged) instead of retrying a capture that fails.
        fall_back("its capture failed: " + what.substr(0, what.find('\n')));
        if (is_host_sync_error(what)) throw CaptureError(sync_refusal(name_, "during capture", what));
        throw;
      }
      graph->capture_end();
    });
    graph_nodes_by_kind_ = count_nodes_by_kind(graph->raw_cuda_graph());
    graph_nodes_ = 0;
    for (const auto& [kind, n] : graph_nodes_by_kind_) graph_nodes_ += n;
    graph->instantiate();
    cuda_->graph = std::move(graph);
    mode_ = StepMode::kGraph;
    ++captures_;
  }
  PACKTRAIN_NVTX_RANGE("replay");
  cuda_->graph->replay();  // capture only recorded the step; this call performs it
}

}  // namespace packtrain::graphs
