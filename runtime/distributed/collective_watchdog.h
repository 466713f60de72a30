// CollectiveWatchdog: a host-side deadline for collectives the host does not wait
// on — NCCL calls enqueued on a CUDA stream, most of them inside a captured graph,
// which has no NCCL watchdog of its own (a dead peer would otherwise hang every
// other rank forever).
//
// The owner registers each piece of enqueued work with a probe that says whether it
// has completed (a CUDA event's query). A thread polls the oldest piece; each piece
// gets `timeout` from the moment it becomes the oldest (the work before it finished,
// or it was registered), so a long queue of healthy steps never trips it. When a
// piece misses its deadline the watchdog fires once: it runs `on_timeout` (aborting
// the communicator releases kernels stuck on a dead peer) and keeps an error naming
// the work, its steps and this rank, which check() and wait_all() throw on the
// owner's thread. A probe that throws counts as a missed deadline, with its reason. If the owner has not come back for
// it within `grace` (it is stuck in a driver call), the watchdog reports the error itself and ends the process with
// status 1: a hang never outlives its deadline by more than the grace.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace packtrain::runtime::distributed {

struct WatchdogOptions {
  std::chrono::milliseconds timeout{60'000};
  std::chrono::milliseconds grace{10'000};
  std::chrono::milliseconds poll{2};
  std::string who = "rank 0 of 1";  // named in the error
  // Runs once on the watchdog's thread before its first probe (e.g. bind the CUDA
  // device and relax the thread's capture mode: probing an event must not disturb
  // a graph the owner is capturing meanwhile).
  std::function<void()> thread_setup;
  // Runs on a thread of its own (after thread_setup) when a deadline is missed
  // (e.g. abort the NCCL communicator, which may itself block), so the grace clock
  // runs regardless.
  std::function<void()> on_timeout;
  // Ends the process when the owner does not take the error in time; the default
  // prints "packtrain: error: <message>" to stderr and calls std::_Exit(1).
  std::function<void(const std::string& message)> give_up;
};

// One piece of enqueued work: what it is and which steps it belongs to (for the
// error), and whether it has completed. Nothing is formatted unless it times out.
struct WatchedWork {
  const char* what = "collective";
  int64_t first_step = -1;  // -1: not part of a training step
  int64_t last_step = -1;
  std::function<bool()> completed;
};

class CollectiveWatchdog {
 public:
  explicit CollectiveWatchdog(WatchdogOptions options);
  ~CollectiveWatchdog();  // stops and joins the thread; pending work is dropped unchecked
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // Throws CollectiveError (the watchdog already fired) instead of registering.
  void watch(WatchedWork work);
  // Throws CollectiveError once the watchdog has fired; otherwise returns.
  void check();
  // Blocks until every registered piece has completed; throws if one misses its deadline.
  void wait_all();
  int64_t pending() const;
  bool fired() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;  // polls the oldest piece; joined by the destructor
};

// "gradient all-reduce at steps 17-24 did not complete within 60000 ms on rank 1 of 2
// (a peer died, hangs or is far behind)": the message of a missed deadline.
std::string describe_missed_deadline(const WatchedWork& work, std::chrono::milliseconds timeout,
                                     const std::string& who);

}  // namespace packtrain::runtime::distributed
