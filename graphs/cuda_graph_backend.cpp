// The CUDA backend of CapturedStep: warm-up and capture on the pool's one side
// stream (cuBLAS keeps a workspace per stream, so warm-up prepares exactly what
// capture will use, and every graph of the pool reuses the others' freed blocks),
// capture into the trainer's pool, the graph kept (keep_graph) so its nodes can be
// counted.
#include "packtrain/graphs/graph_backend.h"

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

#include <stdexcept>

namespace packtrain::graphs {

namespace {

constexpr const char* kSyncWarning = "synchronizing CUDA operation";

// Notes host synchronization while it lives instead of refusing it: c10's sync debug
// mode warns, and the warnings that say so are counted here (autograd replays the
// warnings of its device threads on the calling thread, so backward's are seen too)
// while every other warning goes on to the handler that was there before.
class NoteHostSync : public c10::WarningHandler {
 public:
  NoteHostSync()
      : previous_mode_(c10::cuda::warning_state().get_sync_debug_mode()),
        previous_handler_(c10::WarningUtils::get_warning_handler()) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
    c10::WarningUtils::set_warning_handler(this);
  }
  ~NoteHostSync() override {
    c10::WarningUtils::set_warning_handler(previous_handler_);
    c10::cuda::warning_state().set_sync_debug_mode(previous_mode_);
  }
  NoteHostSync(const NoteHostSync&) = delete;
  NoteHostSync& operator=(const NoteHostSync&) = delete;

  void process(const c10::Warning& warning) override {
    if (warning.msg().find(kSyncWarning) != std::string::npos) {
      ++synchronizations_;
    } else if (previous_handler_ != nullptr) {
      previous_handler_->process(warning);
    }
  }
  int64_t synchronizations() const { return synchronizations_; }

 private:
  c10::cuda::SyncDebugMode previous_mode_;
  c10::WarningHandler* previous_handler_;
  int64_t synchronizations_ = 0;
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
  return what.find(kSyncWarning) != std::string::npos || what.find("stream is capturing") != std::string::npos ||
         what.find("during capture") != std::string::npos ||
         (what.find("capture") != std::string::npos && what.find("invalidated") != std::string::npos);
}

constexpr const char* kWhatToChange =
    " (an .item(), .cpu(), nonzero, or a shape that depends on data) or makes another CUDA call that capture "
    "forbids; keep everything the step reads and writes on the device to have it captured";

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

class CudaGraphBackend : public GraphBackend {
 public:
  CudaGraphBackend(c10::Device device, std::shared_ptr<GraphPool> pool)
      : device_(device), pool_(std::move(pool)), side_(c10::cuda::CUDAStream(pool_->capture_stream())) {}

  std::string warm_up(const std::function<void()>& step) override {
    c10::cuda::CUDAGuard device_guard(device_);
    int64_t synchronizations = 0;
    on_side_stream(side_, [&] {
      NoteHostSync note;
      step();
      synchronizations = note.synchronizations();
    });
    if (synchronizations == 0) return {};
    return "it synchronizes the host with the device (" + std::to_string(synchronizations) +
           " time(s) in a warm-up step)" + kWhatToChange;
  }

  void capture(const std::function<void()>& step) override {
    c10::cuda::CUDAGuard device_guard(device_);
    auto graph = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true);
    on_side_stream(side_, [&] {
      graph->capture_begin(pool_->id(), cudaStreamCaptureModeGlobal);
      try {
        step();
      } catch (const std::exception& e) {
        end_broken_capture(*graph);
        const c10::Error* torch_error = dynamic_cast<const c10::Error*>(&e);
        std::string what = torch_error ? torch_error->what_without_backtrace() : e.what();
        what = what.substr(0, what.find('\n'));
        if (is_host_sync_error(what))
          what = "it synchronizes the host with the device" + std::string(kWhatToChange) + " (LibTorch said: " + what +
                 ")";
        throw std::runtime_error(what);
      }
      graph->capture_end();
    });
    nodes_by_kind_ = count_nodes_by_kind(graph->raw_cuda_graph());
    graph->instantiate();
    graph_ = std::move(graph);
  }

  void replay() override { graph_->replay(); }

  std::vector<std::pair<std::string, int64_t>> nodes_by_kind() const override { return nodes_by_kind_; }

 private:
  // Ends a capture the step broke, so the stream and the allocator are usable again.
  // Each end call on its own: recent PyTorch ends the pools inside capture_end()
  // before it reports the broken capture, and ending them twice would throw a second
  // error that hides the first.
  void end_broken_capture(at::cuda::CUDAGraph& graph) {
    try {
      graph.capture_end();
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
  }

  c10::Device device_;
  std::shared_ptr<GraphPool> pool_;
  c10::cuda::CUDAStream side_;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  std::vector<std::pair<std::string, int64_t>> nodes_by_kind_;
};

}  // namespace

std::unique_ptr<GraphBackend> make_cuda_graph_backend(c10::Device device, std::shared_ptr<GraphPool> pool) {
  TORCH_CHECK(device.is_cuda() && device.index() >= 0, "a CUDA graph backend needs an indexed CUDA device, got ",
              device);
  return std::make_unique<CudaGraphBackend>(device, std::move(pool));
}

}  // namespace packtrain::graphs
