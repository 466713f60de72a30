// Per-column standardization fitted on the training split only; a constant
// column gets divisor 1. Stored with a model so predictions return to original units.
#pragma once

#include <ATen/core/Tensor.h>

namespace packtrain::runtime {

struct Standardizer {
  at::Tensor mean;  // (C)
  at::Tensor std;   // (C), 1 where the column is constant

  static Standardizer fit(const at::Tensor& x);  // x (N, C)
  at::Tensor transform(const at::Tensor& x) const;
  at::Tensor inverse(const at::Tensor& z) const;
};

}  // namespace packtrain::runtime
