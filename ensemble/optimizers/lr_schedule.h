// Learning-rate schedules computed on the device from each member's step count, so
// a captured step advances them on replay (a host scalar would be frozen into the
// graph). The factor multiplies the member's base learning rate.
#pragma once

#include "packtrain/base/enum_names.h"
#include "packtrain/ensemble/optimizers/lr_schedule_math.h"

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <string_view>

namespace packtrain::ensemble {

enum class LrScheduleKind {
  kConstant,      // factor 1
  kLinearWarmup,  // (t+1)/W for the first W updates, then 1
  kCosine,        // linear warm-up over W updates, then cosine from 1 to min_factor at update T, then min_factor
};

inline constexpr EnumNames<LrScheduleKind, 3> kLrScheduleKindNames{"learning-rate schedule",
                                                                   {{{LrScheduleKind::kConstant, "constant"},
                                                                     {LrScheduleKind::kLinearWarmup, "warmup"},
                                                                     {LrScheduleKind::kCosine, "cosine"}}}};
inline std::string_view to_string(LrScheduleKind kind) { return kLrScheduleKindNames.name(kind); }
// Throws naming the value and the accepted names.
inline LrScheduleKind parse_lr_schedule(std::string_view name) { return kLrScheduleKindNames.parse(name); }

struct LrSchedule {
  /// Example: LrSchedule().kind(LrScheduleKind::kCosine).warmup_steps(100).total_steps(5000)
  TORCH_ARG(LrScheduleKind, kind) = LrScheduleKind::kConstant;
  TORCH_ARG(int64_t, warmup_steps) = 0;  // W
  TORCH_ARG(int64_t, total_steps) = 0;   // T, cosine only: the update where the decay ends
  TORCH_ARG(double, min_factor) = 0.0;   // cosine only: the factor from update T on

 public:
  // Throws naming the offending field and value.
  void validate() const;
  bool is_constant() const { return kind() == LrScheduleKind::kConstant; }

  // The factor of update number t (0 for a member's first update), in host math
  // (lr_schedule_math.h, which the optimizers' loops and kernels share).
  double factor(int64_t t) const { return detail::lr_schedule_factor(params(), static_cast<double>(t)); }
  // The fields as plain values for a kernel.
  detail::LrScheduleParams params() const;
  // The same for every member at once, in ATen ops (the fallback without the CUDA
  // kernels, and the tests' cross-check): t is a (K) float64 tensor of update
  // numbers on any device; returns (K) float64 there, with no host synchronization.
  at::Tensor factor(const at::Tensor& t) const;
};

}  // namespace packtrain::ensemble
