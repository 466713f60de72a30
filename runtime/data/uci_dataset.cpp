#include "packtrain/runtime/data/uci_dataset.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/data_split.h"
#include "packtrain/runtime/data/input_file.h"
#include "packtrain/runtime/data/table_reader.h"

#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <sstream>

namespace packtrain::runtime {

namespace fs = std::filesystem;

namespace {

// Whitespace-separated numbers per non-blank line. Kept apart from read_table:
// data.txt has no header or quoting, and its messages are pinned by the UCI tests.
struct NumberTable {
  std::vector<std::vector<double>> rows;
};

NumberTable read_numbers(const fs::path& file) {
  check_input_file(file, "data file");
  std::ifstream in(file);
  if (!in) throw DataError(file.string() + ": cannot open file (missing or unreadable)");
  NumberTable table;
  std::string line;
  size_t line_no = 0, width = 0;
  while (std::getline(in, line)) {
    ++line_no;
    check_line_length(file, static_cast<int64_t>(line_no), line.size());
    std::istringstream fields(line);
    std::vector<double> row;
    for (std::string cell; fields >> cell;) {
      const ParsedCell parsed = parse_cell(cell);
      if (parsed.kind != CellKind::kNumber) {
        throw DataError(file.string() + ":" + std::to_string(line_no) + ":" + std::to_string(row.size() + 1) + ": " +
                        cell_problem(parsed, cell));
      }
      row.push_back(parsed.value);
    }
    if (row.empty()) continue;  // blank lines (some files end with one)
    if (width == 0) width = row.size();
    if (row.size() != width) {
      throw DataError(file.string() + ":" + std::to_string(line_no) + ": ragged row: " + std::to_string(row.size()) +
                      " columns, the first row has " + std::to_string(width));
    }
    table.rows.push_back(std::move(row));
  }
  if (table.rows.empty()) throw DataError(file.string() + ": empty file (no data rows)");
  return table;
}

// "data/concrete/" names the set "concrete", as "data/concrete" does.
std::string directory_name(const fs::path& dir) {
  const fs::path normal = dir.lexically_normal();
  return normal.has_filename() ? normal.filename().string() : normal.parent_path().filename().string();
}

}  // namespace

RegressionData load_uci(const fs::path& dir) {
  if (!fs::is_directory(dir)) throw DataError(dir.string() + ": not a data set directory");
  const NumberTable data = read_numbers(dir / "data.txt");
  const int64_t rows = static_cast<int64_t>(data.rows.size());
  const int64_t cols = static_cast<int64_t>(data.rows.front().size());
  std::vector<int64_t> feature_cols = read_index_file(dir / "index_features.txt", cols);
  const std::vector<int64_t> target_cols = read_index_file(dir / "index_target.txt", cols);
  if (target_cols.size() != 1) {
    throw DataError((dir / "index_target.txt").string() + ": expected one target column, got " +
                    std::to_string(target_cols.size()));
  }
  at::Tensor features = at::empty({rows, static_cast<int64_t>(feature_cols.size())}, at::kDouble);
  at::Tensor targets = at::empty({rows, 1}, at::kDouble);
  auto f = features.accessor<double, 2>();
  auto t = targets.accessor<double, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < feature_cols.size(); ++c) f[r][c] = data.rows[r][feature_cols[c]];
    t[r][0] = data.rows[r][target_cols[0]];
  }
  return {directory_name(dir), features, targets, std::move(feature_cols), target_cols[0]};
}

int uci_split_count(const fs::path& dir) {
  const fs::path file = dir / "n_splits.txt";
  const NumberTable table = read_numbers(file);
  const double count = table.rows.front().front();
  if (count < 1 || count > 1e6 || count != std::floor(count)) {
    throw DataError(file.string() + ": expected a positive whole number of splits, got " + std::to_string(count));
  }
  return static_cast<int>(count);
}

SplitIndices load_uci_split(const fs::path& dir, int k, int64_t rows) {
  const int count = uci_split_count(dir);
  if (k < 0 || k >= count) {
    throw DataError(dir.string() + ": split " + std::to_string(k) + " out of range: the data set has splits 0.." +
                    std::to_string(count - 1));
  }
  DataSplit split{read_index_file(dir / ("index_train_" + std::to_string(k) + ".txt"), rows),
                  {},
                  read_index_file(dir / ("index_test_" + std::to_string(k) + ".txt"), rows)};
  check_split(split, rows, dir.string() + " split " + std::to_string(k));
  return {std::move(split.train), std::move(split.test)};
}

}  // namespace packtrain::runtime
