// The CSV / TSV / whitespace table reader: delimiter and header detection,
// quoting, line endings, column selection, and every error it reports.
#include "packtrain/runtime/data/table_reader.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/dataset.h"
#include "packtrain/runtime/data/uci_dataset.h"
#include "tests/runtime/data/data_error_message.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Formats with one field set (designated initializers that leave a field out
// trip -Wmissing-field-initializers).
TableFormat delimited_by(char delimiter) {
  TableFormat format;
  format.delimiter = delimiter;
  return format;
}
TableFormat with_header(HeaderMode header) {
  TableFormat format;
  format.header = header;
  return format;
}

// Files in a fresh directory per test. Cleaned up file by file: libtorch.so
// exports a broken std::filesystem::remove_all that interposes on libstdc++'s.
class TableFile : public ::testing::Test {
 protected:
  fs::path write(const std::string& name, const std::string& text) {
    const fs::path file = dir_ / name;
    std::ofstream(file, std::ios::binary) << text;
    return file;
  }
  Table read(const std::string& text, const TableFormat& format = {}) {
    return read_table(write("t.csv", text), format);
  }
  std::string read_error(const std::string& text, const TableFormat& format = {}) {
    const fs::path file = write("t.csv", text);
    return error_of([&] { read_table(file, format); });
  }
  packtrain::testing::ScopedTempDir temp_{"packtrain_table"};
  const fs::path dir_ = temp_.path();
};

TEST_F(TableFile, DetectsComma) {
  const Table t = read("a,b,c\n1,2,3\n4,5,6\n");
  EXPECT_EQ(t.delimiter, ',');
  EXPECT_TRUE(t.has_header);
  EXPECT_THAT(t.columns, ElementsAre("a", "b", "c"));
  EXPECT_EQ(t.rows(), 2);
  EXPECT_EQ(t.cols(), 3);
  EXPECT_THAT(t.line_numbers, ElementsAre(2, 3));
}

TEST_F(TableFile, DetectsTab) {
  // Commas inside the text column vary per line, so they lose to the tab.
  const Table t = read("name, full\tx\ny, z\t1\nw\t2\nu, v, s\t3\n");
  EXPECT_EQ(t.delimiter, '\t');
  EXPECT_THAT(t.columns, ElementsAre("name, full", "x"));
  EXPECT_EQ(t.cells[0][0], "y, z");
}

TEST_F(TableFile, DetectsSemicolon) {
  const Table t = read("a;b\n1.5;2\n3;4\n");
  EXPECT_EQ(t.delimiter, ';');
  EXPECT_TRUE(t.has_header);
  EXPECT_TRUE(
      packtrain::testing::all_equal(t.numeric({0, 1}), at::tensor({1.5, 2.0, 3.0, 4.0}, at::kDouble).view({2, 2})));
}

TEST_F(TableFile, DetectsPipe) {
  const Table t = read("1|2\n3|4\n");
  EXPECT_EQ(t.delimiter, '|');
  EXPECT_EQ(t.cols(), 2);
}

TEST_F(TableFile, DetectsWhitespaceRuns) {
  const Table t = read("  1   2\t 3\n4 5  6  \n");
  EXPECT_EQ(t.delimiter, ' ');
  EXPECT_FALSE(t.has_header);
  EXPECT_EQ(t.cols(), 3);
  EXPECT_EQ(t.cells[1][2], "6");
}

TEST_F(TableFile, ForcedDelimiterOverridesDetection) {
  // Detection would take the comma; forced ';' keeps "1,5" as one (non-numeric) cell.
  const Table t = read("1,5;2,5\n3,5;4,5\n", delimited_by(';'));
  EXPECT_EQ(t.cols(), 2);
  EXPECT_EQ(t.cells[0][0], "1,5");
}

TEST_F(TableFile, NoHeaderWhenTheFirstRowIsNumeric) {
  const Table t = read("1,2,3\n4,5,6\n");
  EXPECT_FALSE(t.has_header);
  EXPECT_THAT(t.columns, ElementsAre("0", "1", "2"));
  EXPECT_EQ(t.rows(), 2);
  EXPECT_THAT(t.line_numbers, ElementsAre(1, 2));
}

TEST_F(TableFile, HeaderDetectedByOneNamedColumn) {
  // Only column 'b' has a name over numbers; the first row is still a header.
  const Table t = read("1,b\n2,3\n");
  EXPECT_TRUE(t.has_header);
  EXPECT_THAT(t.columns, ElementsAre("1", "b"));
}

