#include "packtrain/runtime/distributed/process_group.h"

#include "packtrain/base/user_error.h"
#include "packtrain/profiling/nvtx.h"
#include "packtrain/runtime/distributed/collective_watchdog.h"
#include "packtrain/runtime/distributed/nccl_communicator.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(PACKTRAIN_HAVE_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace packtrain::runtime::distributed {

namespace {
// The first line of an error's message, without c10's backtrace.
std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string what = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  return what.substr(0, what.find('\n'));
}

}  // namespace

struct ProcessGroup::Impl {
  RankInfo info;
  // A subgroup's name and this rank in the whole run ("stage 0's replicas (rank 2 of
  // 4)"), said after "rank 1 of 2" in its errors; empty for the run's own group.
  std::string scope;
  int64_t subgroups = 0;  // made from this group so far: the n-th gets its own store prefix
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
  // CPU sends in flight, with what names them in an error.
  struct PendingSend {
    c10::intrusive_ptr<c10d::Work> work;
    std::string what;
    int64_t step;
  };
  std::vector<PendingSend> sends;

  // Waits for `work` at most the group's timeout; a peer that died or hangs becomes
  // an error naming the collective and this rank.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what, int64_t step = -1) const {
    guarded([&] { work->wait(timeout); }, what, step);
  }
  // Runs `call` (posting or waiting on a transfer): a backend error, thrown when the
  // work is posted (Gloo throws there once a peer has closed its connection) or when
  // it is waited on, becomes a CollectiveError naming the transfer, step and rank.
  template <typename Call>
  auto guarded(Call&& call, const char* what, int64_t step = -1) const -> decltype(call()) {
    try {
      return call();
    } catch (const CollectiveError&) {
      throw;
    } catch (const std::exception& e) {
      throw CollectiveError(fmt::format("{}{} failed on {} (timeout {} ms): {}", what,
                                        step >= 0 ? fmt::format(" at step {}", step) : "", who(), timeout.count(),
                                        first_line(e)));
    }
  }
  void check_cpu(const at::Tensor& t, const char* what) const {
    TORCH_CHECK(t.is_cpu() && t.is_contiguous(), what, ": this process group reduces contiguous CPU tensors, got ",
                t.device(), t.is_contiguous() ? "" : " (not contiguous)");
  }
  NcclCommunicator& device_backend(const at::Tensor& t, const char* what) const {
    if (nccl == nullptr) {
      throw CollectiveError(
          fmt::format("{}: a {} tensor, but this process group was joined for the CPU (join it "
                      "with the training device to reduce CUDA tensors over NCCL)",
                      what, t.device().str()));
    }
    watchdog->check();  // a missed deadline ends the run here, before another NCCL call
    return *nccl;
  }
  std::string who() const {
    return fmt::format("rank {} of {}{}", info.rank, info.world_size, scope.empty() ? "" : " of " + scope);
  }
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
bool is_loopback(const std::string& addr) { return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0; }

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
using Clock = std::chrono::steady_clock;

// "10 s", "2.5 s".
std::string in_seconds(std::chrono::milliseconds t) { return fmt::format("{} s", t.count() / 1000.0); }

// MASTER_ADDR:MASTER_PORT resolved (a name or a numeric address); UserError naming
// the address when it does not resolve.
std::unique_ptr<addrinfo, void (*)(addrinfo*)> resolve(const std::string& address, int64_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    throw UserError(fmt::format("MASTER_ADDR={}: cannot resolve it: {}", address, ::gai_strerror(rc)));
  }
  return {found, ::freeaddrinfo};
}

// A listening TCP socket bound to `address` and `port`, for the store to take over.
// Exit 2 naming the address when it is not one of this host's or the port is taken.
int listen_on(const std::string& address, int64_t port) {
  const auto found = resolve(address, port);
  std::string why = "no address";
  for (addrinfo* a = found.get(); a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) return fd;
    why = std::strerror(errno);
    ::close(fd);
  }
  throw UserError(
      fmt::format("rank 0 cannot serve the store on {}:{}: {} (MASTER_ADDR must name an address of "
                  "rank 0's host, MASTER_PORT a free port)",
                  address, port, why));
}

// Whether a TCP connection to `a` opens before `deadline`; otherwise `why` says why.
bool connects(const addrinfo& a, Clock::time_point deadline, std::string& why) {
  const int fd = ::socket(a.ai_family, a.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a.ai_protocol);
  if (fd < 0) {
    why = std::strerror(errno);
    return false;
  }
  int error = ::connect(fd, a.ai_addr, a.ai_addrlen) == 0 ? 0 : errno;
  if (error == EINPROGRESS) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{fd, POLLOUT, 0};
    socklen_t size = sizeof(error);
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) == 1) {
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
    } else {
      error = ETIMEDOUT;
    }
  }
  ::close(fd);
  if (error != 0) why = std::strerror(error);
  return error == 0;
}

