#include "packtrain/ensemble/optimizers/lr_schedule.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace packtrain::ensemble {

void LrSchedule::validate() const {
  TORCH_CHECK(warmup_steps() >= 0, "lr schedule: warmup steps must be >= 0, got ", warmup_steps());
  TORCH_CHECK(kind() != LrScheduleKind::kLinearWarmup || warmup_steps() > 0,
              "lr schedule: warmup needs warmup steps > 0, got ", warmup_steps());
  if (kind() == LrScheduleKind::kCosine) {
    TORCH_CHECK(total_steps() > warmup_steps(), "lr schedule: cosine needs total steps (", total_steps(),
                ") greater than warmup steps (", warmup_steps(), ")");
    TORCH_CHECK(min_factor() >= 0 && min_factor() <= 1, "lr schedule: min factor must be in [0, 1], got ",
                min_factor());
  }
}

detail::LrScheduleParams LrSchedule::params() const {
  static_assert(static_cast<int32_t>(LrScheduleKind::kConstant) == detail::kScheduleConstant &&
                static_cast<int32_t>(LrScheduleKind::kLinearWarmup) == detail::kScheduleLinearWarmup &&
                static_cast<int32_t>(LrScheduleKind::kCosine) == detail::kScheduleCosine);
  return {static_cast<int32_t>(kind()), static_cast<double>(warmup_steps()), static_cast<double>(total_steps()),
          min_factor()};
}

at::Tensor LrSchedule::factor(const at::Tensor& t_in) const {
  TORCH_CHECK(t_in.scalar_type() == at::kDouble, "lr schedule: update numbers must be float64, got ",
              t_in.scalar_type());
  const at::Tensor t = t_in.clamp_min(0);
  if (kind() == LrScheduleKind::kConstant) return at::ones_like(t);
  const auto W = static_cast<double>(warmup_steps());
  const at::Tensor warm = W > 0 ? ((t + 1) / W).clamp_max_(1.0) : at::ones_like(t);
  if (kind() == LrScheduleKind::kLinearWarmup) return warm;
  const at::Tensor p = ((t - W) / (static_cast<double>(total_steps()) - W)).clamp_(0.0, 1.0);
  const at::Tensor cosine = (p * std::numbers::pi).cos_().add_(1).mul_(0.5 * (1 - min_factor())).add_(min_factor());
  return at::where(t < W, warm, cosine);
}

}  // namespace packtrain::ensemble