TEST_F(TableFile, TextColumnIsNotMistakenForAHeader) {
  // Column 0 is text in both rows, column 1 numbers in both: no header.
  const Table t = read("red,1\nblue,2\n");
  EXPECT_FALSE(t.has_header);
  EXPECT_EQ(t.rows(), 2);
}

TEST_F(TableFile, HeaderForcedOnAndOff) {
  const Table forced_on = read("1,2\n3,4\n", with_header(HeaderMode::kYes));
  EXPECT_TRUE(forced_on.has_header);
  EXPECT_THAT(forced_on.columns, ElementsAre("1", "2"));
  EXPECT_EQ(forced_on.rows(), 1);

  const Table forced_off = read("a,b\n3,4\n", with_header(HeaderMode::kNo));
  EXPECT_FALSE(forced_off.has_header);
  EXPECT_EQ(forced_off.rows(), 2);
  EXPECT_THAT(error_of([&] { forced_off.numeric({0}); }), HasSubstr("t.csv:1:1: non-numeric cell 'a' in column '0'"));
}

TEST_F(TableFile, QuotedFieldsKeepDelimitersQuotesAndLineBreaks) {
  const Table t = read("name,\"x,y\",z\n\"a \"\"quoted\"\" word\", \"1,5\" ,3\n\"two\nlines\",7,8\n9,10,11\n");
  EXPECT_THAT(t.columns, ElementsAre("name", "x,y", "z"));
  EXPECT_EQ(t.cells[0][0], "a \"quoted\" word");
  EXPECT_EQ(t.cells[0][1], "1,5");
  EXPECT_EQ(t.cells[1][0], "two\nlines");
  // The quoted line break counts: the row after it starts on line 5.
  EXPECT_THAT(t.line_numbers, ElementsAre(2, 3, 5));
}

TEST_F(TableFile, CrlfAndUtf8Bom) {
  const Table t = read("\xEF\xBB\xBFid,value\r\n1,2.5\r\n2,-3e1\r\n");
  EXPECT_EQ(t.columns[0], "id");
  EXPECT_EQ(t.cells[1][1], "-3e1");
  EXPECT_TRUE(packtrain::testing::all_equal(t.numeric({1}), at::tensor({2.5, -30.0}, at::kDouble).view({2, 1})));
}

TEST_F(TableFile, BlankLinesSkippedAndCounted) {
  const Table t = read("\na,b\n\n1,2\n  \n3,4\n\n\n");
  EXPECT_EQ(t.rows(), 2);
  EXPECT_THAT(t.line_numbers, ElementsAre(4, 6));
}

TEST_F(TableFile, HashIsNotAComment) {
  const Table t = read("#id,x\n1,2\n");
  EXPECT_EQ(t.columns[0], "#id");
}

TEST_F(TableFile, NumbersParseLocaleFreeWithSignsAndExponents) {
  const Table t = read("+1.5e2,-0.25,7,1e-400\n");
  const at::Tensor x = t.numeric({0, 1, 2, 3});
  EXPECT_TRUE(packtrain::testing::all_equal(x, at::tensor({150.0, -0.25, 7.0, 0.0}, at::kDouble).view({1, 4})));
}

TEST_F(TableFile, ColumnsByNameIndexAndNegativeIndex) {
  const Table t = read("a,b,c\n1,2,3\n");
  EXPECT_EQ(t.column_index("b"), 1);
  EXPECT_EQ(t.column_index("2"), 2);
  EXPECT_EQ(t.column_index("0"), 0);
  EXPECT_EQ(t.column_index("-1"), 2);
  EXPECT_EQ(t.column_index("-3"), 0);
  EXPECT_TRUE(packtrain::testing::all_equal(t.numeric({t.column_index("-1"), t.column_index("a")}),
                                            at::tensor({3.0, 1.0}, at::kDouble).view({1, 2})));
}

TEST_F(TableFile, UnknownColumnListsTheColumns) {
  const Table t = read("a,b,c\n1,2,3\n");
  EXPECT_THAT(error_of([&] { t.column_index("d"); }), HasSubstr("t.csv: unknown column 'd' (columns: a, b, c)"));
  EXPECT_THAT(error_of([&] { t.column_index("3"); }), HasSubstr("t.csv: column index 3 out of range"));
  EXPECT_THAT(error_of([&] { t.column_index("-4"); }), HasSubstr("t.csv: column index -4 out of range"));
}

