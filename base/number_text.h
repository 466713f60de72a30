// Numbers read from text exactly, one way for command-line flags, config files and
// the Python package: an integer out of its type's range is an error stating the
// range (never saturated or wrapped), and a comma list of numbers is strict (an
// empty element, nan or inf is an error naming its position).
//
//   parse_integer<int64_t>("9223372036854775808")  // error: "must be an integer between ... and ..."
//   parse_number_list("1e-3,,2", "--lr")           // UserError: "--lr: element 2 of '1e-3,,2' is empty"
//   check_distinct({1e-3, 1e-3}, "--lr")           // UserError: "--lr: 0.001 is given twice (elements 1 and 2)"
#pragma once

#include "packtrain/base/user_error.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace packtrain {

// "must be an integer between LO and HI" for T (int64_t, uint64_t, int, ...).
template <typename T>
std::string integer_range_rule() {
  return "must be an integer between " + std::to_string(std::numeric_limits<T>::min()) + " and " +
         std::to_string(std::numeric_limits<T>::max());
}

// `text` as a T when it is a whole decimal (an optional sign, digits) or hexadecimal
// (0x...) number inside T's range; nullopt otherwise (out of range, a fraction,
// trailing characters, empty). Leading zeros are decimal: "010" is 10.
template <typename T>
std::optional<T> parse_integer(std::string_view text) {
  bool negative = false;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    base = 16;
    text.remove_prefix(2);
  }
  if (text.empty() || text.front() == '+' || text.front() == '-') return std::nullopt;
  uint64_t magnitude = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), magnitude, base);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if (negative) {
    if (magnitude == 0) return T{0};
    if constexpr (std::is_unsigned_v<T>) {
      return std::nullopt;
    } else {
      // |min| = max + 1
      if (magnitude - 1 > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
      return static_cast<T>(-static_cast<T>(magnitude - 1) - 1);
    }
  }
  if (magnitude > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
  return static_cast<T>(magnitude);
}

// The number the whole of `text` spells (strtod's syntax), or nullopt; nan, inf and
// what overflows a double (1e400) come back non-finite for the caller to refuse.
inline std::optional<double> parse_double(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return std::nullopt;
  return value;
}

// A comma-separated list of finite numbers ("1e-3,3e-3"; spaces around an element
// are allowed). UserError, prefixed with `what` (the flag or key), for
// an empty list or element, text that is not a number, nan and inf.
inline std::vector<double> parse_number_list(const std::string& text, const std::string& what) {
  const auto fail = [&](const std::string& problem) { return UserError(what + ": " + problem); };
  if (text.find_first_not_of(" \t") == std::string::npos) throw fail("needs at least one number, got ''");
  std::vector<double> out;
  size_t begin = 0;
  for (size_t index = 1;; ++index) {
    const size_t comma = text.find(',', begin);
    const std::string raw = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    const size_t first = raw.find_first_not_of(" \t");
    const std::string element =
        first == std::string::npos ? "" : raw.substr(first, raw.find_last_not_of(" \t") - first + 1);
    const std::string where = "element " + std::to_string(index) + " of '" + text + "'";
    if (element.empty()) throw fail(where + " is empty (remove the extra comma)");
    const std::optional<double> value = parse_double(element);
    if (!value) throw fail(where + ", '" + element + "', is not a number");
    if (!std::isfinite(*value)) throw fail(where + ", '" + element + "', is not a finite number");
    out.push_back(*value);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return out;
}

// Shortest text that reads back as `value` ("0.001", "1e-05").
inline std::string number_text(double value) {
  for (int digits = 6; digits <= 17; ++digits) {
    std::ostringstream s;
    s.precision(digits);
    s << value;
    if (std::strtod(s.str().c_str(), nullptr) == value) return s.str();
  }
  return std::to_string(value);
}

// UserError, prefixed with `what`, naming a value that is not finite or
// is given twice, with its 1-based positions.
inline void check_distinct(const std::vector<double>& values, const std::string& what) {
  std::map<double, size_t> first_at;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      throw UserError(what + ": element " + std::to_string(i + 1) + " (" + number_text(values[i]) +
                      ") is not a finite number");
    }
    if (const auto [at, added] = first_at.emplace(values[i], i); !added) {
      throw UserError(what + ": " + number_text(values[i]) + " is given twice (elements " +
                      std::to_string(at->second + 1) + " and " + std::to_string(i + 1) + ")");
    }
  }
}

}  // namespace packtrain
