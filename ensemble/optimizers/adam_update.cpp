#include "packtrain/ensemble/optimizers/adam_update.h"

#include "packtrain/base/cpu_clones.h"
#include "packtrain/base/denormals.h"

#include "packtrain/ensemble/member_chunks.h"
#include "packtrain/ensemble/optimizers/adam_math.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace packtrain::ensemble::detail {

namespace {

// The update of rows [begin, end) for one variant (AdamW decay / Adam L2 / none),
// branch-free in the inner loop so it vectorizes (built with -fopenmp
// -fno-math-errno). Scalars are cast to scalar_t first, as ATen does for a
// tensor-scalar op, so float32 rounds as torch::optim does.
template <typename scalar_t, bool kWithDecay, bool kWithL2>
[[gnu::always_inline]] inline void adam_rows(scalar_t* P, const scalar_t* G, scalar_t* M, scalar_t* V, int64_t n,
                                             int64_t begin, int64_t end, const AdamCoefficients& c, double beta1,
                                             double beta2, double eps) {
  const double* active = c.active.data_ptr<double>();
  const double* neg_step = c.neg_step_size.data_ptr<double>();
  const double* sqrt_bc2 = c.sqrt_bias_correction2.data_ptr<double>();
  const double* decay = kWithDecay ? c.decay_factor.data_ptr<double>() : nullptr;
  const double* l2 = kWithL2 ? c.l2.data_ptr<double>() : nullptr;
  const auto b1 = static_cast<scalar_t>(beta1), b2 = static_cast<scalar_t>(beta2);
  const auto one_minus_b1 = static_cast<scalar_t>(1 - beta1), one_minus_b2 = static_cast<scalar_t>(1 - beta2);
  const auto epsilon = static_cast<scalar_t>(eps);
  for (int64_t k = begin; k < end; ++k) {
    if (active[k] == 0) continue;  // frozen: untouched
    const auto step = static_cast<scalar_t>(neg_step[k]);
    const auto bc2 = static_cast<scalar_t>(sqrt_bc2[k]);
    const auto dec = kWithDecay ? static_cast<scalar_t>(decay[k]) : scalar_t(1);
    const auto wd = kWithL2 ? static_cast<scalar_t>(l2[k]) : scalar_t(0);
    scalar_t* __restrict__ pk = P + k * n;
    const scalar_t* __restrict__ gk = G + k * n;
    scalar_t* __restrict__ mk = M + k * n;
    scalar_t* __restrict__ vk = V + k * n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      adam_element<scalar_t, kWithDecay, kWithL2>(pk[j], gk[j], mk[j], vk[j], step, bc2, dec, wd, b1, b2, one_minus_b1,
                                                  one_minus_b2, epsilon);
    }
  }
}

// One instantiation per dtype, cloned for the CPU's widest vectors (AVX-512's
// sqrt and division are as exact as SSE2's: the same results, 4x the lanes).
template <typename scalar_t>
[[gnu::always_inline]] inline void adam_rows_any(scalar_t* P, const scalar_t* G, scalar_t* M, scalar_t* V, int64_t n,
                                                 int64_t begin, int64_t end, const AdamCoefficients& c, double beta1,
                                                 double beta2, double eps) {
  if (c.decay_factor.defined()) {
    adam_rows<scalar_t, true, false>(P, G, M, V, n, begin, end, c, beta1, beta2, eps);
  } else if (c.l2.defined()) {
    adam_rows<scalar_t, false, true>(P, G, M, V, n, begin, end, c, beta1, beta2, eps);
  } else {
    adam_rows<scalar_t, false, false>(P, G, M, V, n, begin, end, c, beta1, beta2, eps);
  }
}
PACKTRAIN_CPU_CLONES void adam_rows_cloned(float* P, const float* G, float* M, float* V, int64_t n, int64_t begin,
                                           int64_t end, const AdamCoefficients& c, double beta1, double beta2,
                                           double eps) {
  adam_rows_any(P, G, M, V, n, begin, end, c, beta1, beta2, eps);
}
PACKTRAIN_CPU_CLONES void adam_rows_cloned(double* P, const double* G, double* M, double* V, int64_t n, int64_t begin,
                                           int64_t end, const AdamCoefficients& c, double beta1, double beta2,
                                           double eps) {
  adam_rows_any(P, G, M, V, n, begin, end, c, beta1, beta2, eps);
}

