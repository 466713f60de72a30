// Registration of the captured-step benchmark families (CUDA only), so they run
// in the same process as NaiveLoop and PackedEager and ratios come from one run.
// apply_args gives the arguments members, hidden, batch, depth (in that order).
#pragma once

#include <benchmark/benchmark.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace packtrain::benchmarks {

void register_captured_step_benchmarks(c10::Device device, int64_t unroll,
                                       void (*apply_args)(benchmark::internal::Benchmark*));

}  // namespace packtrain::benchmarks
