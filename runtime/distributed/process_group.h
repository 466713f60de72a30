// ProcessGroup: this process's membership in a multi-process run — the c10d TCP
// store at MASTER_ADDR:MASTER_PORT (rank 0 serves it, the others connect) and a
// collective backend: Gloo for CPU tensors. c10d's headers stay in the .cpp.
//
// Every collective waits at most the group's timeout and then throws naming the
// operation, this rank and the world size, instead of hanging on a dead peer.
#pragma once

#include "runtime/distributed/rank_info.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <stdexcept>

namespace packtrain::runtime::distributed {

// A collective that failed or timed out (a peer died or hangs): exit status 1, one
// line naming the operation, the rank and the world size.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ProcessGroup {
 public:
  // Connects to (rank 0: serves) the store and joins the collective backend. Throws
  // DataError when the store cannot be reached within `timeout`, or when this build
  // has no Gloo (built without its headers).
  static std::unique_ptr<ProcessGroup> join(const RankInfo& info,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~ProcessGroup();

  const RankInfo& info() const;
  int64_t rank() const { return info().rank; }
  int64_t world_size() const { return info().world_size; }

  // In place, over all ranks (CPU tensors): the element-wise sum, or the mean.
  // `what` (and `step`, when >= 0) name the operation in the error a failed or
  // timed-out collective raises: "gradient all-reduce at step 120 failed on …".
  // Nothing is formatted unless it fails (the gradient all-reduce runs every step).
  void all_reduce_sum_(at::Tensor& tensor, const char* what = "all-reduce", int64_t step = -1);
  void all_reduce_mean_(at::Tensor& tensor, const char* what = "all-reduce", int64_t step = -1);
  // In place: every rank gets `root`'s values.
  void broadcast_(at::Tensor& tensor, int64_t root = 0, const char* what = "broadcast");
  void barrier();

  // Whether this build can make Gloo groups (it found Gloo's headers).
  static bool gloo_available();

 private:
  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace packtrain::runtime::distributed