template <typename scalar_t>
void adam_block(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                const AdamCoefficients& c, double beta1, double beta2, double eps) {
  const int64_t K = p.size(0), n = p.size(1);
  scalar_t* P = p.data_ptr<scalar_t>();
  const scalar_t* G = g.data_ptr<scalar_t>();
  scalar_t* M = m.data_ptr<scalar_t>();
  scalar_t* V = v.data_ptr<scalar_t>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
  parallel_member_chunks(K, grain, [&](MemberChunks& chunks) {
    const FlushDenormals no_subnormals;  // decaying moments of idle weights turn subnormal
    for (int64_t begin, end; chunks.next(begin, end);)
      adam_rows_cloned(P, G, M, V, n, begin, end, c, beta1, beta2, eps);
  });
}

// (K) float64 coefficients as a (K, 1) column in the block's dtype.
at::Tensor column(const at::Tensor& per_member, const at::Tensor& like) {
  return per_member.to(like.scalar_type()).view({-1, 1});
}

}  // namespace

AdamCoefficients coefficient_rows(const at::Tensor& table, bool decay, bool decoupled) {
  AdamCoefficients c;
  c.active = table[kActive];
  c.neg_step_size = table[kNegStepSize];
  c.sqrt_bias_correction2 = table[kSqrtBiasCorrection2];
  if (decay && decoupled) c.decay_factor = table[kDecayFactor];
  if (decay && !decoupled) c.l2 = table[kL2];
  return c;
}

void adam_update_tensor_ops(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                            const AdamCoefficients& c, double beta1, double beta2, double eps) {
  // Frozen members: gradient zeroed (NaN-safe), moments scaled by 1 plus 0,
  // weights moved by 0. (where() of two scalars would be float32: one operand is
  // always a float64 tensor.)
  const at::Tensor training = c.active.ne(0);
  g.masked_fill_(training.logical_not().view({-1, 1}), 0);
  const at::Tensor keep1 = column(at::where(training, at::full_like(c.active, beta1), 1.0), p);
  const at::Tensor keep2 = column(at::where(training, at::full_like(c.active, beta2), 1.0), p);
  const at::Tensor take1 = column(c.active * (1 - beta1), p);
  const at::Tensor take2 = column(c.active * (1 - beta2), p);
  at::Tensor grad = g;
  if (c.decay_factor.defined()) p.mul_(column(c.decay_factor, p));  // AdamW: decay the weights
  if (c.l2.defined()) grad = g.addcmul(p, column(c.l2, p));         // Adam: L2 in the gradient
  m.mul_(keep1).addcmul_(grad, take1);
  v.mul_(keep2).addcmul_(grad * take2, grad);
  const at::Tensor denom = (v.sqrt() / column(c.sqrt_bias_correction2, p)).add_(eps);
  p.addcmul_(m / denom, column(c.neg_step_size, p));
}

void adam_update_cpu(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                     const AdamCoefficients& c, double beta1, double beta2, double eps) {
  TORCH_INTERNAL_ASSERT(p.is_contiguous() && g.is_contiguous() && m.is_contiguous() && v.is_contiguous());
  switch (p.scalar_type()) {
    case at::kFloat: return adam_block<float>(p, g, m, v, c, beta1, beta2, eps);
    case at::kDouble: return adam_block<double>(p, g, m, v, c, beta1, beta2, eps);
    default: TORCH_CHECK(false, "packed Adam on CPU supports float32 and float64 parameters, got ", p.scalar_type());
  }
}

}  // namespace packtrain::ensemble::detail
