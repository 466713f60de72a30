// What the data layer can represent: packtrain computes in float32, so a cell
// beyond float32's range (1e300) is refused like NaN, naming file:line:column, and
// the standardizer refuses a value that is beyond it as given or once standardized,
// naming the row and column.
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/standardizer.h"
#include "packtrain/runtime/data/table_reader.h"
#include "tests/runtime/data/data_error_message.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include <filesystem>
#include <fstream>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(RepresentableValues, CellsBeyondFloat32AreOutOfRangeAndTheLargestFloat32IsANumber) {
  EXPECT_EQ(parse_cell("3.4e38").kind, CellKind::kNumber);
  EXPECT_EQ(parse_cell("-3.4028234e38").kind, CellKind::kNumber);
  EXPECT_EQ(parse_cell("1e-300").kind, CellKind::kNumber);  // tiny is fine: it standardizes to a finite value
  for (const char* text : {"1e300", "-1e300", "3.5e38", "1e39", "+1e100"}) {
    const ParsedCell cell = parse_cell(text);
    EXPECT_EQ(cell.kind, CellKind::kOutOfRange) << text;
    EXPECT_THAT(cell_problem(cell, text), HasSubstr("value '" + std::string(text) + "' beyond float32's range"))
        << text;
  }
  EXPECT_EQ(parse_cell("1e400").kind, CellKind::kNonFinite);  // overflows a double: infinite, as before
}

TEST(RepresentableValues, ATableCellBeyondFloat32IsRefusedNamingFileLineAndColumn) {
  packtrain::testing::ScopedTempDir temp("packtrain_representable");
  const fs::path file = temp.path() / "pool.csv";
  std::ofstream(file) << "a,b,c\n1,2,3\n4,-1e300,6\n";
  const Table table = read_table(file);  // a huge cell still marks a data row, not a header
  ASSERT_EQ(table.rows(), 2);
  const std::string message = error_of([&] { table.numeric({0, 1, 2}); });
  EXPECT_THAT(message, HasSubstr(file.string() + ":3:2: value '-1e300' beyond float32's range"));
  EXPECT_THAT(message, HasSubstr("in column 'b'"));
  EXPECT_EQ(error_of([&] { table.numeric({0, 2}); }), "no error");
}

TEST(RepresentableValues, FitRefusesAValueBeyondFloat32NamingRowAndColumn) {
  at::Tensor x = at::ones({4, 3}, at::kDouble);
  x[2][1] = 1e300;  // squared by the standard deviation: infinite, every z NaN
  const std::string message = error_of([&] { Standardizer::fit(x, "training targets"); });
  EXPECT_THAT(message, HasSubstr("training targets row 3, column 2: value 1e+300 beyond float32's range"));
  x[2][1] = 3e38;
  EXPECT_EQ(error_of([&] { Standardizer::fit(x); }), "no error");
}

TEST(RepresentableValues, AValueThatStandardizesBeyondFloat32IsNamedWithItsStandardizedValue) {
  // Column 0 spreads by 0.001: 1e36 is 2e39 standard deviations out, beyond float32.
  const Standardizer s = Standardizer::fit(at::tensor({0.0, 0.002, 0.0, 0.002}, at::kDouble).reshape({2, 2}).t());
  // (2, 2) training rows {0, 0}, {0.002, 0.002}: each column mean 0.001, std 0.001.
  const at::Tensor fine = at::tensor({0.5, 1e30, -1e35, 3.0}, at::kDouble).reshape({2, 2});
  EXPECT_FALSE(s.first_unrepresentable(fine).has_value());
  const at::Tensor far = at::tensor({0.5, 1.0, 2.0, 1e36}, at::kDouble).reshape({2, 2});
  const auto u = s.first_unrepresentable(far);
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->row, 1);
  EXPECT_EQ(u->column, 1);
  EXPECT_EQ(u->value, 1e36);
  EXPECT_NEAR(u->standardized / 1e39, 1.0, 1e-6);
  EXPECT_THAT(u->problem(), HasSubstr("value 1e+36 is 1e+39 training standard deviations from the training mean"));
  EXPECT_THAT(error_of([&] { s.check_representable(far, "prediction input"); }),
              HasSubstr("prediction input row 2, column 2: value 1e+36"));
  // NaN and infinities are never representable.
  const at::Tensor nan = at::tensor({0.5, std::nan("")}, at::kDouble).reshape({1, 2});
  EXPECT_EQ(s.first_unrepresentable(nan)->column, 1);
}

TEST(RepresentableValues, LargeMatricesAreCheckedBlockByBlockToTheLastRow) {
  const Standardizer s = Standardizer::fit(at::tensor({0.0, 1.0}, at::kDouble).reshape({2, 1}));
  at::Tensor x = at::zeros({200000, 1}, at::kDouble);
  x[199999][0] = 1e300;
  const auto u = s.first_unrepresentable(x);
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->row, 199999);
}

}  // namespace
}  // namespace packtrain::runtime
