// Range checks for numeric flags whose messages state the bound plainly
// ("--members: must be >= 1, got 0"), where CLI11's own print a 309-digit range.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <string>

namespace packtrain::cli {

namespace detail {
// A validator passing values v with ok(v); others get "must be <rule>, got <value>".
// Text that is not a number passes here: the option's conversion reports it.
// `name` is what --help shows after the type (CLI11's own: POSITIVE, NONNEGATIVE).
template <typename Ok>
CLI::Validator bound(const std::string& name, const std::string& rule, Ok ok) {
  return CLI::Validator(
      [rule, ok](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);  // 1e400: inf, outside any finite bound
        if (end == text.c_str() || *end != '\0') return {};
        return ok(v) ? std::string() : "must be " + rule + ", got " + text;
      },
      name);
}
}  // namespace detail

// > 0 (counts, sizes, rates).
inline CLI::Validator positive() { return detail::bound("POSITIVE", "> 0", [](double v) { return v > 0; }); }
// >= 0 (seeds, epochs that may be 0, seconds).
inline CLI::Validator non_negative() { return detail::bound("NONNEGATIVE", ">= 0", [](double v) { return v >= 0; }); }
// lo <= v <= hi (nan and inf are outside any range), e.g. a timeout's seconds.
inline CLI::Validator between(double lo, double hi) {
  return detail::bound(fmt::format("[{}, {}]", lo, hi), fmt::format("between {} and {}", lo, hi),
                       [lo, hi](double v) { return v >= lo && v <= hi; });
}
// Finite and >= 0 (a sampling temperature): NaN, inf and what overflows a double
// (1e400) are refused, where non_negative() lets inf through.
inline CLI::Validator finite_non_negative() {
  return detail::bound("FINITE_NONNEGATIVE", "finite and >= 0", [](double v) { return std::isfinite(v) && v >= 0; });
}
// 0 < v < 1 (an interval's level, a probability that must not be certain).
inline CLI::Validator open_unit() {
  return detail::bound("LEVEL", "strictly between 0 and 1", [](double v) { return v > 0 && v < 1; });
}
}  // namespace packtrain::cli
