// PACKTRAIN_HOST_DEVICE: marks plain-C++ math that nvcc compiles for the device too
// (the optimizer's arithmetic, the learning-rate schedule), so the CPU pass and the
// CUDA kernels share one definition and cannot drift.
#pragma once

#if defined(__CUDACC__)
#define PACKTRAIN_HOST_DEVICE __host__ __device__
#else
#define PACKTRAIN_HOST_DEVICE
#endif
