// The arithmetic a pack trains and predicts in. fp32: everything float32.
// bf16-mixed: torch.autocast's bfloat16 policy, which Lightning's
// precision="bf16-mixed" is: matrix products and convolutions take bfloat16
// operands (weights, activations, incoming gradients), accumulate in float32 and
// return bfloat16; losses, reductions, the optimizer and its float32 master weights
// stay float32, and a model's output is returned as float32. The autograd paths
// run under LibTorch's own autocast (PrecisionScope); the MLP's fused CPU step
// rounds at the same points itself (cpu_fused_step.h).
#pragma once

#include "packtrain/base/enum_names.h"

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <string_view>

namespace packtrain::ensemble {

enum class Precision { kFP32, kBF16Mixed };
inline constexpr EnumNames<Precision, 2> kPrecisionNames{
    "precision", {{{Precision::kFP32, "fp32"}, {Precision::kBF16Mixed, "bf16-mixed"}}}};
inline std::string_view to_string(Precision precision) { return kPrecisionNames.name(precision); }
// Throws naming the value and the accepted names.
inline Precision parse_precision(std::string_view name) { return kPrecisionNames.parse(name); }

// Autocast to bfloat16 on `device` while open, for kBF16Mixed (a no-op for kFP32).
// Its cast cache is off, as CUDA graph capture requires (a cached weight cast would
// outlive the graph's memory pool), so every step casts its weights afresh: the
// casts' buffers are the step's own, static under capture. Restores the thread's
// previous autocast state (autocast is thread-local: each member-parallel thread
// opens its own).
class PrecisionScope {
 public:
  PrecisionScope(Precision precision, c10::DeviceType device);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_ = c10::DeviceType::CPU;
  bool was_enabled_ = false;
  bool was_caching_ = true;
  c10::ScalarType previous_dtype_ = c10::ScalarType::BFloat16;
};

// Whether this CPU multiplies bfloat16 matrices in hardware (AVX-512 BF16 or AMX
// tiles): where bf16-mixed can be faster than fp32 on a CPU. Without either,
// LibTorch's and MKL's bfloat16 GEMMs convert to float32 and run slower than
// float32's (0.32x on an AVX-512 Xeon without them: benchmarks/RESULTS.md).
bool cpu_has_bf16_matrix_units();

}  // namespace packtrain::ensemble
