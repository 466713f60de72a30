#include "packtrain/runtime/distributed/collective_watchdog.h"

#include "packtrain/runtime/distributed/collective_error.h"

#include <fmt/format.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

namespace packtrain::runtime::distributed {

using Clock = std::chrono::steady_clock;

std::string describe_missed_deadline(const WatchedWork& work, std::chrono::milliseconds timeout,
                                     const std::string& who) {
  std::string steps;
  if (work.first_step >= 0) {
    steps = work.last_step > work.first_step ? fmt::format(" at steps {}-{}", work.first_step, work.last_step)
                                             : fmt::format(" at step {}", work.first_step);
  }
  return fmt::format("{}{} did not complete within {} ms on {} (a peer died, hangs or is far behind)", work.what, steps,
                     timeout.count(), who);
}

struct CollectiveWatchdog::State {
  WatchdogOptions options;
  struct Entry {
    WatchedWork work;
    Clock::time_point start;  // when its deadline clock started
  };
  mutable std::mutex mutex;
  std::condition_variable changed;
  std::deque<Entry> queue;  // push_back keeps references to the front valid
  bool fired = false, taken = false, stop = false;
  std::string message;

  void run() {
    std::string setup_error;
    try {
      if (options.thread_setup) options.thread_setup();
    } catch (const std::exception& e) {
      setup_error = e.what();
    }
    std::unique_lock lock(mutex);
    while (!stop) {
      if (queue.empty()) {
        changed.wait_for(lock, options.poll);
        continue;
      }
      Entry& front = queue.front();
      lock.unlock();
      bool done = false;
      std::string probe_error = setup_error;
      if (probe_error.empty()) {
        try {
          done = front.work.completed();  // outside the lock: a driver call
        } catch (const std::exception& e) {
          probe_error = e.what();
        }
      }
      const Clock::time_point now = Clock::now();
      lock.lock();
      if (done) {
        queue.pop_front();
        if (!queue.empty() && queue.front().start < now) queue.front().start = now;
        changed.notify_all();
        continue;
      }
      if (probe_error.empty() && now - front.start <= options.timeout) {
        changed.wait_for(lock, options.poll, [this] { return stop; });
        continue;
      }
      fired = true;
      message = probe_error.empty() ? describe_missed_deadline(front.work, options.timeout, options.who)
                                    : fmt::format("{} failed on {}: {}", front.work.what, options.who,
                                                  probe_error.substr(0, probe_error.find('\n')));
      changed.notify_all();
      // The abort may block (NCCL waits for graphs that hold its kernels): it runs on
      // a thread of its own and the grace clock starts now.
      if (options.on_timeout) {
        std::thread([setup = options.thread_setup, abort = options.on_timeout] {
          try {
            if (setup) setup();  // the same device and capture mode as the probes
          } catch (const std::exception&) {
          }
          abort();
        }).detach();
      }
      if (!changed.wait_for(lock, options.grace, [this] { return taken || stop; })) {
        const std::string m = message;
        lock.unlock();
        options.give_up(m);
        return;
      }
      return;
    }
  }

  [[noreturn]] void throw_fired() {
    taken = true;
    changed.notify_all();
    throw CollectiveError(message);
  }
};

namespace {
void report_and_exit(const std::string& message) {
  std::fprintf(stderr, "packtrain: error: %s\n", message.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}
}  // namespace

CollectiveWatchdog::CollectiveWatchdog(WatchdogOptions options) : state_(std::make_shared<State>()) {
  if (!options.give_up) options.give_up = report_and_exit;
  state_->options = std::move(options);
  thread_ = std::thread([state = state_] { state->run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
    state_->changed.notify_all();
  }
  thread_.join();
}

void CollectiveWatchdog::watch(WatchedWork work) {
  std::lock_guard lock(state_->mutex);
  if (state_->fired) state_->throw_fired();
  state_->queue.push_back({std::move(work), Clock::now()});
  state_->changed.notify_all();
}

void CollectiveWatchdog::check() {
  std::lock_guard lock(state_->mutex);
  if (state_->fired) state_->throw_fired();
}

void CollectiveWatchdog::wait_all() {
  std::unique_lock lock(state_->mutex);
  state_->changed.wait(lock, [this] { return state_->fired || state_->queue.empty(); });
  if (state_->fired) state_->throw_fired();
}

int64_t CollectiveWatchdog::pending() const {
  std::lock_guard lock(state_->mutex);
  return static_cast<int64_t>(state_->queue.size());
}

bool CollectiveWatchdog::fired() const {
  std::lock_guard lock(state_->mutex);
  return state_->fired;
}

}  // namespace packtrain::runtime::distributed
