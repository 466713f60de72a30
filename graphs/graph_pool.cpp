#include "packtrain/graphs/graph_pool.h"

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

}  // namespace packtrain::graphs
