// Train / validation / test row splits: read from index files, drawn from a seed,
// or carved out of a given training set; and the check that they are disjoint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace packtrain::runtime {

// 0-based row indices; the three sets are disjoint.
struct DataSplit {
  std::vector<int64_t> train, validation, test;
};

// 0-based indices from a file of integers separated by whitespace or line breaks,
// each checked to be an integer in [0, rows). DataError naming the file and the
// 1-based entry; an empty file is an error too.
std::vector<int64_t> read_index_file(const std::filesystem::path& file, int64_t rows);

// A seeded random split of `rows` rows: round(test_fraction * rows) test rows and
// round(validation_fraction * rows) validation rows (each at least 1 when its
// fraction is > 0), the rest train; each set sorted. The same seed gives the same
// split on every platform (own std::mt19937_64 and shuffle, not torch's generator).
// DataError if a fraction is outside [0, 1), they sum to >= 1, or train is left empty.
DataSplit split_by_fractions(int64_t rows, double validation_fraction, double test_fraction, uint64_t seed);

// Moves a seeded random validation_fraction of split.train (at least 1 row when the
// fraction is > 0) into split.validation, for splits that only have train and test
// (the UCI ones). Both sets come out sorted. DataError if train would be left empty.
void carve_validation(DataSplit& split, double validation_fraction, uint64_t seed);

// DataError unless every index is in [0, rows) and no row appears twice, within a
// set or across sets: "<context>: row 17 is in both train and test". The context
// names where the split came from (a directory and split number, say).
void check_split(const DataSplit& split, int64_t rows, const std::string& context = "split");

}  // namespace packtrain::runtime
