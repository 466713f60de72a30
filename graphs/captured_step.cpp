#include "graphs/captured_step.h"

#include "graphs/capture_error.h"
#include "profiling/nvtx.h"

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

struct CapturedStep::Graph {
  at::cuda::CUDAGraph graph{/*keep_graph=*/true};  // kept so its nodes can be counted
};

const char* to_string(StepMode mode) {
  switch (mode) {
    case StepMode::kEager: return "eager";
    case StepMode::kWarmingUp: return "warming up";
    case StepMode::kGraph: return "graph";
  }
  return "?";
}

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
    if (!pool_) pool_ = std::make_shared<GraphPool>(device_);
    TORCH_CHECK(pool_->device() == device_, "step '", name_, "': graph pool is on ", pool_->device(),
                ", the step on ", device_);
  }
}

CapturedStep::~CapturedStep() = default;

void CapturedStep::fall_back(std::string reason) {
  mode_ = StepMode::kEager;
  eager_reason_ = std::move(reason);
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
      graph_->graph.replay();
      return;
    }
  }
}

void CapturedStep::run_eager() {
  if (calls_ == 1) options_.log()("step '" + name_ + "' runs eagerly: " + eager_reason_);
  PACKTRAIN_NVTX_RANGE("step");
  step_(static_inputs_);
}

void CapturedStep::warm_up() {
  if (warmed_up_ == options_.warmup_steps()) return capture();
  PACKTRAIN_NVTX_RANGE("warmup");
  const auto index = device_.index();
  c10::cuda::CUDAGuard device_guard(device_);
  const c10::cuda::CUDAStream ambient = c10::cuda::getCurrentCUDAStream(index);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, index);
  at::cuda::CUDAEvent ready;
  ready.record(ambient);
  ready.block(side);
  {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    RefuseHostSync refuse;
    try {
      step_(static_inputs_);
    } catch (const c10::Error& e) {
      if (std::string(e.what()).find("synchronizing CUDA operation") != std::string::npos) {
        throw CaptureError(sync_refusal(name_, "during warm-up", e.what_without_backtrace()));
      }
      throw;
    }
  }
  at::cuda::CUDAEvent done;
  done.record(side);
  done.block(ambient);
  ++warmed_up_;
}

void CapturedStep::capture() {
  {
    PACKTRAIN_NVTX_RANGE("capture");
    const auto index = device_.index();
    c10::cuda::CUDAGuard device_guard(device_);
    const c10::cuda::CUDAStream ambient = c10::cuda::getCurrentCUDAStream(index);
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, index);
    at::cuda::CUDAEvent ready;
    ready.record(ambient);
    ready.block(side);
    auto graph = std::make_unique<Graph>();
    {
      c10::cuda::CUDAStreamGuard stream_guard(side);
      graph->graph.capture_begin(pool_->id(), cudaStreamCaptureModeGlobal);
      try {
        step_(static_inputs_);
      } catch (const std::exception& e) {
        // End the broken capture so the stream and the allocator are usable again.
        try {
          graph->graph.capture_end();
        } catch (const std::exception&) {
          c10::cuda::CUDACachingAllocator::endAllocateToPool(index, pool_->id());
          at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool_->id());
        }
        (void)cudaGetLastError();  // capture errors are not sticky; clear the last one
        const c10::Error* torch_error = dynamic_cast<const c10::Error*>(&e);
        const std::string what = torch_error ? torch_error->what_without_backtrace() : e.what();
        if (is_host_sync_error(what)) throw CaptureError(sync_refusal(name_, "during capture", what));
        throw;
      }
      graph->graph.capture_end();
    }
    size_t nodes = 0;
    AT_CUDA_CHECK(cudaGraphGetNodes(graph->graph.raw_cuda_graph(), nullptr, &nodes));
    graph->graph.instantiate();
    graph_nodes_ = static_cast<int64_t>(nodes);
    graph_ = std::move(graph);
    mode_ = StepMode::kGraph;
    ++captures_;
  }
  PACKTRAIN_NVTX_RANGE("replay");
  graph_->graph.replay();  // capture only recorded the step; this call performs it
}

}  // namespace packtrain::graphs
