#include "runtime/distributed/process_group.h"

#include "profiling/nvtx.h"
#include "runtime/data_error.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(PACKTRAIN_HAVE_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

namespace packtrain::runtime::distributed {

struct ProcessGroup::Impl {
  RankInfo info;
  std::chrono::milliseconds timeout{};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;

  // Waits for `work` at most the group's timeout; a peer that died or hangs becomes
  // an error naming the collective and this rank.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what, int64_t step = -1) const {
    try {
      work->wait(timeout);
    } catch (const std::exception& e) {
      std::string reason = e.what();
      reason = reason.substr(0, reason.find('\n'));
      throw CollectiveError(fmt::format("{}{} failed on rank {} of {} (timeout {} ms): {}", what,
                                        step >= 0 ? fmt::format(" at step {}", step) : "", info.rank,
                                        info.world_size, timeout.count(), reason));
    }
  }
  void check_cpu(const at::Tensor& t, const char* what) const {
    TORCH_CHECK(t.is_cpu() && t.is_contiguous(), what, ": this process group reduces contiguous CPU tensors, got ",
                t.device(), t.is_contiguous() ? "" : " (not contiguous)");
  }
};

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

bool ProcessGroup::gloo_available() {
#if defined(PACKTRAIN_HAVE_GLOO)
  return true;
#else
  return false;
#endif
}

std::unique_ptr<ProcessGroup> ProcessGroup::join(const RankInfo& info, std::chrono::milliseconds timeout) {
  auto impl = std::make_unique<Impl>();
  impl->info = info;
  impl->timeout = timeout;
  PACKTRAIN_NVTX_RANGE("rendezvous");
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(info.master_port);
  options.isServer = info.rank == 0;
  options.numWorkers = static_cast<std::size_t>(info.world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  try {
    // One process needs no server: an in-memory store.
    if (info.world_size == 1) {
      impl->store = c10::make_intrusive<c10d::HashStore>();
    } else {
      impl->store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, options);
    }
  } catch (const std::exception& e) {
    throw DataError(fmt::format("rank {} of {}: cannot reach the store at {}:{} within {} ms: {}", info.rank,
                                info.world_size, info.master_addr, info.master_port, timeout.count(), e.what()));
  }
#if defined(PACKTRAIN_HAVE_GLOO)
  impl->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(
      impl->store, static_cast<int>(info.rank), static_cast<int>(info.world_size),
      c10d::ProcessGroupGloo::Options::create_default(timeout));
#else
  throw DataError("this packtrain was built without Gloo's headers (Debian's libgloo-dev): no CPU collectives");
#endif
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

const RankInfo& ProcessGroup::info() const { return impl_->info; }

void ProcessGroup::all_reduce_sum_(at::Tensor& tensor, const char* what, int64_t step) {
  PACKTRAIN_NVTX_RANGE("allreduce");
  impl_->check_cpu(tensor, "all-reduce");
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.timeout = impl_->timeout;
  impl_->wait(impl_->backend->allreduce(tensors, options), what, step);
}

void ProcessGroup::all_reduce_mean_(at::Tensor& tensor, const char* what, int64_t step) {
  all_reduce_sum_(tensor, what, step);
  tensor.div_(static_cast<double>(world_size()));
}

void ProcessGroup::broadcast_(at::Tensor& tensor, int64_t root, const char* what) {
  PACKTRAIN_NVTX_RANGE("broadcast");
  impl_->check_cpu(tensor, "broadcast");
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.timeout = impl_->timeout;
  impl_->wait(impl_->backend->broadcast(tensors, options), what);
}

void ProcessGroup::barrier() {
  c10d::BarrierOptions options;
  options.timeout = impl_->timeout;
  impl_->wait(impl_->backend->barrier(options), "barrier");
}

}  // namespace packtrain::runtime::distributed
