// The memory pool that all graphs of one trainer capture into, and the one side
// stream they all warm up and capture on. Graphs that share it reuse each other's
// temporaries — the caching allocator hands a freed block only to the stream it was
// allocated on, so one stream is what makes the sharing real — which is safe because
// a trainer's graphs (train, eval, unrolled variants, decode) run one at a time.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <optional>
#include <utility>

namespace packtrain::graphs {

// `device` with its index: an unindexed CUDA device is the current one ("cuda" ->
// "cuda:0"), so pools, steps and caches compare devices exactly. The graph layer
// indexes every device it is given at its boundary.
c10::Device indexed_device(c10::Device device);

class GraphPool {
 public:
  // On a CUDA device, a fresh pool id (at::cuda::graph_pool_handle); on CPU, none.
  // device() is indexed.
  explicit GraphPool(c10::Device device);

  c10::Device device() const { return device_; }
  // at::cuda::MempoolId_t, spelled without CUDA headers.
  std::pair<unsigned long long, unsigned long long> id() const { return id_; }
  // The side stream every graph of the pool warms up and captures on (a CUDA stream
  // from LibTorch's pool; on CPU the default stream, unused).
  c10::Stream capture_stream() const { return capture_stream_; }

 private:
  c10::Device device_;
  std::pair<unsigned long long, unsigned long long> id_{0, 0};
  c10::Stream capture_stream_;
};

// While it lives, the current stream of the pool's device is the pool's stream:
// the trainer's replays, eager steps, readbacks and collectives run there, off the
// legacy default stream (where another library's work or a pageable copy would
// serialize with them). It starts after what the caller's stream already holds, and
// at exit the caller's stream waits for it, so the caller sees every result. A
// trainer opens one around each epoch and evaluation. No-op on CPU.
class PoolStreamScope {
 public:
  explicit PoolStreamScope(const GraphPool& pool);
  ~PoolStreamScope();
  PoolStreamScope(const PoolStreamScope&) = delete;
  PoolStreamScope& operator=(const PoolStreamScope&) = delete;

 private:
  std::optional<c10::Stream> caller_;  // set on CUDA only
  c10::Stream stream_;
};

}  // namespace packtrain::graphs
