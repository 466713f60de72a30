// Chrome trace export of packtrain's NVTX ranges: while a trace is recording,
// every range pushed through profiling/nvtx.h is also kept with its host start and
// duration, so a run without Nsight can be opened in Perfetto (ui.perfetto.dev) or
// chrome://tracing. Costs one relaxed atomic load per range when not recording.
#pragma once

#include <cstdint>
#include <string>

namespace packtrain::profiling {

// Starts recording (discarding what an earlier trace held). Start and stop outside
// open ranges: a range is recorded when both its push and its pop happen while
// recording.
void trace_start();
void trace_stop();
bool trace_recording() noexcept;

// A counter sample ("C" event) at the current time, e.g. device µs per step.
void trace_counter(const char* name, double value);

// Number of completed ranges recorded so far.
int64_t trace_event_count();

// The recorded ranges as Chrome trace JSON ({"traceEvents": [...]}), timestamps in
// µs since trace_start().
// (The runtime writes it to a file with runtime/io's atomic, symlink-safe write.)
std::string chrome_trace_json();

namespace detail {
// Called by nvtx_push / nvtx_pop.
void trace_push(const char* name) noexcept;
void trace_pop() noexcept;
}  // namespace detail

}  // namespace packtrain::profiling
