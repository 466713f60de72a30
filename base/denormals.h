// FlushDenormals: while alive, this thread's float arithmetic treats subnormal
// inputs and results as zero (x86-64 MXCSR's DAZ and FTZ bits; a no-op elsewhere).
//
// Why: on x86 an operation that meets a subnormal takes a microcode assist, ~100x
// its normal cost. Training makes them routinely — a dead ReLU unit's Adam moments
// decay geometrically through the subnormal range — and the packed CPU step then ran
// at half speed (the default `packtrain train`: 1.19 s with them, 0.63 s without).
// Values below 1.2e-38 (float) change nothing a loss or a prediction can show; the
// tests comparing the fused CPU step and AdamW with autograd and torch::optim hold.
// The previous mode is restored on destruction, so callers' threads are untouched.
#pragma once

#if defined(__x86_64__) && !defined(__CUDACC__)
#include <xmmintrin.h>
#endif

namespace packtrain {

class FlushDenormals {
 public:
#if defined(__x86_64__) && !defined(__CUDACC__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
  unsigned saved_;
#else
  FlushDenormals() = default;
#endif
 public:
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;
};

}  // namespace packtrain
