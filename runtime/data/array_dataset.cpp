#include "packtrain/runtime/data/array_dataset.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/npy_file.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <numeric>
#include <system_error>

namespace packtrain::runtime {

namespace fs = std::filesystem;

namespace {

bool has_file(const fs::path& dir, const char* name) {
  std::error_code ec;
  return fs::exists(dir / name, ec);
}

std::vector<int64_t> indices(int64_t from, int64_t to) {
  std::vector<int64_t> out(static_cast<size_t>(to - from));
  std::iota(out.begin(), out.end(), from);
  return out;
}

}  // namespace

bool is_array_directory(const fs::path& dir) {
  return has_file(dir, "features.npy") || has_file(dir, "train_features.npy");
}

Dataset load_array_directory(const fs::path& dir) {
  Dataset data;
  data.name = dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
  data.source = dir;
  data.target_name = "label";
  if (has_file(dir, "features.npy")) {
    if (has_file(dir, "train_features.npy")) {
      throw DataError(dir.string() + ": both features.npy and train_features.npy; an array directory holds one "
                      "layout (features.npy + labels.npy, or train_ and test_ files)");
    }
    NpyFeaturesAndLabels all = read_npy_features_and_labels(dir / "features.npy", dir / "labels.npy");
    data.features = std::move(all.features);
    data.targets = all.labels.to(at::kDouble).reshape({-1, 1});
    data.sample_shape = std::move(all.sample_shape);
  } else {
    NpyFeaturesAndLabels train = read_npy_features_and_labels(dir / "train_features.npy", dir / "train_labels.npy");
    NpyFeaturesAndLabels test = read_npy_features_and_labels(dir / "test_features.npy", dir / "test_labels.npy");
    if (train.sample_shape != test.sample_shape) {
      throw DataError(fmt::format("{}: test samples of shape ({}), training samples of shape ({})",
                                  (dir / "test_features.npy").string(), fmt::join(test.sample_shape, ", "),
                                  fmt::join(train.sample_shape, ", ")));
    }
    const int64_t train_rows = train.features.size(0), rows = train_rows + test.features.size(0);
    data.features = at::cat({train.features, test.features});
    data.targets = at::cat({train.labels, test.labels}).to(at::kDouble).reshape({-1, 1});
    data.sample_shape = std::move(train.sample_shape);
    data.own_split = DataSplit{indices(0, train_rows), {}, indices(train_rows, rows)};
  }
  for (int64_t i = 0; i < data.features.size(1); ++i) data.feature_names.push_back(std::to_string(i));
  return data;
}

}  // namespace packtrain::runtime
