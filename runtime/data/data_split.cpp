#include "packtrain/runtime/data/data_split.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/input_file.h"
#include "packtrain/runtime/data/table_reader.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

namespace packtrain::runtime {

namespace fs = std::filesystem;

namespace {

std::string str(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// Uniform in [0, n) from raw engine output, rejecting the biased top values.
// std::uniform_int_distribution and std::shuffle are implementation-defined, and
// a seeded split must be the same with every standard library.
uint64_t below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t biased = (std::numeric_limits<uint64_t>::max() % n + 1) % n;  // 2^64 mod n
  uint64_t x = rng();
  while (x > std::numeric_limits<uint64_t>::max() - biased) x = rng();
  return x % n;
}

// Fisher-Yates with `below`.
void shuffle(std::vector<int64_t>& values, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[below(rng, i)]);
}

void check_fraction(const char* name, double fraction) {
  if (!(fraction >= 0 && fraction < 1)) {  // also catches NaN
    throw DataError(std::string("split: ") + name + " fraction " + str(fraction) + " is outside [0, 1)");
  }
}

// round(fraction * rows), but at least one row for a positive fraction, so a
// small data set still gets a non-empty validation or test set.
int64_t rows_for(double fraction, int64_t rows) {
  if (fraction <= 0) return 0;
  return std::max<int64_t>(1, std::llround(fraction * static_cast<double>(rows)));
}

std::vector<int64_t> sorted(std::vector<int64_t>::const_iterator begin, std::vector<int64_t>::const_iterator end) {
  std::vector<int64_t> out(begin, end);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<int64_t> read_index_file(const fs::path& file, int64_t rows) {
  check_input_file(file, "split index file");
  std::ifstream in(file);
  if (!in) throw DataError(file.string() + ": cannot open file (missing or unreadable)");
  std::vector<int64_t> indices;
  for (std::string token; in >> token;) {
    const ParsedCell cell = parse_cell(token);
    const bool valid = cell.kind == CellKind::kNumber && cell.value == std::floor(cell.value) && cell.value >= 0 &&
                       cell.value < static_cast<double>(rows);
    if (!valid) {
      const std::string value = cell.kind == CellKind::kNumber ? std::to_string(cell.value) : "'" + token + "'";
      throw DataError(file.string() + ": index " + value + " (entry " + std::to_string(indices.size() + 1) +
                      ") is not an integer in [0, " + std::to_string(rows) + ")");
    }
    indices.push_back(static_cast<int64_t>(cell.value));
  }
  if (in.bad()) throw DataError(file.string() + ": read error");
  if (indices.empty()) throw DataError(file.string() + ": empty file (no indices)");
  return indices;
}

DataSplit split_by_fractions(int64_t rows, double validation_fraction, double test_fraction, uint64_t seed) {
  check_fraction("validation", validation_fraction);
  check_fraction("test", test_fraction);
  if (validation_fraction + test_fraction >= 1) {
    throw DataError("split: validation fraction " + str(validation_fraction) + " and test fraction " +
                    str(test_fraction) + " sum to 1 or more, leaving no training rows");
  }
  const int64_t test_rows = rows_for(test_fraction, rows);
  const int64_t validation_rows = rows_for(validation_fraction, rows);
  if (rows - test_rows - validation_rows < 1) {
    throw DataError("split: " + std::to_string(rows) + " rows leave no training rows after " +
                    std::to_string(validation_rows) + " validation and " + std::to_string(test_rows) +
                    " test rows (use smaller fractions or more data)");
  }
  std::vector<int64_t> order(rows);
  std::iota(order.begin(), order.end(), 0);
  shuffle(order, seed);
  const auto validation_begin = order.cbegin() + test_rows;
  const auto train_begin = validation_begin + validation_rows;
  return {sorted(train_begin, order.cend()), sorted(validation_begin, train_begin),
          sorted(order.cbegin(), validation_begin)};
}

void carve_validation(DataSplit& split, double validation_fraction, uint64_t seed) {
  check_fraction("validation", validation_fraction);
  const int64_t train_rows = static_cast<int64_t>(split.train.size());
  const int64_t moved = rows_for(validation_fraction, train_rows);
  if (moved == 0) return;
  if (moved >= train_rows) {
    throw DataError("split: validation fraction " + str(validation_fraction) + " of " + std::to_string(train_rows) +
                    " training rows leaves none to train on");
  }
  // Sort first, so the result depends on the set of training rows and the seed, not their order.
  std::vector<int64_t> order = sorted(split.train.cbegin(), split.train.cend());
  shuffle(order, seed);
  split.validation.insert(split.validation.end(), order.begin(), order.begin() + moved);
  std::sort(split.validation.begin(), split.validation.end());
  split.train = sorted(order.cbegin() + moved, order.cend());
}

void check_split(const DataSplit& split, int64_t rows, const std::string& context) {
  const std::array<std::pair<const char*, const std::vector<int64_t>*>, 3> sets{
      {{"train", &split.train}, {"validation", &split.validation}, {"test", &split.test}}};
  std::vector<int> owner(std::max<int64_t>(rows, 0), -1);  // which set holds each row
  for (int s = 0; s < 3; ++s) {
    const char* name = sets[s].first;
    for (int64_t row : *sets[s].second) {
      if (row < 0 || row >= rows) {
        throw DataError(context + ": " + name + " row " + std::to_string(row) + " is out of range [0, " +
                        std::to_string(rows) + ")");
      }
      if (owner[row] == s) throw DataError(context + ": row " + std::to_string(row) + " appears twice in " + name);
      if (owner[row] >= 0) {
        throw DataError(context + ": row " + std::to_string(row) + " is in both " + sets[owner[row]].first + " and " +
                        name);
      }
      owner[row] = s;
    }
  }
}

}  // namespace packtrain::runtime
