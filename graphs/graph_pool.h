// The memory pool that all graphs of one trainer capture into. Graphs that share it
// reuse each other's temporaries, which is safe because a trainer's graphs (train,
// eval, unrolled variants) run one at a time on one stream.
#pragma once

#include <c10/core/Device.h>

#include <utility>

namespace packtrain::graphs {

class GraphPool {
 public:
  // On a CUDA device, a fresh pool id (at::cuda::graph_pool_handle); on CPU, none.
  explicit GraphPool(c10::Device device);

  c10::Device device() const { return device_; }
  // at::cuda::MempoolId_t, spelled without CUDA headers.
  std::pair<unsigned long long, unsigned long long> id() const { return id_; }

 private:
  c10::Device device_;
  std::pair<unsigned long long, unsigned long long> id_{0, 0};
};

}  // namespace packtrain::graphs
