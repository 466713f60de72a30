#include "packtrain/runtime/distributed/process_group.h"

#include "packtrain/profiling/nvtx.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/distributed/collective_watchdog.h"
#include "packtrain/runtime/distributed/nccl_communicator.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(PACKTRAIN_HAVE_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cstring>
#include <cerrno>
#include <atomic>
#include <cstdlib>
#include <mutex>

namespace packtrain::runtime::distributed {

struct ProcessGroup::Impl {
  RankInfo info;
  std::chrono::milliseconds timeout{};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  // CUDA groups: the communicator, and the deadline over what was enqueued on it.
  // The watchdog's abort runs on a thread of its own and may outlive this group:
  // it holds the communicator through the shared slot.
  struct CommunicatorSlot {
    std::mutex mutex;
    std::shared_ptr<NcclCommunicator> comm;
  };
  std::shared_ptr<CommunicatorSlot> slot = std::make_shared<CommunicatorSlot>();
  std::shared_ptr<NcclCommunicator> nccl;
  std::unique_ptr<CollectiveWatchdog> watchdog;
  int64_t calls = 0;

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
  NcclCommunicator& device_backend(const at::Tensor& t, const char* what) const {
    if (nccl == nullptr) {
      throw CollectiveError(fmt::format("{}: a {} tensor, but this process group was joined for the CPU (join it "
                                        "with the training device to reduce CUDA tensors over NCCL)",
                                        what, t.device().str()));
    }
    watchdog->check();  // a missed deadline ends the run here, before another NCCL call
    return *nccl;
  }
  std::string who() const { return fmt::format("rank {} of {}", info.rank, info.world_size); }
  void join_nccl(c10::Device device);
};

// NCCL's rendezvous blocks until every rank arrives: the watchdog bounds it (a rank
// that never comes ends this one after the timeout and its grace, with the reason).
void ProcessGroup::Impl::join_nccl(c10::Device device) {
  WatchdogOptions w;
  w.timeout = timeout;
  w.grace = timeout;
  w.who = who();
  // The watchdog's thread probes events while the owner may be capturing a graph
  // (global capture mode forbids other threads' event queries): relaxed mode on
  // that thread, and this rank's device (not a context on GPU 0).
  w.thread_setup = [index = device.index()] {
    c10::cuda::set_device(index);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  };
  w.on_timeout = [slot = slot] {
    std::shared_ptr<NcclCommunicator> comm;
    {
      std::lock_guard lock(slot->mutex);
      comm = slot->comm;
    }
    if (comm != nullptr) comm->abort();
  };
  watchdog = std::make_unique<CollectiveWatchdog>(std::move(w));
  auto joined = std::make_shared<std::atomic<bool>>(false);
  watchdog->watch({"NCCL communicator setup", -1, -1, [joined] { return joined->load(); }});
  const std::string key = "packtrain/nccl-unique-id";
  nccl = NcclCommunicator::create(info.rank, info.world_size, device, [&](const std::string& root_id) {
    if (info.rank == 0) {
      store->set(key, std::vector<uint8_t>(root_id.begin(), root_id.end()));
      return root_id;
    }
    const std::vector<uint8_t> bytes = store->get(key);  // waits at most the store's timeout
    return std::string(bytes.begin(), bytes.end());
  });
  {
    std::lock_guard lock(slot->mutex);
    slot->comm = nccl;
  }
  joined->store(true);
  watchdog->wait_all();
}

#if defined(PACKTRAIN_HAVE_GLOO)
namespace {
bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

// The interfaces Gloo binds to: GLOO_SOCKET_IFNAME's where the user set it (Gloo's
// defaults read it); the loopback address when every rank is on this host (one
// process, or a store on a loopback address: what `packtrain launch` starts);
// otherwise this host's name resolved. (Gloo's default on a host whose name does not
// resolve falls back to loopback with a warning — not for the local groups here.)
c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> gloo_options(const RankInfo& info,
                                                                 std::chrono::milliseconds timeout) {
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  const bool user_set = ifname != nullptr && *ifname != '\0';
  if (user_set || !(info.world_size == 1 || is_loopback(info.master_addr))) {
    return c10d::ProcessGroupGloo::Options::create_default(timeout);
  }
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices = {c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")};
  options->threads = 2;  // Gloo's default: two per device
  return options;
}
}  // namespace
#endif

namespace {
// A listening TCP socket bound to `address` (a name or a numeric address, resolved
// here) and `port`, for the store to take over. Exit 2 naming the address when it
// is not one of this host's.
int listen_on(const std::string& address, int64_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(address.c_str(), service.c_str(), &hints, &found); rc != 0) {
    throw DataError(fmt::format("MASTER_ADDR={}: cannot resolve it: {}", address, ::gai_strerror(rc)));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      ::freeaddrinfo(found);
      return fd;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  throw DataError(fmt::format("rank 0 cannot serve the store on {}:{}: {} (MASTER_ADDR must name an address of "
                              "rank 0's host, MASTER_PORT a free port)",
                              address, port, why));
}
}  // namespace

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

bool ProcessGroup::gloo_available() {
#if defined(PACKTRAIN_HAVE_GLOO)
  return true;
#else
  return false;
#endif
}

bool ProcessGroup::nccl_available() { return NcclCommunicator::available(); }

std::unique_ptr<ProcessGroup> ProcessGroup::join(const RankInfo& info, std::chrono::milliseconds timeout,
                                                 c10::Device device) {
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
  // Rank 0's store listens only on the address MASTER_ADDR names (loopback for a
  // one-node launch), not on every interface as c10d's own socket would.
  if (options.isServer && info.world_size > 1) options.masterListenFd = listen_on(info.master_addr, info.master_port);
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
      impl->store, static_cast<int>(info.rank), static_cast<int>(info.world_size), gloo_options(info, timeout));
#else
  throw DataError("this packtrain was built without Gloo's headers (Debian's libgloo-dev): no CPU collectives");
#endif
  if (device.is_cuda()) {
    if (!NcclCommunicator::available()) {
      throw DataError("training on " + device.str() + " across processes needs NCCL, and this packtrain was built "
                      "without it");
    }
    impl->join_nccl(device);
  }
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

const RankInfo& ProcessGroup::info() const { return impl_->info; }

c10::Device ProcessGroup::device() const {
  return impl_->nccl != nullptr ? impl_->nccl->device() : c10::Device(c10::kCPU);
}

std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->timeout; }

int64_t ProcessGroup::calls() const { return impl_->calls; }

std::string ProcessGroup::backends() const { return impl_->nccl != nullptr ? "NCCL + Gloo" : "Gloo"; }

void ProcessGroup::watch_device(const char* what, int64_t first_step, int64_t last_step) {
  if (impl_->nccl == nullptr) return;
  auto event = std::make_shared<at::cuda::CUDAEvent>();
  event->record(c10::cuda::getCurrentCUDAStream(impl_->nccl->device().index()));
  impl_->watchdog->watch({what, first_step, last_step, [event] { return event->query(); }});
}

void ProcessGroup::wait_device(const char* what) {
  if (impl_->nccl == nullptr) return;
  watch_device(what);
  impl_->watchdog->wait_all();
  const std::string error = impl_->nccl->async_error();
  if (!error.empty()) {
    throw CollectiveError(fmt::format("{} failed on {}: NCCL {}", what, impl_->who(), error));
  }
}

void ProcessGroup::all_reduce_sum_(at::Tensor& tensor, const char* what, int64_t step) {
  PACKTRAIN_NVTX_RANGE("allreduce");
  ++impl_->calls;
  if (tensor.is_cuda()) {
    impl_->device_backend(tensor, what).all_reduce_(tensor, DeviceReduceOp::kSum, what);
    return;
  }
  impl_->check_cpu(tensor, "all-reduce");
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.timeout = impl_->timeout;
  impl_->wait(impl_->backend->allreduce(tensors, options), what, step);
}

void ProcessGroup::all_reduce_mean_(at::Tensor& tensor, const char* what, int64_t step) {
  if (tensor.is_cuda()) {  // one NCCL call: ncclAvg divides on the device
    PACKTRAIN_NVTX_RANGE("allreduce");
    ++impl_->calls;
    impl_->device_backend(tensor, what).all_reduce_(tensor, DeviceReduceOp::kAverage, what);
    return;
  }
  all_reduce_sum_(tensor, what, step);
  tensor.div_(static_cast<double>(world_size()));
}

void ProcessGroup::broadcast_(at::Tensor& tensor, int64_t root, const char* what) {
  PACKTRAIN_NVTX_RANGE("broadcast");
  ++impl_->calls;
  if (tensor.is_cuda()) {
    impl_->device_backend(tensor, what).broadcast_(tensor, root, what);
    wait_device(what);
    return;
  }
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

void ProcessGroup::check_same(const at::Tensor& values, const char* what, const std::string& where) {
  const at::Tensor flat = values.detach().reshape({-1}).to(at::kCPU, at::kDouble);
  const at::Tensor mine = at::stack({flat.sum(), flat.abs().sum(), (flat * flat).sum()});
  at::Tensor root = mine.clone();
  broadcast_(root, 0, "checksum broadcast");
  const bool agrees = at::equal(mine, root);
  at::Tensor differing = at::full({1}, agrees ? 0.0 : 1.0, at::kDouble);
  all_reduce_sum_(differing, "checksum all-reduce");
  const auto n = static_cast<int64_t>(differing.item<double>());
  if (n > 0) {
    throw CollectiveError(fmt::format("{} differ across ranks {}: {} rank(s) disagree with rank 0 (this rank {})", what,
                                      where, n, agrees ? "agrees" : "differs"));
  }
}

bool ProcessGroup::any(bool flag, const char* what, int64_t step) {
  at::Tensor t = at::full({1}, flag ? 1.0 : 0.0, at::kDouble);
  all_reduce_sum_(t, what, step);
  return t.item<double>() > 0;
}

}  // namespace packtrain::runtime::distributed
