// Reads a whole CSV, TSV or whitespace-separated text table into raw cells, and
// turns chosen columns into a float64 tensor. Every problem is a one-line
// DataError naming the file (and line:column where there is one).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace packtrain::runtime {

enum class HeaderMode { kDetect, kYes, kNo };

struct TableFormat {
  // 0: detect from the first lines among ',', '\t', ';', '|' (the one that splits
  // every sampled line into the same number of fields), else runs of whitespace.
  // ' ' means runs of spaces and tabs.
  char delimiter = 0;
  // kDetect: the first row is a header if any of its cells is non-numeric while the
  // second row's cell in the same column is numeric (a lone row: if any cell is non-numeric).
  HeaderMode header = HeaderMode::kDetect;
};

struct Table {
  std::filesystem::path file;
  char delimiter = ',';  // as used (' ' = whitespace)
  bool has_header = false;
  std::vector<std::string> columns;             // header names, or "0", "1", ... without one
  std::vector<std::vector<std::string>> cells;  // data rows of trimmed cell text, (rows, cols)
  std::vector<int64_t> line_numbers;            // 1-based file line where each data row starts

  int64_t rows() const { return static_cast<int64_t>(cells.size()); }
  int64_t cols() const { return static_cast<int64_t>(columns.size()); }

  // A column by header name (first match), else by 0-based index written as a
  // number ("3"); a negative index counts from the end ("-1" = last). DataError
  // "<file>: unknown column 'x' (columns: a, b, c)" or an out-of-range index.
  int64_t column_index(const std::string& name_or_index) const;

  // (rows, columns.size()) float64 CPU tensor of the chosen columns, in that order.
  // DataError "<file>:<line>:<col>: non-numeric cell 'abc' in column 'name'" (also
  // "non-finite value 'nan'", "empty cell"); <col> is the 1-based column in the file.
  at::Tensor numeric(const std::vector<int64_t>& columns) const;
};

// Reads a whole table file. Delimited files follow RFC 4180 quoting ("a,b", ""
// for a quote, quoted line breaks; whitespace-separated files have no quoting);
// cells are trimmed of spaces and tabs; CRLF line endings and a UTF-8 BOM are
// accepted; blank lines are skipped; '#' is not special. DataError for a missing
// or unreadable file, no rows ("empty file"), a header and no data ("no data
// rows"), a ragged row, an unterminated quote or text after a closing quote.
Table read_table(const std::filesystem::path& file, const TableFormat& format = {});

// How a cell's text reads as a number: locale-independent, an optional leading
// '+', decimal or exponent notation. Shared with the UCI reader. A number is
// usable when it is finite in float32, the precision packtrain computes in:
// |value| <= kMaxCellMagnitude (3.4e38); beyond that (1e300) it is kOutOfRange,
// refused like NaN, so no square or sum of the standardization overflows.
enum class CellKind { kNumber, kNonFinite, kOutOfRange, kNonNumeric, kEmpty };
inline constexpr double kMaxCellMagnitude = 3.4028234663852886e38;  // float32's largest finite value
struct ParsedCell {
  CellKind kind = CellKind::kEmpty;
  double value = 0;  // meaningful for kNumber
};
ParsedCell parse_cell(std::string_view text);
// Why a cell cannot be used: "non-numeric cell 'abc'", "non-finite value 'nan'",
// "value '1e300' beyond float32's range (...)" or "empty cell"; empty for a usable number.
std::string cell_problem(const ParsedCell& cell, std::string_view text);

}  // namespace packtrain::runtime
