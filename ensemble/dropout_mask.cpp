#include "packtrain/ensemble/dropout_mask.h"

#include "packtrain/base/cpu_clones.h"
#include "packtrain/ensemble/dropout_mask_math.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace packtrain::ensemble::detail {

namespace {

struct MaskRows {
  uint64_t seed;
  int64_t draw, first_member, row_offset, B, H;
  const uint32_t* limits;  // per member
};

template <typename T>
inline void mask_rows(const MaskRows& m, const T* scales, T* out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const int64_t k = i / m.B, b = i % m.B;
    dropout_mask_row<T>(dropout_row_key(m.seed, m.draw, m.first_member + k, m.row_offset + b), m.limits[k], scales[k],
                        m.H, out + i * m.H);
  }
}

// The float32 and float64 loops in AVX2 / AVX-512 clones: the 32-bit hash over a
// row's units vectorizes.
PACKTRAIN_CPU_CLONES void mask_rows_cloned(const MaskRows& m, const float* scales, float* out, int64_t begin,
                                           int64_t end) {
  mask_rows(m, scales, out, begin, end);
}
PACKTRAIN_CPU_CLONES void mask_rows_cloned(const MaskRows& m, const double* scales, double* out, int64_t begin,
                                           int64_t end) {
  mask_rows(m, scales, out, begin, end);
}
template <typename T>
void mask_rows_cloned(const MaskRows& m, const T* scales, T* out, int64_t begin, int64_t end) {
  mask_rows(m, scales, out, begin, end);
}

}  // namespace

void fill_dropout_mask_cpu(const at::Tensor& noise, const std::vector<double>& keep, uint64_t seed, int64_t draw,
                           int64_t first_member, int64_t row_offset) {
  TORCH_CHECK(noise.dim() == 3 && noise.is_contiguous() && noise.device().is_cpu(),
              "fill_dropout_mask_cpu: expected a contiguous (K, B, H) CPU tensor, got ", noise.sizes());
  const int64_t K = noise.size(0), B = noise.size(1), H = noise.size(2);
  TORCH_CHECK(static_cast<int64_t>(keep.size()) == K, "fill_dropout_mask_cpu: ", keep.size(), " keep rates for ", K,
              " members");
  // About 64k mask values per task (tens of microseconds): a smaller mask is not
  // worth waking threads for (measured: the wake-ups cost more than the hashing).
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(H, 1));
  std::vector<uint32_t> limits(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) limits[static_cast<size_t>(k)] = dropout_keep_limit(keep[static_cast<size_t>(k)]);
  const MaskRows rows{seed, draw, first_member, row_offset, B, H, limits.data()};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, noise.scalar_type(), "dropout_mask", [&] {
    // 1 / keep in the mask's type or float32 for the half types (their CUDA masks are
    // float32's, cast), then rounded to the mask's type: the devices agree to the bit.
    using opmath_t = at::opmath_type<scalar_t>;
    std::vector<scalar_t> scales;
    for (const double kr : keep) scales.push_back(static_cast<scalar_t>(opmath_t(1) / static_cast<opmath_t>(kr)));
    scalar_t* out = noise.data_ptr<scalar_t>();
    at::parallel_for(0, K * B, grain,
                     [&](int64_t begin, int64_t end) { mask_rows_cloned(rows, scales.data(), out, begin, end); });
  });
}

}  // namespace packtrain::ensemble::detail
