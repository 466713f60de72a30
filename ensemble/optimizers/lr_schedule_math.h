// A learning-rate schedule's factor for one member's update, in plain C++ that nvcc
// compiles too: the host reference (LrSchedule::factor), the CPU optimizer loop and
// the CUDA Adam coefficient kernel all call this one function, so a schedule costs
// no extra kernels in a captured step.
#pragma once

#include "packtrain/base/host_device.h"

#include <cmath>
#include <cstdint>

namespace packtrain::ensemble::detail {

// LrSchedule's fields as plain values; kind is LrScheduleKind's value
// (0 constant, 1 linear warm-up, 2 cosine).
struct LrScheduleParams {
  int32_t kind = 0;
  double warmup = 0;      // W
  double total = 0;       // T (cosine)
  double min_factor = 0;  // cosine's floor
};

inline constexpr int32_t kScheduleConstant = 0, kScheduleLinearWarmup = 1, kScheduleCosine = 2;

// The factor of update number t (0 for a member's first update).
PACKTRAIN_HOST_DEVICE inline double lr_schedule_factor(const LrScheduleParams& s, double t) {
  if (s.kind == kScheduleConstant) return 1.0;
  t = t < 0 ? 0 : t;
  if (t < s.warmup) return (t + 1) / s.warmup;
  if (s.kind == kScheduleLinearWarmup) return 1.0;
  double p = (t - s.warmup) / (s.total - s.warmup);
  p = p > 1 ? 1 : p;
  return s.min_factor + (1 - s.min_factor) * 0.5 * (1 + cos(3.14159265358979323846 * p));
}

}  // namespace packtrain::ensemble::detail
