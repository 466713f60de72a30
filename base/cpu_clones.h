// PACKTRAIN_CPU_CLONES: compiles a hot CPU loop for AVX-512, AVX2 and baseline
// x86-64, picked at load time by the CPU it runs on (the build itself targets
// baseline x86-64, so without it the loops use SSE2's 4 float lanes).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define PACKTRAIN_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PACKTRAIN_CPU_CLONES
#endif
