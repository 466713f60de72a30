// ProcessGroup: this process's membership in a multi-process run — the c10d TCP
// store at MASTER_ADDR:MASTER_PORT (rank 0 serves it, the others connect) and the
// collective backends: Gloo for CPU tensors, and, when joined with a CUDA device,
// an NCCL communicator for tensors on it (one GPU per process). c10d's and NCCL's
// headers stay in the .cpp files.
//
// CPU collectives wait at most the group's timeout and then throw naming the
// operation, this rank and the world size, instead of hanging on a dead peer. CUDA
// all-reduces are only enqueued (a captured step records them into its graph); the
// caller registers what it enqueued with watch_device() and waits with
// wait_device(): a watchdog thread gives every piece the same timeout, aborts the
// communicator when one misses it, and the error names the work's steps.
#pragma once

#include "packtrain/runtime/distributed/collective_error.h"
#include "packtrain/runtime/distributed/rank_info.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace packtrain::runtime::distributed {

class ProcessGroup {
 public:
  // Connects to (rank 0: serves) the store, waits until every rank has reached it,
  // and joins the collective backends: Gloo, and NCCL on `device` when it is a CUDA
  // device. Throws packtrain::UserError, one line naming MASTER_ADDR:MASTER_PORT and the cause,
  // when rank 0 cannot listen there, the store cannot be reached or not every rank
  // reaches it within `timeout` (the whole rendezvous takes at most that); and when
  // this build has no Gloo (built without its headers) or, for a CUDA device, no NCCL.
  static std::unique_ptr<ProcessGroup> join(const RankInfo& info,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(60),
                                            c10::Device device = c10::Device(c10::kCPU));
  ~ProcessGroup();

  // A group of some of this group's ranks (`ranks`: this group's rank numbers,
  // ascending, this rank among them; rank i of the new group is ranks[i]) over the
  // same store, with Gloo connections of its own and, when this group reduces CUDA
  // tensors, an NCCL communicator of its own. `name` keeps groups apart in the store
  // and names the group in its errors ("stage 0's replicas": "... failed on rank 1
  // of 2 of stage 0's replicas (rank 2 of 4)"). Every rank in `ranks` calls it with
  // the same arguments, and each rank creates its groups in the same order as the
  // others — the n-th subgroup a rank makes of this group is the n-th of each of its
  // ranks (setting one up waits, at most the timeout, for all its ranks). The new
  // group must not outlive this one.
  std::unique_ptr<ProcessGroup> subgroup(const std::vector<int64_t>& ranks, const std::string& name) const;

  const RankInfo& info() const;
  int64_t rank() const { return info().rank; }
  int64_t world_size() const { return info().world_size; }
  // CPU (Gloo only), or the CUDA device whose tensors the NCCL communicator reduces.
  c10::Device device() const;
  std::chrono::milliseconds timeout() const;
  // "Gloo" or "NCCL + Gloo": what the progress line says gradients go over.
  std::string backends() const;
  // Collective calls made through this group on the host (a captured all-reduce
  // counts once, when it is recorded, however often its graph replays).
  int64_t calls() const;

  // In place, over all ranks: the element-wise sum, or the mean. CPU tensors go
  // over Gloo and are complete on return; CUDA tensors go over NCCL on the current
  // stream and are only enqueued (capturable; see watch_device). `what` (and `step`,
  // when >= 0) name the operation in the error a failed or timed-out collective
  // raises: "gradient all-reduce at step 120 failed on …". Nothing is formatted
  // unless it fails (the gradient all-reduce runs every step).
  void all_reduce_sum_(at::Tensor& tensor, const char* what = "all-reduce", int64_t step = -1);
  void all_reduce_mean_(at::Tensor& tensor, const char* what = "all-reduce", int64_t step = -1);
  // In place: every rank gets `root`'s values (complete on return, CUDA too).
  void broadcast_(at::Tensor& tensor, int64_t root = 0, const char* what = "broadcast");
  void barrier();

  // Point to point, for a pipeline's activations and their gradients: CPU tensors
  // over Gloo, CUDA tensors over NCCL (enqueued on the current stream; the peer's
  // matching call must come in an order that pairs up). A CPU send returns at once:
  // the transfer runs in the background, the tensor must stay unchanged until
  // wait_sends(). A CPU receive is complete on return, or throws CollectiveError
  // after the group's timeout naming `what`, `step` and this rank. `tag` separates
  // streams of messages between the same two ranks.
  void send(const at::Tensor& tensor, int64_t peer, int tag, const char* what, int64_t step = -1);
  void recv_(at::Tensor& tensor, int64_t peer, int tag, const char* what, int64_t step = -1);
  // Waits for every send still in flight (at most the timeout each).
  void wait_sends();

  // Collective: compares a checksum of `values` (e.g. the flat parameters) with rank
  // 0's; when any rank differs, every rank throws CollectiveError "<what> differ
  // across ranks <where>: N rank(s) disagree with rank 0 (this rank agrees|differs)".
  void check_same(const at::Tensor& values, const char* what, const std::string& where);
  // Collective: whether `flag` is set on any rank (e.g. Ctrl-C, which reaches the
  // ranks at different moments), so that all act on it at the same point.
  bool any(bool flag, const char* what, int64_t step = -1);

  // CUDA groups: registers the device work enqueued so far on the current stream
  // (e.g. a replay of steps first_step..last_step with their gradient all-reduces)
  // with the watchdog. No-op for a CPU group.
  void watch_device(const char* what, int64_t first_step = -1, int64_t last_step = -1);
  // CUDA groups: waits (polling, never blocking in the driver) until all device
  // work enqueued so far has completed; throws CollectiveError when a piece missed
  // its deadline or NCCL reported an error. No-op for a CPU group.
  void wait_device(const char* what = "device collectives");

  // Whether this build can make Gloo groups (it found Gloo's headers) and NCCL
  // communicators (it links LibTorch's NCCL).
  static bool gloo_available();
  static bool nccl_available();

 private:
  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace packtrain::runtime::distributed