// Ranks other than 0: waits until the store's address accepts connections (rank 0
// may start later), trying every 100 ms; UserError naming the address, the port and
// the last cause once `deadline` passes. (c10d's own client would wait the timeout
// once per retry, with a backoff between, and log each try.)
void wait_for_store(const RankInfo& info, std::chrono::milliseconds timeout, Clock::time_point deadline) {
  const auto found = resolve(info.master_addr, info.master_port);
  std::string why = "no address";
  for (;;) {
    for (const addrinfo* a = found.get(); a != nullptr; a = a->ai_next) {
      if (connects(*a, deadline, why)) return;
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - now));
  }
  throw UserError(
      fmt::format("rank {} of {} could not reach the store at {}:{} within {}: {} (rank 0 serves it: "
                  "is it running, with the same MASTER_ADDR and MASTER_PORT?)",
                  info.rank, info.world_size, info.master_addr, info.master_port, in_seconds(timeout), why));
}

// Waits until every rank has reached the store, at most until `deadline`: each adds
// itself to a count; rank 0 waits for the whole count and posts the outcome, which
// the others poll (every 10 ms: c10d's blocking wait logs its timeout, and so does
// a read from a store that went away). A rank that never comes is a UserError on
// each rank naming the store and how many came; rank 0 keeps the store until the
// others have read that or left (at most a second more).
void wait_for_ranks(c10d::Store& store, const RankInfo& info, std::chrono::milliseconds timeout,
                    Clock::time_point deadline) {
  // The outcome: 0 while waiting, 1 when all came, -n when only n did by the deadline.
  const std::string joined = "packtrain/ranks-joined", outcome = "packtrain/rendezvous-outcome",
                    told = "packtrain/ranks-told";
  const auto poll_until = [](Clock::time_point until, const std::function<bool()>& done) {
    while (!done()) {
      if (Clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  };
  const auto too_few = [&](int64_t came) {
    return UserError(fmt::format(
        "rank {} of {}: {} of {} ranks reached the store at {}:{} within {} (start every "
        "rank, each with the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT)",
        info.rank, info.world_size, came, info.world_size, info.master_addr, info.master_port, in_seconds(timeout)));
  };
  if (info.rank == 0) {
    int64_t came = store.add(joined, 1);
    if (poll_until(deadline, [&] { return (came = store.add(joined, 0)) >= info.world_size; })) {
      store.add(outcome, 1);
      return;
    }
    store.add(outcome, -came);
    poll_until(Clock::now() + std::chrono::seconds(1), [&] { return store.add(told, 0) >= came - 1; });
    throw too_few(came);
  }
  int64_t result = 0;
  try {
    store.add(joined, 1);
    poll_until(deadline, [&] { return (result = store.add(outcome, 0)) != 0; });
    if (result <= 0) store.add(told, 1);  // read the failure, or leaving: rank 0 need not wait
  } catch (const std::exception& e) {
    throw UserError(fmt::format("rank {} of {}: lost the store at {}:{} before all {} ranks reached it: {}", info.rank,
                                info.world_size, info.master_addr, info.master_port, info.world_size, first_line(e)));
  }
  if (result < 0) throw too_few(-result);
  if (result == 0) {
    throw UserError(fmt::format(
        "rank {} of {}: not all {} ranks reached the store at {}:{} within {} (rank 0 "
        "says how many did)",
        info.rank, info.world_size, info.world_size, info.master_addr, info.master_port, in_seconds(timeout)));
  }
}

// The store of a run of several processes, once every rank has reached it: rank 0
// serves it at MASTER_ADDR:MASTER_PORT (on that address only, not on every interface
// as c10d's own socket would), the others connect. Ends within `timeout` with one
// line (UserError) naming the address, the port and the cause.
c10::intrusive_ptr<c10d::Store> open_store(const RankInfo& info, std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(info.master_port);
  options.isServer = info.rank == 0 && !info.agent_store;  // under torchrun the agent serves it
  options.numWorkers = static_cast<std::size_t>(info.world_size);
  options.waitWorkers = false;  // wait_for_ranks, within the deadline
  if (options.isServer) {
    options.masterListenFd = listen_on(info.master_addr, info.master_port);
  } else {
    wait_for_store(info, timeout, deadline);
  }
  // Connecting to a store that accepts connections is quick: what is left, at least a second.
  options.timeout = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                             std::chrono::milliseconds(1000));
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, options);
  } catch (const std::exception& e) {
    throw UserError(fmt::format("rank {} of {}: cannot {} the store at {}:{}: {}", info.rank, info.world_size,
                                options.isServer ? "start" : "connect to", info.master_addr, info.master_port,
                                first_line(e)));
  }
  wait_for_ranks(*store, info, timeout, deadline);
  store->setTimeout(timeout);  // each later wait on it (Gloo's, NCCL's setup) gets the whole timeout
  return store;
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
  // One process needs no server: an in-memory store.
  impl->store = info.world_size == 1 ? c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::HashStore>())
                                     : open_store(info, timeout);
