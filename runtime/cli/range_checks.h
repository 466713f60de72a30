// Range checks for numeric flags whose messages state the bound plainly
// ("--members: must be >= 1, got 0"), where CLI11's own print a 309-digit range.
#pragma once

#include <CLI/CLI.hpp>

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
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          return {};
        }
        if (used != text.size()) return {};
        return ok(v) ? std::string() : "must be " + rule + ", got " + text;
      },
      name);
}
}  // namespace detail

// > 0 (counts, sizes, rates).
inline CLI::Validator positive() { return detail::bound("POSITIVE", "> 0", [](double v) { return v > 0; }); }
// >= 0 (seeds, epochs that may be 0, seconds).
inline CLI::Validator non_negative() { return detail::bound("NONNEGATIVE", ">= 0", [](double v) { return v >= 0; }); }
}  // namespace packtrain::cli
