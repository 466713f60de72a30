// Reader for the UCI regression benchmark format (data.txt, index_features.txt,
// index_target.txt, index_train_<k>.txt / index_test_<k>.txt), as in data/.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <string>
#include <vector>

namespace packtrain::runtime {

struct RegressionData {
  std::string name;
  at::Tensor features;                   // (N, I) float64, CPU
  at::Tensor targets;                    // (N, 1) float64, CPU
  std::vector<int64_t> feature_columns;  // (I) data.txt columns of the features
  int64_t target_column = -1;            // data.txt column of the target
};

struct SplitIndices {
  std::vector<int64_t> train;
  std::vector<int64_t> test;
};

// Loads `dir`/data.txt with the columns its index files name. Throws DataError
// naming the file, line and column of a ragged row, a non-numeric or non-finite
// cell, a missing or empty file, or an index out of range.
RegressionData load_uci(const std::filesystem::path& dir);

// Number of standard splits (n_splits.txt).
int uci_split_count(const std::filesystem::path& dir);

// Split k's 0-based row indices, checked to lie in [0, rows) and to be disjoint.
SplitIndices load_uci_split(const std::filesystem::path& dir, int k, int64_t rows);

}  // namespace packtrain::runtime