TEST_F(TableFile, MissingFile) {
  EXPECT_THAT(error_of([&] { read_table(dir_ / "absent.csv"); }), HasSubstr("absent.csv: cannot open file"));
  EXPECT_THAT(error_of([&] { read_table(dir_); }), HasSubstr("is a directory, not a table file"));
}

TEST_F(TableFile, EmptyFile) {
  EXPECT_THAT(read_error(""), HasSubstr("t.csv: empty file (no rows)"));
  EXPECT_THAT(read_error("\n \r\n\n"), HasSubstr("t.csv: empty file (no rows)"));
}

TEST_F(TableFile, HeaderOnlyFile) {
  EXPECT_THAT(read_error("a,b,c\n"), HasSubstr("t.csv: no data rows (only a header line)"));
}

TEST_F(TableFile, RaggedRowNamesItsLine) {
  EXPECT_THAT(read_error("a,b,c\n1,2,3\n\n4,5\n6,7,8\n"),
              HasSubstr("t.csv:4: ragged row: 2 fields, expected 3 (the first row has 3)"));
  EXPECT_THAT(read_error("1 2 3\n4 5 6 7\n"), HasSubstr("t.csv:2: ragged row: 4 fields, expected 3"));
}

TEST_F(TableFile, NonNumericCellNamesLineColumnAndName) {
  const Table t = read("a,b,c\n1,2,3\n4,abc,6\n");
  EXPECT_THAT(error_of([&] { t.numeric({0, 1, 2}); }), HasSubstr("t.csv:3:2: non-numeric cell 'abc' in column 'b'"));
  // Columns that are not chosen are not parsed.
  EXPECT_NO_THROW(t.numeric({0, 2}));
  // A decimal comma is not a number.
  EXPECT_THAT(error_of([&] { read("x;y\n1,5;2\n").numeric({0}); }), HasSubstr("t.csv:2:1: non-numeric cell '1,5'"));
}

TEST_F(TableFile, NonFiniteCellsAreErrors) {
  for (const std::string bad : {"nan", "NaN", "inf", "Inf", "-inf", "+INF", "infinity", "1e999"}) {
    const Table t = read("a,b\n1,2\n3," + bad + "\n");
    EXPECT_THAT(error_of([&] { t.numeric({1}); }),
                HasSubstr("t.csv:3:2: non-finite value '" + bad + "' in column 'b'"));
  }
}

TEST_F(TableFile, EmptyCellIsAnError) {
  const Table t = read("a,b,c\n1,,3\n");
  EXPECT_THAT(error_of([&] { t.numeric({0, 1, 2}); }), HasSubstr("t.csv:2:2: empty cell in column 'b'"));
}

TEST_F(TableFile, UnterminatedQuoteNamesWhereItOpened) {
  EXPECT_THAT(read_error("a,b\n1,2\n3,\"4\n5,6\n"), HasSubstr("t.csv:3: unterminated quote"));
}

TEST_F(TableFile, TextAfterClosingQuote) {
  EXPECT_THAT(read_error("a,b\n\"1\"x,2\n"), HasSubstr("t.csv:2: text after a closing quote"));
}

TEST_F(TableFile, ForbiddenDelimiter) {
  EXPECT_THAT(read_error("1,2\n", delimited_by('"')), HasSubstr("t.csv: unsupported delimiter"));
}

// The bundled UCI data.txt files read as tables give exactly load_uci's values
// (concrete's are tab-separated, wine's space-separated).
TEST(TableReader, BundledUciDataMatchesLoadUci) {
  for (const std::string name : {"concrete", "wine-quality-red"}) {
    const fs::path dir = bundled_data_dir() / name;
    const Table t = read_table(dir / "data.txt");
    EXPECT_FALSE(t.has_header) << name;
    const RegressionData uci = load_uci(dir);
    EXPECT_TRUE(packtrain::testing::all_equal(t.numeric(uci.feature_columns), uci.features)) << name;
    EXPECT_TRUE(packtrain::testing::all_equal(t.numeric({uci.target_column}), uci.targets)) << name;
  }
  EXPECT_EQ(read_table(bundled_data_dir() / "concrete" / "data.txt").delimiter, '\t');
  EXPECT_EQ(read_table(bundled_data_dir() / "wine-quality-red" / "data.txt").delimiter, ' ');
}

}  // namespace
}  // namespace packtrain::runtime
