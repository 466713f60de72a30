// A translation unit that never includes Torch, so it sees Debian's fmt.
#pragma once

#include <string>

namespace packtrain::testing {
std::string format_in_plain_tu(double x, int n, const std::string& s);
int plain_tu_fmt_version();
}  // namespace packtrain::testing