#if defined(PACKTRAIN_HAVE_GLOO)
  impl->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(
      impl->store, static_cast<int>(info.rank), static_cast<int>(info.world_size), gloo_options(info, timeout));
#else
  throw UserError("this packtrain was built without Gloo's headers (Debian's libgloo-dev): no CPU collectives");
#endif
  if (device.is_cuda()) {
    if (!NcclCommunicator::available()) {
      throw UserError("training on " + device.str() +
                      " across processes needs NCCL, and this packtrain was built "
                      "without it");
    }
    impl->join_nccl(device);
  }
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

std::unique_ptr<ProcessGroup> ProcessGroup::subgroup(const std::vector<int64_t>& ranks, const std::string& name) const {
  const auto mine = std::find(ranks.begin(), ranks.end(), rank());
  if (ranks.empty() || mine == ranks.end() || !std::is_sorted(ranks.begin(), ranks.end()) ||
      std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() || ranks.front() < 0 ||
      ranks.back() >= world_size()) {
    throw std::invalid_argument(
        fmt::format("subgroup '{}': ranks [{}] must be ascending ranks of this group of {} "
                    "with this rank ({}) among them",
                    name, fmt::join(ranks, ", "), world_size(), rank()));
  }
  PACKTRAIN_NVTX_RANGE("subgroup rendezvous");
  auto impl = std::make_unique<Impl>();
  impl->info = impl_->info;
  impl->info.rank = mine - ranks.begin();
  impl->info.world_size = static_cast<int64_t>(ranks.size());
  impl->scope = fmt::format("{} ({})", name, impl_->who());
  impl->timeout = impl_->timeout;
  impl->store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("packtrain/group/{}/{}", impl_->subgroups++, name),
                                                       impl_->store);
#if defined(PACKTRAIN_HAVE_GLOO)
  // Gloo's setup connects every pair of the group's ranks through the store.
  impl->backend = impl->guarded(
      [&] {
        return c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, static_cast<int>(impl->info.rank),
                                                           static_cast<int>(impl->info.world_size),
                                                           gloo_options(impl_->info, impl_->timeout));
      },
      "subgroup setup");
#endif
  if (impl_->nccl != nullptr) impl->join_nccl(impl_->nccl->device());
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
  impl_->wait(impl_->guarded([&] { return impl_->backend->allreduce(tensors, options); }, what, step), what, step);
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
  impl_->wait(impl_->guarded([&] { return impl_->backend->broadcast(tensors, options); }, what), what);
}

void ProcessGroup::barrier() {
  c10d::BarrierOptions options;
  options.timeout = impl_->timeout;
  impl_->wait(impl_->guarded([&] { return impl_->backend->barrier(options); }, "barrier"), "barrier");
}

void ProcessGroup::send(const at::Tensor& tensor, int64_t peer, int tag, const char* what, int64_t step) {
  PACKTRAIN_NVTX_RANGE("send");
  ++impl_->calls;
  if (tensor.is_cuda()) {
    impl_->device_backend(tensor, what).send(tensor, peer, what);
    return;
  }
  impl_->check_cpu(tensor, what);
  std::vector<at::Tensor> tensors{tensor};
  impl_->sends.push_back(
      {impl_->guarded([&] { return impl_->backend->send(tensors, static_cast<int>(peer), tag); }, what, step), what,
       step});
}

void ProcessGroup::recv_(at::Tensor& tensor, int64_t peer, int tag, const char* what, int64_t step) {
  PACKTRAIN_NVTX_RANGE("recv");
  ++impl_->calls;
  if (tensor.is_cuda()) {
    impl_->device_backend(tensor, what).recv_(tensor, peer, what);
    return;
  }
  impl_->check_cpu(tensor, what);
  std::vector<at::Tensor> tensors{tensor};
  impl_->wait(impl_->guarded([&] { return impl_->backend->recv(tensors, static_cast<int>(peer), tag); }, what, step),
              what, step);
}

void ProcessGroup::wait_sends() {
  std::vector<Impl::PendingSend> sends;
  sends.swap(impl_->sends);
  for (const Impl::PendingSend& s : sends) impl_->wait(s.work, s.what.c_str(), s.step);
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
