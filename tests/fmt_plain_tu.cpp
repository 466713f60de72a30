#include "tests/fmt_plain_tu.h"

#include <fmt/format.h>

namespace packtrain::testing {
std::string format_in_plain_tu(double x, int n, const std::string& s) {
  return fmt::format("{:.3f}|{:>4}|{}", x, n, s);
}
int plain_tu_fmt_version() { return FMT_VERSION; }
}  // namespace packtrain::testing
