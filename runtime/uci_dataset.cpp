#include "runtime/uci_dataset.h"

#include "runtime/data_error.h"

#include <ATen/ATen.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace packtrain::runtime {

namespace fs = std::filesystem;

namespace {

std::ifstream open_or_throw(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw DataError(file.string() + ": cannot open file (missing or unreadable)");
  return in;
}

// Whitespace-separated numbers per non-blank line; line numbers are 1-based.
struct NumberTable {
  std::vector<std::vector<double>> rows;
};

NumberTable read_numbers(const fs::path& file) {
  std::ifstream in = open_or_throw(file);
  NumberTable table;
  std::string line;
  size_t line_no = 0, width = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream fields(line);
    std::vector<double> row;
    std::string cell;
    while (fields >> cell) {
      const size_t column = row.size() + 1;
      errno = 0;
      char* end = nullptr;
      const double value = std::strtod(cell.c_str(), &end);
      if (end == cell.c_str() || *end != '\0' || errno == ERANGE) {
        throw DataError(file.string() + ":" + std::to_string(line_no) + ":" + std::to_string(column) +
                        ": non-numeric cell '" + cell + "'");
      }
      if (!std::isfinite(value)) {
        throw DataError(file.string() + ":" + std::to_string(line_no) + ":" + std::to_string(column) +
                        ": non-finite value '" + cell + "'");
      }
      row.push_back(value);
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

std::vector<int64_t> read_indices(const fs::path& file, int64_t limit) {
  const NumberTable table = read_numbers(file);
  std::vector<int64_t> out;
  for (size_t r = 0; r < table.rows.size(); ++r) {
    for (double v : table.rows[r]) {
      if (v != std::floor(v) || v < 0 || v >= static_cast<double>(limit)) {
        throw DataError(file.string() + ": index " + std::to_string(v) + " (entry " + std::to_string(r + 1) +
                        ") is not an integer in [0, " + std::to_string(limit) + ")");
      }
      out.push_back(static_cast<int64_t>(v));
    }
  }
  return out;
}

}  // namespace

RegressionData load_uci(const fs::path& dir) {
  if (!fs::is_directory(dir)) throw DataError(dir.string() + ": not a data set directory");
  const NumberTable data = read_numbers(dir / "data.txt");
  const int64_t rows = static_cast<int64_t>(data.rows.size());
  const int64_t cols = static_cast<int64_t>(data.rows.front().size());
  const std::vector<int64_t> feature_cols = read_indices(dir / "index_features.txt", cols);
  const std::vector<int64_t> target_cols = read_indices(dir / "index_target.txt", cols);
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
  return {dir.filename().string(), features, targets};
}

int uci_split_count(const fs::path& dir) {
  const NumberTable table = read_numbers(dir / "n_splits.txt");
  return static_cast<int>(table.rows.front().front());
}

SplitIndices load_uci_split(const fs::path& dir, int k, int64_t rows) {
  const int count = uci_split_count(dir);
  if (k < 0 || k >= count) {
    throw DataError(dir.string() + ": split " + std::to_string(k) + " out of range: the data set has splits 0.." +
                    std::to_string(count - 1));
  }
  SplitIndices split{read_indices(dir / ("index_train_" + std::to_string(k) + ".txt"), rows),
                     read_indices(dir / ("index_test_" + std::to_string(k) + ".txt"), rows)};
  return split;
}

}  // namespace packtrain::runtime
