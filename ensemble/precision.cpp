#include "packtrain/ensemble/precision.h"

#include <ATen/autocast_mode.h>
#include <ATen/cpu/Utils.h>

#include <string>

namespace packtrain::ensemble {

PrecisionScope::PrecisionScope(Precision precision, c10::DeviceType device)
    : active_(precision == Precision::kBF16Mixed), device_(device) {
  if (!active_) return;
  was_enabled_ = at::autocast::is_autocast_enabled(device_);
  was_caching_ = at::autocast::is_autocast_cache_enabled();
  previous_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_dtype(device_, at::kBFloat16);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_cache_enabled(false);
}

PrecisionScope::~PrecisionScope() {
  if (!active_) return;
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(was_caching_);
}

bool cpu_has_bf16_matrix_units() {
  static const bool has = [] {
    const auto capabilities = at::cpu::get_cpu_capabilities();
    const auto flag = [&](const std::string& name) {
      const auto it = capabilities.find(name);
      return it != capabilities.end() && it->second.isBool() && it->second.toBool();
    };
    return flag("avx512_bf16") || flag("amx_bf16");
  }();
  return has;
}

}  // namespace packtrain::ensemble
