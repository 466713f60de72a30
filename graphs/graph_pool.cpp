#include "packtrain/graphs/graph_pool.h"

#include <ATen/cuda/CUDAGraph.h>

namespace packtrain::graphs {

GraphPool::GraphPool(c10::Device device) : device_(device) {
  if (device.is_cuda()) id_ = at::cuda::graph_pool_handle();
}

}  // namespace packtrain::graphs
