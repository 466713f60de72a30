// fmt: a translation unit that includes Torch sees Torch's bundled fmt, one that
// does not sees Debian's; both header-only, so each formats with exactly the fmt
// it compiled against (cmake/PacktrainDependencies.cmake explains why).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "tests/fmt_plain_tu.h"

namespace {

std::string format_here(double x, int n, const std::string& s) { return fmt::format("{:.3f}|{:>4}|{}", x, n, s); }

TEST(FmtConsistency, TorchAndPlainTranslationUnitsFormatAlike) {
  EXPECT_EQ(format_here(3.14159, 42, "packtrain"), "3.142|  42|packtrain");
  EXPECT_EQ(packtrain::testing::format_in_plain_tu(3.14159, 42, "packtrain"), format_here(3.14159, 42, "packtrain"));
}

TEST(FmtConsistency, EachTranslationUnitUsesTheFmtItIncluded) {
  // Torch's include directory comes first here, so this TU compiled against Torch's fmt...
  EXPECT_EQ(FMT_VERSION, PACKTRAIN_TORCH_FMT_VERSION);
  // ...and the TU without Torch against Debian's libfmt-dev headers.
  EXPECT_EQ(packtrain::testing::plain_tu_fmt_version(), PACKTRAIN_DEBIAN_FMT_VERSION);
#ifndef FMT_HEADER_ONLY
  FAIL() << "fmt must be used header-only: no compiled fmt library of another version may be linked";
#endif
}

TEST(FmtConsistency, FormatsATensorShapeThroughFmt) {
  const at::Tensor t = at::zeros({3, 4});
  EXPECT_EQ(fmt::format("[{}]", fmt::join(t.sizes(), ", ")), "[3, 4]");
}

}  // namespace
