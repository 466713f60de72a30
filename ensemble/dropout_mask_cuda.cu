#include "packtrain/ensemble/dropout_mask_cuda.h"
#include "packtrain/ensemble/dropout_mask_math.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace packtrain::ensemble::detail {

namespace {

constexpr int kThreads = 256;

// One thread per mask value (k * B + b) * H + j, so a warp writes 32 neighbouring
// values (coalesced); each thread derives its row's key itself (three SplitMix
// rounds, cheaper than the memory traffic a shared key would save).
template <typename T>
__global__ void dropout_mask_kernel(T* __restrict__ out, int64_t K, int64_t B, int64_t H,
                                    const double* __restrict__ keep, int64_t first_member, int64_t row_offset,
                                    const int64_t* __restrict__ state) {
  const int64_t total = K * B * H;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / H, j = i % H, k = row / B, b = row % B;
    const uint64_t key = dropout_row_key(static_cast<uint64_t>(state[0]), state[1], first_member + k, row_offset + b);
    // 1 / keep rounded in T, as the CPU pass does.
    const T scale = T(1) / static_cast<T>(keep[k]);
    out[i] = dropout_mask_unit<T>(key, dropout_keep_limit(keep[k]), scale, j);
  }
}

__global__ void advance_draw_kernel(int64_t* state) { state[1] += 1; }

}  // namespace

int launch_dropout_mask(bool is_double, void* out, int64_t K, int64_t B, int64_t H, const double* keep,
                        int64_t first_member, int64_t row_offset, int64_t* state, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t values = K * B * H;
  if (values > 0) {
    const int blocks = static_cast<int>(std::min<int64_t>((values + kThreads - 1) / kThreads, 65535));
    if (is_double) {
      dropout_mask_kernel<double>
          <<<blocks, kThreads, 0, s>>>(static_cast<double*>(out), K, B, H, keep, first_member, row_offset, state);
    } else {
      dropout_mask_kernel<float>
          <<<blocks, kThreads, 0, s>>>(static_cast<float*>(out), K, B, H, keep, first_member, row_offset, state);
    }
  }
  advance_draw_kernel<<<1, 1, 0, s>>>(state);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace packtrain::ensemble::detail
