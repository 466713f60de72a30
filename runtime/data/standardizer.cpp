#include "packtrain/runtime/data/standardizer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace packtrain::runtime {

Standardizer Standardizer::fit(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) > 0, "standardizer: expected (N, C) with N > 0, got ", x.sizes());
  const at::Tensor mean = x.mean(0);
  // Population std, as the UCI reference protocol (numpy's default) computes it.
  at::Tensor std = x.std(0, /*unbiased=*/false);
  std = at::where(std.gt(0), std, at::ones_like(std));
  return {mean, std};
}

at::Tensor Standardizer::transform(const at::Tensor& x) const { return (x - mean.to(x.device())) / std.to(x.device()); }

at::Tensor Standardizer::inverse(const at::Tensor& z) const { return z * std.to(z.device()) + mean.to(z.device()); }

}  // namespace packtrain::runtime
