// Registration of the data-parallel step benchmark (DataParallelStep): what one
// gradient all-reduce per step costs against the gradient bytes, in a world of one
// (Gloo on CPU; on a GPU NCCL, recorded inside the captured step).
#pragma once

#include <c10/core/Device.h>

namespace packtrain::benchmarks {

void register_data_parallel_benchmarks(c10::Device device);

}  // namespace packtrain::benchmarks
