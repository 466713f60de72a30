#include "packtrain/runtime/distributed/nccl_communicator.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/distributed/collective_error.h"

#include <fmt/format.h>

#if defined(PACKTRAIN_HAVE_NCCL)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>

namespace packtrain::runtime::distributed {

#if defined(PACKTRAIN_HAVE_NCCL)

namespace {
ncclDataType_t nccl_type(c10::ScalarType type, const char* what) {
  switch (type) {
    case c10::ScalarType::Float: return ncclFloat32;
    case c10::ScalarType::Double: return ncclFloat64;
    case c10::ScalarType::Half: return ncclFloat16;
    case c10::ScalarType::BFloat16: return ncclBfloat16;
    case c10::ScalarType::Int: return ncclInt32;
    case c10::ScalarType::Long: return ncclInt64;
    default: throw CollectiveError(fmt::format("{}: NCCL cannot reduce {} tensors", what, c10::toString(type)));
  }
}
}  // namespace

struct NcclCommunicator::Impl {
  int64_t rank = 0, world_size = 1;
  c10::Device device{c10::kCUDA, 0};
  ncclComm_t comm = nullptr;
  std::atomic<bool> aborted{false};
  // Set before abort() waits for the exclusive lock: a call arriving meanwhile throws
  // instead of queueing behind an abort that may wait for this very thread.
  std::atomic<bool> aborting{false};
  // NCCL calls hold it shared; abort() exclusively: ncclCommAbort frees the
  // communicator, which no call may still be using.
  mutable std::shared_mutex use;

  [[noreturn]] void fail(const char* what, ncclResult_t result) const {
    const char* detail = comm != nullptr ? ncclGetLastError(comm) : nullptr;
    throw CollectiveError(fmt::format("{} failed on rank {} of {}: NCCL {}{}{}", what, rank, world_size,
                                      ncclGetErrorString(result), detail != nullptr && *detail != 0 ? ": " : "",
                                      detail != nullptr ? detail : ""));
  }
  void check(ncclResult_t result, const char* what) const {
    if (result != ncclSuccess && result != ncclInProgress) fail(what, result);
  }
  // The stream a collective on `tensor` is enqueued on: the current one (the capture
  // stream inside a captured step).
  void refuse_if_aborting(const char* what) const {
    if (aborting.load()) {
      throw CollectiveError(
          fmt::format("{} on rank {} of {}: the NCCL communicator was aborted after a missed "
                      "deadline",
                      what, rank, world_size));
    }
  }
  cudaStream_t stream_for(const at::Tensor& tensor, const char* what) const {
    if (aborted.load()) {
      throw CollectiveError(
          fmt::format("{} on rank {} of {}: the NCCL communicator was aborted after a missed "
                      "deadline",
                      what, rank, world_size));
    }
    if (!tensor.is_cuda() || tensor.device() != device || !tensor.is_contiguous()) {
      throw CollectiveError(fmt::format("{}: this communicator reduces contiguous tensors on {}, got {} on {}{}", what,
                                        device.str(), c10::toString(tensor.scalar_type()), tensor.device().str(),
                                        tensor.is_contiguous() ? "" : " (not contiguous)"));
    }
    return c10::cuda::getCurrentCUDAStream(device.index()).stream();
  }
};

NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NcclCommunicator::~NcclCommunicator() {
  if (impl_->comm == nullptr) return;
  // A communicator whose peer died cannot be destroyed cleanly (destroy waits for it).
  // NCCL >= 2.26 also waits for every CUDA graph holding its kernels: owners destroy
  // their captured steps before the communicator (trainers before the group).
  if (impl_->aborted.load()) return;
  c10::cuda::CUDAGuard guard(impl_->device);
  ncclCommDestroy(impl_->comm);
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(int64_t rank, int64_t world_size, c10::Device device,
                                                           const ShareId& share_id) {
  if (!device.is_cuda() || device.index() < 0) {
    throw UserError("an NCCL communicator needs a CUDA device with an index, got " + device.str());
  }
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->world_size = world_size;
  impl->device = device;
  ncclUniqueId id;
  std::string mine;
  if (rank == 0) {
    impl->check(ncclGetUniqueId(&id), "NCCL unique id");
    mine.assign(id.internal, sizeof(id.internal));
  }
  const std::string root = share_id(mine);
  if (root.size() != sizeof(id.internal)) {
    throw CollectiveError(fmt::format("NCCL setup on rank {} of {}: rank 0's id has {} bytes, expected {}", rank,
                                      world_size, root.size(), sizeof(id.internal)));
  }
  std::memcpy(id.internal, root.data(), sizeof(id.internal));
  // Connect to the peers inside ncclCommInitRank (which the caller bounds with a
  // deadline), not lazily inside the first collective (NCCL >= 2.22's default),
  // where a missing peer would block the host with nothing watching.
  ::setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  c10::cuda::CUDAGuard guard(device);
  impl->check(ncclCommInitRank(&impl->comm, static_cast<int>(world_size), id, static_cast<int>(rank)),
              "NCCL communicator setup");
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(impl)));
}

