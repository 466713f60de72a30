#include "packtrain/ensemble/optimizers/adam_math.h"
#include "packtrain/ensemble/optimizers/adam_update_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace packtrain::ensemble::detail {

namespace {

constexpr int kThreads = 256;

__global__ void coefficients_kernel(int64_t K, const bool* mask, double* step, const double* lr,
                                    const double* weight_decay, double beta1, double beta2, bool decay,
                                    bool decoupled, double* table) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= K) return;
  adam_member_coefficients(k, K, mask[k], step, lr[k], weight_decay[k], beta1, beta2, decay, decoupled, table);
}

template <typename T, bool kDecay, bool kL2>
__global__ void update_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                              int64_t K, int64_t n, const double* __restrict__ table, T beta1, T beta2,
                              T one_minus_beta1, T one_minus_beta2, T eps) {
  const int64_t total = K * n;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = i / n;
    if (table[kActive * K + k] == 0.0) continue;  // frozen: untouched, whatever its gradient holds
    adam_element<T, kDecay, kL2>(p[i], g[i], m[i], v[i], static_cast<T>(table[kNegStepSize * K + k]),
                                 static_cast<T>(table[kSqrtBiasCorrection2 * K + k]),
                                 static_cast<T>(table[kDecayFactor * K + k]), static_cast<T>(table[kL2 * K + k]),
                                 beta1, beta2, one_minus_beta1, one_minus_beta2, eps);
  }
}

template <typename T>
cudaError_t update(void* p, const void* g, void* m, void* v, int64_t K, int64_t n, const double* table,
                   double beta1, double beta2, double eps, bool decay, bool decoupled, cudaStream_t stream) {
  const int64_t total = K * n;
  const int blocks = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535));
  auto* P = static_cast<T*>(p);
  auto* G = static_cast<const T*>(g);
  auto* M = static_cast<T*>(m);
  auto* V = static_cast<T*>(v);
  // Cast from double once, as the CPU pass does (1 - beta in double, then to T).
  const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2), e = static_cast<T>(eps);
  const T c1 = static_cast<T>(1 - beta1), c2 = static_cast<T>(1 - beta2);
  if (decay && decoupled) {
    update_kernel<T, true, false><<<blocks, kThreads, 0, stream>>>(P, G, M, V, K, n, table, b1, b2, c1, c2, e);
  } else if (decay) {
    update_kernel<T, false, true><<<blocks, kThreads, 0, stream>>>(P, G, M, V, K, n, table, b1, b2, c1, c2, e);
  } else {
    update_kernel<T, false, false><<<blocks, kThreads, 0, stream>>>(P, G, M, V, K, n, table, b1, b2, c1, c2, e);
  }
  return cudaGetLastError();
}

}  // namespace

int launch_adam_coefficients(int64_t K, const bool* mask, double* step, const double* lr,
                             const double* weight_decay, double beta1, double beta2, bool decay, bool decoupled,
                             double* table, void* stream) {
  const int blocks = static_cast<int>((K + kThreads - 1) / kThreads);
  coefficients_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      K, mask, step, lr, weight_decay, beta1, beta2, decay, decoupled, table);
  return static_cast<int>(cudaGetLastError());
}

int launch_adam_update(bool is_double, void* p, const void* g, void* m, void* v, int64_t K, int64_t n,
                       const double* table, double beta1, double beta2, double eps, bool decay, bool decoupled,
                       void* stream) {
  if (K * n == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  return static_cast<int>(is_double ? update<double>(p, g, m, v, K, n, table, beta1, beta2, eps, decay, decoupled, s)
                                    : update<float>(p, g, m, v, K, n, table, beta1, beta2, eps, decay, decoupled, s));
}

}  // namespace packtrain::ensemble::detail
