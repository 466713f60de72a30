// Per-column standardization fitted on the training split only; a constant
// column gets divisor 1. Stored with a model so predictions return to original units.
// What it can represent: the model computes in float32, so a value must be finite in
// float32 (|x| <= 3.4e38, table_reader.h's kMaxCellMagnitude) and so must its
// standardized value (x - mean) / std; anything else is refused, naming the entry.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

namespace packtrain::runtime {

// An entry of a matrix the standardizer cannot represent in float32.
struct Unrepresentable {
  int64_t row = 0, column = 0;  // 0-based
  double value = 0;             // as given
  double standardized = 0;      // (value - mean) / std, as computed in float64

  // "value 1e+300 beyond float32's range (|value| at most 3.4e38)" or "value 1e+30 is
  // 2.5e+45 training standard deviations from the training mean, beyond float32's range".
  std::string problem() const;
};

struct Standardizer {
  at::Tensor mean;  // (C)
  at::Tensor std;   // (C), 1 where the column is constant

  // DataError (naming the row and column of `what`, e.g. "training data") when x
  // holds an entry beyond float32's range, which would overflow the mean and std.
  static Standardizer fit(const at::Tensor& x, const char* what = "data");  // x (N, C)
  at::Tensor transform(const at::Tensor& x) const;
  at::Tensor inverse(const at::Tensor& z) const;

  // The first entry (row-major) of x (N, C) beyond float32's range as given or once
  // standardized; nullopt when every entry is representable.
  std::optional<Unrepresentable> first_unrepresentable(const at::Tensor& x) const;
  // DataError "<what> row R, column C (1-based): <problem>" for the first one.
  void check_representable(const at::Tensor& x, const char* what) const;
};

}  // namespace packtrain::runtime
