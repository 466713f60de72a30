// Registration of the multi-task transformer benchmarks (benchmarks/multitask_bench.cpp):
// the step families on any device, the captured ones only on CUDA.
#pragma once

#include <c10/core/Device.h>

namespace packtrain::benchmarks {

void register_multitask_benchmarks(c10::Device device);

}  // namespace packtrain::benchmarks
