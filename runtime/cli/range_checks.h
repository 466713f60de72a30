// Range checks for numeric flags whose messages state the bound plainly
// ("--members: must be >= 1, got 0"), where CLI11's own print a 309-digit range,
// and integers read exactly (make_integer_options_exact).
#pragma once

#include "packtrain/base/number_text.h"

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
inline CLI::Validator positive() {
  return detail::bound("POSITIVE", "> 0", [](double v) { return v > 0; });
}
// >= 0 (seeds, epochs that may be 0, seconds).
inline CLI::Validator non_negative() {
  return detail::bound("NONNEGATIVE", ">= 0", [](double v) { return v >= 0; });
}
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
// A central interval's level: open_unit(), and both tails, (1 - v) / 2 and
// (1 + v) / 2, strictly inside (0, 1) as doubles (0.9999999999999999's upper tail
// rounds to 1).
inline CLI::Validator interval_level() {
  const CLI::Validator level = open_unit();
  const CLI::Validator tails =
      detail::bound("", "at most 0.9999999999999998 (the upper tail (1 + level) / 2 of a larger level rounds to 1)",
                    [](double v) { return !(v > 0 && v < 1) || ((1 - v) / 2 > 0 && (1 + v) / 2 < 1); });
  return CLI::Validator(
      [level, tails](std::string& text) {
        const std::string problem = level(text);
        return problem.empty() ? tails(text) : problem;
      },
      "LEVEL");
}

// An integer option's text read exactly as an int64 (or a uint64): out of range is
// an error stating the range, where CLI11's own conversion saturates (strtoll) or
// wraps (strtoull reads -1 as 2^64 - 1). The text is handed on in plain decimal, so
// "010" is 10 (not octal 8) and 0x10 is 16.
inline CLI::Validator exact_integer(bool is_signed) {
  return CLI::Validator(
      [is_signed](std::string& text) -> std::string {
        if (is_signed) {
          if (const auto v = parse_integer<int64_t>(text)) return text = std::to_string(*v), std::string();
          return integer_range_rule<int64_t>() + ", got " + text;
        }
        if (const auto v = parse_integer<uint64_t>(text)) return text = std::to_string(*v), std::string();
        return integer_range_rule<uint64_t>() + ", got " + text;
      },
      "");
}

// Gives every integer option of `app` and of its subcommands, at any depth,
// exact_integer(): called once, after every command has added its options.
inline void make_integer_options_exact(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type.rfind("INT", 0) == 0) option->check(exact_integer(true));
    if (type.rfind("UINT", 0) == 0) option->check(exact_integer(false));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) make_integer_options_exact(*sub);
}
}  // namespace packtrain::cli
