#include "packtrain/graphs/graph_pool.h"

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

namespace packtrain::graphs {

c10::Device indexed_device(c10::Device device) {
  if (device.is_cuda() && !device.has_index()) return {c10::kCUDA, c10::cuda::current_device()};
  return device;
}

GraphPool::GraphPool(c10::Device device)
    : device_(indexed_device(device)), capture_stream_(c10::Stream::DEFAULT, device_) {
  if (device_.is_cuda()) {
    id_ = at::cuda::graph_pool_handle();
    capture_stream_ = c10::cuda::getStreamFromPool(false, device_.index()).unwrap();
  }
}

namespace {
// Work issued later on `to` waits for what `from` holds now.
void order(c10::Stream from, c10::Stream to) {
  at::cuda::CUDAEvent event;
  event.record(c10::cuda::CUDAStream(from));
  event.block(c10::cuda::CUDAStream(to));
}
}  // namespace

PoolStreamScope::PoolStreamScope(const GraphPool& pool) : stream_(pool.capture_stream()) {
  if (!pool.device().is_cuda()) return;
  caller_ = c10::cuda::getCurrentCUDAStream(pool.device().index()).unwrap();
  order(*caller_, stream_);
  c10::cuda::setCurrentCUDAStream(c10::cuda::CUDAStream(stream_));
}

PoolStreamScope::~PoolStreamScope() {
  if (!caller_) return;
  try {
    order(stream_, *caller_);
  } catch (...) {  // never throw from a destructor; an error in flight propagates
  }
  c10::cuda::setCurrentCUDAStream(c10::cuda::CUDAStream(*caller_));
}

}  // namespace packtrain::graphs
