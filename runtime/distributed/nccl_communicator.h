// NcclCommunicator: one NCCL communicator over the ranks of a run, for CUDA tensors
// on this process's one GPU. Its collectives are enqueued on the current CUDA stream
// and never wait on the host, so a captured step records them into its graph (the
// gradient all-reduce between backward and the optimizer). The host learns of a dead
// peer only through a deadline: the owner watches the enqueued work
// (CollectiveWatchdog) and calls abort() when it passes, which releases kernels
// waiting on the peer. nccl.h stays in the .cpp; LibTorch's own libnccl is used.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace packtrain::runtime::distributed {

enum class DeviceReduceOp { kSum, kAverage };

class NcclCommunicator {
 public:
  // Publishes rank 0's unique id (rank 0 passes its id, the others an empty string)
  // and returns rank 0's id on every rank: the run's store does this.
  using ShareId = std::function<std::string(const std::string& root_id)>;

  // Blocks until all `world_size` ranks have joined (NCCL's own rendezvous): the
  // caller bounds it with a deadline. Throws CollectiveError when NCCL refuses, and
  // packtrain::UserError when this build has no NCCL or `device` is not a CUDA device.
  static std::unique_ptr<NcclCommunicator> create(int64_t rank, int64_t world_size, c10::Device device,
                                                  const ShareId& share_id);
  // Destroys the communicator; NCCL waits for every CUDA graph holding its kernels,
  // so destroy the captured steps that use it first.
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // In place, enqueued on the current stream of the tensor's device (capturable).
  // Contiguous CUDA tensors on this communicator's device: float32/64, float16,
  // bfloat16, int32/64. `what` names the operation in errors.
  void all_reduce_(at::Tensor& tensor, DeviceReduceOp op, const char* what = "all-reduce");
  void broadcast_(at::Tensor& tensor, int64_t root, const char* what = "broadcast");
  // Point to point (a pipeline's activations and their gradients), enqueued on the
  // current stream: the stream waits until the peer's matching call runs, so both
  // ranks must issue their sends and receives in an order that pairs up.
  void send(const at::Tensor& tensor, int64_t peer, const char* what = "send");
  void recv_(at::Tensor& tensor, int64_t peer, const char* what = "recv");

  // Aborts the communicator (from any thread, once): kernels stuck on a dead peer
  // return; every later collective throws. May block (NCCL waits for graphs that
  // hold its kernels), so deadline code calls it from a thread of its own.
  void abort();
  bool aborted() const;
  // NCCL's asynchronous error for this communicator, "" when none.
  std::string async_error() const;

  c10::Device device() const;
  // Whether this build links NCCL (LibTorch's), and its version ("2.28.9").
  static bool available();
  static std::string version();

 private:
  struct Impl;
  explicit NcclCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace packtrain::runtime::distributed
