// One pass over a (K, n) parameter block for packed Adam/AdamW on the CPU: reads
// the gradient, weights and both moments once and writes them once, instead of the
// eight tensor-op passes of the generic path. Masked members' rows are skipped, so
// a frozen member is untouched bit for bit whatever its gradient holds.
#pragma once

#include <ATen/core/Tensor.h>

namespace packtrain::ensemble::detail {

// Per-member coefficients, each (K) float64 on the CPU.
struct AdamCoefficients {
  at::Tensor active;                 // 1 trains, 0 frozen
  at::Tensor neg_step_size;          // -lr / (1 - beta1^t)
  at::Tensor sqrt_bias_correction2;  // sqrt(1 - beta2^t)
  at::Tensor decay_factor;           // 1 - lr * wd (AdamW), or undefined
  at::Tensor l2;                     // wd (Adam), or undefined
};

// Row views of a (5, K) coefficient table (adam_math.h's rows); decay_factor and
// l2 are defined only for the variant that uses them.
AdamCoefficients coefficient_rows(const at::Tensor& table, bool decay, bool decoupled);

// p, g, m, v: contiguous (K, n) CPU blocks of one dtype.
void adam_update_cpu(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                     const AdamCoefficients& c, double beta1, double beta2, double eps);

// p, g, m, v: (K, n) blocks on any device. Zeroes masked members' gradients in g.
void adam_update_tensor_ops(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                            const AdamCoefficients& c, double beta1, double beta2, double eps);

}  // namespace packtrain::ensemble::detail
