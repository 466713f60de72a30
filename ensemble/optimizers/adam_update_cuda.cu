#include "packtrain/ensemble/optimizers/adam_math.h"
#include "packtrain/ensemble/optimizers/adam_update_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace packtrain::ensemble::detail {

namespace {

constexpr int kThreads = 256;

__global__ void coefficients_kernel(int64_t K, const bool* mask, double* step, const double* base_lr,
                                    LrScheduleParams schedule, double* current_lr, const double* weight_decay,
                                    double beta1, double beta2, bool decay, bool decoupled, double* table) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= K) return;
  // The rate of this update from the count of earlier ones (read before it advances).
  const double lr = base_lr[k] * lr_schedule_factor(schedule, step[k]);
  current_lr[k] = lr;
  adam_member_coefficients(k, K, mask[k], step, lr, weight_decay[k], beta1, beta2, decay, decoupled, table);
}

// Block ends (K * n[b] cumulated) and sizes, passed by value: the kernel's
// arguments hold the whole layout, so one launch covers every parameter. The kernel
// takes it __grid_constant__, so indexing it by a runtime block number reads the
// parameter space in place instead of copying 776 bytes to each thread's local memory.
struct FlatLayout {
  int64_t end[kMaxFlatBlocks];
  int64_t numel[kMaxFlatBlocks];
  int blocks;
};

// kWith*: not kL2, which would hide the table row kL2 (adam_math.h) inside the kernel
// (the first H100 run, 2026-11-26, read the step-size row as the L2 coefficient).
template <typename T, bool kWithDecay, bool kWithL2>
__global__ void update_flat_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                                   int64_t K, const __grid_constant__ FlatLayout layout,
                                   const double* __restrict__ table, T beta1, T beta2, T one_minus_beta1,
                                   T one_minus_beta2, T eps) {
  const int64_t total = layout.end[layout.blocks - 1];
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int b = 0;
    while (i >= layout.end[b]) ++b;  // a handful of blocks: a short scan, the same for a whole warp mostly
    const int64_t start = b == 0 ? 0 : layout.end[b - 1];
    const int64_t k = (i - start) / layout.numel[b];
    if (table[kActive * K + k] == 0.0) continue;  // frozen: untouched, whatever its gradient holds
    adam_element<T, kWithDecay, kWithL2>(
        p[i], g[i], m[i], v[i], static_cast<T>(table[kNegStepSize * K + k]),
        static_cast<T>(table[kSqrtBiasCorrection2 * K + k]), static_cast<T>(table[kDecayFactor * K + k]),
        static_cast<T>(table[kL2 * K + k]), beta1, beta2, one_minus_beta1, one_minus_beta2, eps);
  }
}

template <typename T>
cudaError_t update_flat(void* p, const void* g, void* m, void* v, int64_t K, const FlatLayout& layout,
                        const double* table, double beta1, double beta2, double eps, bool decay, bool decoupled,
                        cudaStream_t stream) {
  const int64_t total = layout.end[layout.blocks - 1];
  if (total == 0) return cudaSuccess;
  const int grid = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535));
  auto* P = static_cast<T*>(p);
  auto* G = static_cast<const T*>(g);
  auto* M = static_cast<T*>(m);
  auto* V = static_cast<T*>(v);
  // Cast from double once, as the CPU pass does (1 - beta in double, then to T).
  const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2), e = static_cast<T>(eps);
  const T c1 = static_cast<T>(1 - beta1), c2 = static_cast<T>(1 - beta2);
  if (decay && decoupled) {
    update_flat_kernel<T, true, false><<<grid, kThreads, 0, stream>>>(P, G, M, V, K, layout, table, b1, b2, c1, c2, e);
  } else if (decay) {
    update_flat_kernel<T, false, true><<<grid, kThreads, 0, stream>>>(P, G, M, V, K, layout, table, b1, b2, c1, c2, e);
  } else {
    update_flat_kernel<T, false, false><<<grid, kThreads, 0, stream>>>(P, G, M, V, K, layout, table, b1, b2, c1, c2, e);
  }
  return cudaGetLastError();
}

}  // namespace

int launch_adam_coefficients(int64_t K, const bool* mask, double* step, const double* base_lr,
                             const LrScheduleParams& schedule, double* current_lr, const double* weight_decay,
                             double beta1, double beta2, bool decay, bool decoupled, double* table, void* stream) {
  const int blocks = static_cast<int>((K + kThreads - 1) / kThreads);
  coefficients_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      K, mask, step, base_lr, schedule, current_lr, weight_decay, beta1, beta2, decay, decoupled, table);
  return static_cast<int>(cudaGetLastError());
}

int launch_adam_update_flat(bool is_double, void* p, const void* g, void* m, void* v, int64_t K, const int64_t* numels,
                            int blocks, const double* table, double beta1, double beta2, double eps, bool decay,
                            bool decoupled, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const size_t element = is_double ? sizeof(double) : sizeof(float);
  int64_t offset = 0;
  // kMaxFlatBlocks blocks per launch: one launch for any pack with at most that many.
  for (int first = 0; first < blocks; first += kMaxFlatBlocks) {
    FlatLayout layout{};
    layout.blocks = std::min(blocks - first, kMaxFlatBlocks);
    int64_t end = 0;
    for (int b = 0; b < layout.blocks; ++b) {
      layout.numel[b] = numels[first + b];
      end += K * numels[first + b];
      layout.end[b] = end;
    }
    auto* P = static_cast<char*>(p) + offset * element;
    const auto* G = static_cast<const char*>(g) + offset * element;
    auto* M = static_cast<char*>(m) + offset * element;
    auto* V = static_cast<char*>(v) + offset * element;
    const cudaError_t error =
        is_double ? update_flat<double>(P, G, M, V, K, layout, table, beta1, beta2, eps, decay, decoupled, s)
                  : update_flat<float>(P, G, M, V, K, layout, table, beta1, beta2, eps, decay, decoupled, s);
    if (error != cudaSuccess) return static_cast<int>(error);
    offset += end;
  }
  return 0;
}

}  // namespace packtrain::ensemble::detail
