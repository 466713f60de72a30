#include "packtrain/runtime/data/standardizer.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/table_reader.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace packtrain::runtime {

namespace {

// The first entry (row-major) of a (N, C) matrix whose mask is set.
std::optional<std::pair<int64_t, int64_t>> first_set(const at::Tensor& mask) {
  const at::Tensor flat = mask.reshape({-1});
  if (!flat.any().item<bool>()) return std::nullopt;
  const int64_t index = flat.to(at::kByte).argmax().item<int64_t>();  // the first maximum
  return std::make_pair(index / mask.size(1), index % mask.size(1));
}

void throw_at(const Unrepresentable& u, const char* what) {
  throw DataError(fmt::format("{} row {}, column {}: {}", what, u.row + 1, u.column + 1, u.problem()));
}

}  // namespace

std::string Unrepresentable::problem() const {
  if (!(std::abs(value) <= kMaxCellMagnitude)) {
    return fmt::format(
        "value {:g} beyond float32's range (±3.4e38, the precision packtrain computes in; rescale the column)", value);
  }
  return fmt::format(
      "value {:g} is {:.3g} training standard deviations from the training mean, beyond float32's "
      "range (at most 3.4e38): the model cannot read it; rescale or drop the row",
      value, standardized);
}

Standardizer Standardizer::fit(const at::Tensor& x, const char* what) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) > 0, "standardizer: expected (N, C) with N > 0, got ", x.sizes());
  if (const auto at = first_set(x.abs().gt(kMaxCellMagnitude) | x.isnan())) {
    const double v = x[at->first][at->second].item<double>();
    throw_at({at->first, at->second, v, v}, what);
  }
  const at::Tensor mean = x.mean(0);
  // Population std, as the UCI reference protocol (numpy's default) computes it.
  at::Tensor std = x.std(0, /*unbiased=*/false);
  std = at::where(std.gt(0), std, at::ones_like(std));
  return {mean, std};
}

at::Tensor Standardizer::transform(const at::Tensor& x) const { return (x - mean.to(x.device())) / std.to(x.device()); }

at::Tensor Standardizer::inverse(const at::Tensor& z) const { return z * std.to(z.device()) + mean.to(z.device()); }

std::optional<Unrepresentable> Standardizer::first_unrepresentable(const at::Tensor& x) const {
  TORCH_CHECK(x.dim() == 2, "standardizer: expected (N, C), got ", x.sizes());
  // In blocks of rows, so a large table needs no second copy of itself.
  constexpr int64_t kBlock = 65536;
  for (int64_t first = 0; first < x.size(0); first += kBlock) {
    const at::Tensor raw = x.detach().narrow(0, first, std::min(kBlock, x.size(0) - first)).to(at::kDouble);
    const at::Tensor z = transform(raw);
    // NaN compares false: !(|v| <= max) catches it as well as infinities.
    const auto at =
        first_set(raw.abs().le(kMaxCellMagnitude).logical_not() | z.abs().le(kMaxCellMagnitude).logical_not());
    if (at) {
      return Unrepresentable{first + at->first, at->second, raw[at->first][at->second].item<double>(),
                             z[at->first][at->second].item<double>()};
    }
  }
  return std::nullopt;
}

void Standardizer::check_representable(const at::Tensor& x, const char* what) const {
  if (const auto u = first_unrepresentable(x)) throw_at(*u, what);
}

}  // namespace packtrain::runtime