void NcclCommunicator::all_reduce_(at::Tensor& tensor, DeviceReduceOp op, const char* what) {
  impl_->refuse_if_aborting(what);
  std::shared_lock lock(impl_->use);
  const cudaStream_t stream = impl_->stream_for(tensor, what);
  impl_->check(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                             nccl_type(tensor.scalar_type(), what), op == DeviceReduceOp::kAverage ? ncclAvg : ncclSum,
                             impl_->comm, stream),
               what);
}

void NcclCommunicator::broadcast_(at::Tensor& tensor, int64_t root, const char* what) {
  impl_->refuse_if_aborting(what);
  std::shared_lock lock(impl_->use);
  const cudaStream_t stream = impl_->stream_for(tensor, what);
  impl_->check(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                             nccl_type(tensor.scalar_type(), what), static_cast<int>(root), impl_->comm, stream),
               what);
}

void NcclCommunicator::send(const at::Tensor& tensor, int64_t peer, const char* what) {
  impl_->refuse_if_aborting(what);
  std::shared_lock lock(impl_->use);
  const cudaStream_t stream = impl_->stream_for(tensor, what);
  impl_->check(ncclSend(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), nccl_type(tensor.scalar_type(), what),
                        static_cast<int>(peer), impl_->comm, stream),
               what);
}

void NcclCommunicator::recv_(at::Tensor& tensor, int64_t peer, const char* what) {
  impl_->refuse_if_aborting(what);
  std::shared_lock lock(impl_->use);
  const cudaStream_t stream = impl_->stream_for(tensor, what);
  impl_->check(ncclRecv(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), nccl_type(tensor.scalar_type(), what),
                        static_cast<int>(peer), impl_->comm, stream),
               what);
}

void NcclCommunicator::abort() {
  impl_->aborting.store(true);
  std::unique_lock lock(impl_->use);
  if (impl_->aborted.exchange(true) || impl_->comm == nullptr) return;
  ncclCommAbort(impl_->comm);
}

bool NcclCommunicator::aborted() const { return impl_->aborted.load(); }

std::string NcclCommunicator::async_error() const {
  if (impl_->aborting.load()) return "";
  std::shared_lock lock(impl_->use);
  if (impl_->aborted.load() || impl_->comm == nullptr) return "";
  ncclResult_t state = ncclSuccess;
  if (ncclCommGetAsyncError(impl_->comm, &state) != ncclSuccess) return "cannot query NCCL's asynchronous error";
  return state == ncclSuccess || state == ncclInProgress ? "" : ncclGetErrorString(state);
}

c10::Device NcclCommunicator::device() const { return impl_->device; }

bool NcclCommunicator::available() { return true; }

std::string NcclCommunicator::version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

#else  // no NCCL in this build

struct NcclCommunicator::Impl {};
NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclCommunicator::~NcclCommunicator() = default;
std::unique_ptr<NcclCommunicator> NcclCommunicator::create(int64_t, int64_t, c10::Device, const ShareId&) {
  throw UserError("this packtrain was built without NCCL: no collectives on CUDA tensors");
}
void NcclCommunicator::all_reduce_(at::Tensor&, DeviceReduceOp, const char*) {}
void NcclCommunicator::broadcast_(at::Tensor&, int64_t, const char*) {}
void NcclCommunicator::send(const at::Tensor&, int64_t, const char*) {}
void NcclCommunicator::recv_(at::Tensor&, int64_t, const char*) {}
void NcclCommunicator::abort() {}
bool NcclCommunicator::aborted() const { return false; }
std::string NcclCommunicator::async_error() const { return ""; }
c10::Device NcclCommunicator::device() const { return c10::Device(c10::kCPU); }
bool NcclCommunicator::available() { return false; }
std::string NcclCommunicator::version() { return "not built"; }

#endif

}  // namespace packtrain::runtime::distributed
