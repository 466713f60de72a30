#include "packtrain/runtime/data/array_dataset.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/npy_file.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <numeric>
#include <system_error>

namespace packtrain::runtime {

namespace fs = std::filesystem;

namespace {

bool has_file(const fs::path& dir, const std::string& name) {
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

namespace {

// The two layouts, from a directory's files or an archive's members: `has(name)`,
// `read(features, labels)` the checked pair (names without ".npy").
template <class Has, class Read>
Dataset load_layout(const fs::path& source, const std::string& what, Has has, Read read) {
  Dataset data;
  data.name = source.filename().empty() ? source.parent_path().filename().string() : source.stem().string();
  data.source = source;
  data.target_name = "label";
  if (has("features")) {
    if (has("train_features")) {
      throw DataError(source.string() + ": both features.npy and train_features.npy; an " + what +
                      " holds one layout (features.npy + labels.npy, or train_ and test_ pairs)");
    }
    NpyFeaturesAndLabels all = read("features", "labels");
    data.features = std::move(all.features);
    data.targets = all.labels.to(at::kDouble).reshape({-1, 1});
    data.sample_shape = std::move(all.sample_shape);
  } else {
    NpyFeaturesAndLabels train = read("train_features", "train_labels");
    NpyFeaturesAndLabels test = read("test_features", "test_labels");
    if (train.sample_shape != test.sample_shape) {
      throw DataError(fmt::format("{}: test samples of shape ({}), training samples of shape ({})", source.string(),
                                  fmt::join(test.sample_shape, ", "), fmt::join(train.sample_shape, ", ")));
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

}  // namespace

Dataset load_array_directory(const fs::path& dir) {
  return load_layout(
      dir, "array directory", [&](const std::string& name) { return has_file(dir, name + ".npy"); },
      [&](const std::string& features, const std::string& labels) {
        return read_npy_features_and_labels(dir / (features + ".npy"), dir / (labels + ".npy"));
      });
}

Dataset load_npz_file(const fs::path& file) {
  const std::map<std::string, NpyArray> arrays = read_npz(file);
  const auto member = [&](const std::string& name) -> const NpyArray& {
    const auto it = arrays.find(name);
    if (it == arrays.end()) {
      std::string names;
      for (const auto& [key, array] : arrays) names += (names.empty() ? "" : ", ") + key;
      throw DataError(
          fmt::format("{}: no array '{}' (it holds: {}); an .npz data set holds features and labels, or "
                      "train_features, train_labels, test_features and test_labels",
                      file.string(), name, names.empty() ? "none" : names));
    }
    return it->second;
  };
  return load_layout(
      file, ".npz archive", [&](const std::string& name) { return arrays.count(name) > 0; },
      [&](const std::string& features, const std::string& labels) {
        return features_and_labels(member(features), file.string() + "[" + features + ".npy]", member(labels),
                                   file.string() + "[" + labels + ".npy]");
      });
}

}  // namespace packtrain::runtime
