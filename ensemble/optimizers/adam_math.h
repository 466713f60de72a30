// Packed Adam's arithmetic, shared by the CPU pass (adam_update.cpp) and the CUDA
// kernels (adam_update_cuda.cu): a member's coefficients for one update from its
// step count and hyperparameters, and the update of one parameter. Plain C++ with no
// ATen, so nvcc compiles it as well; one definition, so the devices cannot drift.
#pragma once

#include "packtrain/base/host_device.h"

#include <cmath>
#include <cstdint>

namespace packtrain::ensemble::detail {

// The coefficient rows of a (kAdamCoefficientRows, K) float64 table, member k in column k.
enum AdamCoefficientRow : int64_t {
  kActive = 0,               // 1 trains, 0 frozen
  kNegStepSize = 1,          // -lr / (1 - beta1^t)
  kSqrtBiasCorrection2 = 2,  // sqrt(1 - beta2^t)
  kDecayFactor = 3,          // 1 - lr * wd (AdamW); 1 otherwise
  kL2 = 4,                   // wd (Adam's L2 in the gradient); 0 otherwise
  kAdamCoefficientRows = 5,
};

// Member k's coefficients for this update, written into column k of `table`
// (K columns); advances its step count when it trains. `lr`: its learning rate for
// this update (schedule applied). The order of operations is torch::optim's.
PACKTRAIN_HOST_DEVICE inline void adam_member_coefficients(int64_t k, int64_t K, bool trains, double* step, double lr,
                                                           double weight_decay, double beta1, double beta2, bool decay,
                                                           bool decoupled, double* table) {
  const double active = trains ? 1.0 : 0.0;
  step[k] += active;
  const double t = step[k] < 1.0 ? 1.0 : step[k];  // a never-stepped frozen member: no 0/0
  table[kActive * K + k] = active;
  table[kNegStepSize * K + k] = -(lr / (1.0 - pow(beta1, t))) * active;
  table[kSqrtBiasCorrection2 * K + k] = sqrt(1.0 - pow(beta2, t));
  table[kDecayFactor * K + k] = decay && decoupled ? 1.0 - lr * weight_decay * active : 1.0;
  table[kL2 * K + k] = decay && !decoupled ? weight_decay : 0.0;
}

template <typename T>
PACKTRAIN_HOST_DEVICE inline T adam_sqrt(T x) {
#if defined(__CUDA_ARCH__)
  return sqrt(x);
#else
  return std::sqrt(x);
#endif
}

// One parameter's update. Scalars arrive already cast to T, as ATen casts a
// tensor-scalar op's scalar, so float32 rounds as torch::optim does.
template <typename T, bool kWithDecay, bool kWithL2>
PACKTRAIN_HOST_DEVICE inline void adam_element(T& p, T grad, T& m, T& v, T neg_step, T sqrt_bc2, T decay_factor, T l2,
                                               T beta1, T beta2, T one_minus_beta1, T one_minus_beta2, T eps) {
  T w = p;
  if constexpr (kWithDecay) w = w * decay_factor;
  if constexpr (kWithL2) grad = grad + w * l2;
  const T mj = m * beta1 + grad * one_minus_beta1;
  const T vj = v * beta2 + one_minus_beta2 * grad * grad;
  m = mj;
  v = vj;
  const T denom = adam_sqrt(vj) / sqrt_bc2 + eps;
  p = w + (mj / denom) * neg_step;
}

}  // namespace packtrain::ensemble::detail
