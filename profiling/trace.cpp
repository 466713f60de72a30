#include "packtrain/profiling/trace.h"

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace packtrain::profiling {

namespace {

using Clock = std::chrono::steady_clock;

struct Event {
  const char* name;
  char phase;       // 'X' complete range, 'C' counter
  uint64_t thread;  // small per-thread id
  double start_us;
  double duration_us;  // 'X' only
  double value;        // 'C' only
};

struct OpenRange {
  const char* name;
  uint64_t generation;  // which trace it was opened in
  Clock::time_point start;
};

std::atomic<bool> g_recording{false};
std::atomic<uint64_t> g_generation{0};
std::atomic<uint64_t> g_next_thread{1};
std::mutex g_mutex;
std::vector<Event> g_events;  // guarded by g_mutex
Clock::time_point g_origin;   // guarded by g_mutex

thread_local std::vector<OpenRange> t_open;
thread_local uint64_t t_thread = 0;

uint64_t this_thread_id() {
  if (t_thread == 0) t_thread = g_next_thread.fetch_add(1);
  return t_thread;
}

double micros_since(Clock::time_point origin, Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t - origin).count();
}

}  // namespace

void trace_start() {
  std::lock_guard lock(g_mutex);
  g_events.clear();
  g_origin = Clock::now();
  g_generation.fetch_add(1);
  g_recording.store(true);
}

void trace_stop() { g_recording.store(false); }

bool trace_recording() noexcept { return g_recording.load(std::memory_order_relaxed); }

void trace_counter(const char* name, double value) {
  if (!trace_recording()) return;
  const auto now = Clock::now();
  std::lock_guard lock(g_mutex);
  g_events.push_back({name, 'C', this_thread_id(), micros_since(g_origin, now), 0, value});
}

int64_t trace_event_count() {
  std::lock_guard lock(g_mutex);
  return static_cast<int64_t>(g_events.size());
}

namespace detail {

void trace_push(const char* name) noexcept {
  if (!trace_recording()) return;
  try {
    t_open.push_back({name, g_generation.load(), Clock::now()});
  } catch (...) {  // out of memory: drop the range rather than throw from a profiler
  }
}

void trace_pop() noexcept {
  if (t_open.empty()) return;  // the range began before recording started
  const OpenRange open = t_open.back();
  t_open.pop_back();
  if (!trace_recording() || open.generation != g_generation.load()) return;
  const auto now = Clock::now();
  try {
    std::lock_guard lock(g_mutex);
    g_events.push_back(
        {open.name, 'X', this_thread_id(), micros_since(g_origin, open.start), micros_since(open.start, now), 0});
  } catch (...) {
  }
}

}  // namespace detail

std::string chrome_trace_json() {
  nlohmann::json events = nlohmann::json::array();
  const int pid = static_cast<int>(::getpid());
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", "packtrain"}}}});
  std::lock_guard lock(g_mutex);
  for (const Event& e : g_events) {
    nlohmann::json j = {{"name", e.name}, {"cat", "packtrain"}, {"ph", std::string(1, e.phase)},
                        {"pid", pid},     {"tid", e.thread},    {"ts", e.start_us}};
    if (e.phase == 'X') j["dur"] = e.duration_us;
    if (e.phase == 'C') j["args"] = {{"value", e.value}};
    events.push_back(std::move(j));
  }
  return nlohmann::json({{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}).dump();
}

}  // namespace packtrain::profiling
