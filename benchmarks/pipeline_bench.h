// Registration of the pipeline model-parallel benchmark (benchmarks/pipeline_bench.cpp):
// MultiTaskPipeline with S = 1, 2, 4 stages on the CPU.
#pragma once

namespace packtrain::benchmarks {

void register_pipeline_benchmarks();

}  // namespace packtrain::benchmarks
