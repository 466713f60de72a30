#include "packtrain/runtime/data/dataset.h"

#include "packtrain/runtime/data/array_dataset.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/input_file.h"
#include "packtrain/runtime/data/uci_dataset.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <system_error>

namespace packtrain::runtime {

namespace fs = std::filesystem;

namespace {

// Subdirectories of `dir` holding a data.txt or .npy arrays, sorted.
std::vector<std::string> bundled_names(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code walk, probe;
  for (fs::directory_iterator it(dir, walk), end; !walk && it != end; it.increment(walk)) {
    if (fs::is_regular_file(it->path() / "data.txt", probe) || is_array_directory(it->path())) {
      names.push_back(it->path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// For messages: where the bundled sets are and their names.
std::string bundled_summary() {
  const fs::path dir = bundled_data_dir();
  if (dir.empty()) return "no bundled data directory found; set PACKTRAIN_DATA_DIR";
  const std::vector<std::string> names = bundled_names(dir);
  std::string list;
  for (const std::string& name : names) list += (list.empty() ? "" : ", ") + name;
  return "bundled in " + dir.string() + ": " + (names.empty() ? "none" : list);
}

// An existing file or directory wins over a bundled set of the same name; a
// bundled name is a bare name, never a path.
fs::path resolve(const std::string& argument) {
  std::error_code ec;
  if (fs::exists(argument, ec)) return argument;
  if (fs::is_symlink(fs::symlink_status(argument, ec))) {
    // A link that does not lead to a file: a loop, or a dangling one; say which.
    check_input_file(argument, "data file");  // names ELOOP and the rest
    throw DataError(argument + ": a symbolic link to nothing (" + fs::read_symlink(argument, ec).string() + ")");
  }
  const fs::path dir = bundled_data_dir();
  const bool bare_name = fs::path(argument) == fs::path(argument).filename();
  if (!dir.empty() && bare_name && fs::is_directory(dir / argument, ec)) return dir / argument;
  throw DataError(argument + ": no such file or directory, nor a bundled data set (" + bundled_summary() + ")");
}

bool has_table_options(const DatasetSpec& spec) {
  return !spec.features.empty() || !spec.target.empty() || spec.format.delimiter != 0 ||
         spec.format.header != HeaderMode::kDetect;
}

Dataset load_uci_directory(const fs::path& dir, const DatasetSpec& spec) {
  if (has_table_options(spec)) {
    throw DataError(dir.string() +
                    ": a UCI-format directory takes its columns from index_features.txt and "
                    "index_target.txt; features, target and table format apply to table files only");
  }
  std::error_code ec;
  if (!fs::exists(dir / "data.txt", ec))
    throw DataError(dir.string() + ": not a UCI-format data set directory (no data.txt)");
  RegressionData uci = load_uci(dir);
  Dataset data{uci.name, dir, {}, std::to_string(uci.target_column), uci.features, uci.targets, std::nullopt, {}, {}};
  for (int64_t column : uci.feature_columns) data.feature_names.push_back(std::to_string(column));
  // A UCI-format directory of one's own may come without standard splits.
  if (fs::exists(dir / "n_splits.txt", ec)) data.uci_splits = uci_split_count(dir);
  return data;
}

// The feature columns: the chosen ones, or every column but the target.
std::vector<int64_t> feature_columns(const Table& table, const std::vector<std::string>& chosen, int64_t target) {
  std::vector<int64_t> columns;
  if (chosen.empty()) {
    for (int64_t c = 0; c < table.cols(); ++c) {
      if (c != target) columns.push_back(c);
    }
    if (columns.empty()) {
      throw DataError(table.file.string() + ": the only column, '" + table.columns[target] +
                      "', is the target; a model needs at least one feature column");
    }
    return columns;
  }
  for (const std::string& name : chosen) {
    const int64_t c = table.column_index(name);
    if (c == target)
      throw DataError(table.file.string() + ": column '" + table.columns[c] + "' is both the target and a feature");
    if (std::find(columns.begin(), columns.end(), c) != columns.end()) {
      throw DataError(table.file.string() + ": column '" + table.columns[c] + "' is chosen twice as a feature");
    }
    columns.push_back(c);
  }
  return columns;
}

Dataset load_table_file(const fs::path& file, const DatasetSpec& spec) {
  const Table table = read_table(file, spec.format);
  const int64_t target = spec.target.empty() ? table.cols() - 1 : table.column_index(spec.target);
  const std::vector<int64_t> features = feature_columns(table, spec.features, target);
  Dataset data{file.stem().string(), file, {}, table.columns[target], table.numeric(features), table.numeric({target}),
               std::nullopt,         {},   {}};
  for (int64_t c : features) data.feature_names.push_back(table.columns[c]);
  return data;
}

}  // namespace

Dataset subset(const Dataset& data, const std::vector<int64_t>& rows) {
  Dataset out = data;
  const at::Tensor index = at::tensor(rows, at::kLong);
  out.features = data.features.index_select(0, index);
  out.targets = data.targets.index_select(0, index);
  // The standard split files and an array directory's split index the full data set, not this subset.
  out.uci_splits.reset();
  out.own_split.reset();
  return out;
}

fs::path bundled_data_dir() {
  if (const char* env = std::getenv("PACKTRAIN_DATA_DIR"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& candidate :
         {exe.parent_path() / "../../data", exe.parent_path() / "../share/packtrain/data"}) {
      if (!fs::is_directory(candidate, ec)) continue;
      const fs::path canonical = fs::weakly_canonical(candidate, ec);
      return ec ? candidate.lexically_normal() : canonical;
    }
  }
#ifdef PACKTRAIN_SOURCE_DATA_DIR
  return PACKTRAIN_SOURCE_DATA_DIR;
#else
  return {};
#endif
}

Dataset load_dataset(const DatasetSpec& spec) {
  if (spec.path.empty()) {
    throw DataError("no data set given: name a bundled set (" + bundled_summary() +
                    "), a UCI-format directory, an array directory or a table file");
  }
  const fs::path path = resolve(spec.path);
  std::error_code ec;
  Dataset data;
  if (fs::is_directory(path, ec) && is_array_directory(path)) {
    if (has_table_options(spec)) {
      throw DataError(path.string() +
                      ": an array directory's features and labels are its .npy files; features, "
                      "target and table format apply to table files only");
    }
    data = load_array_directory(path);
  } else if (fs::is_directory(path, ec)) {
    data = load_uci_directory(path, spec);
  } else if (path.extension() == ".npy") {
    throw DataError(path.string() +
                    ": a .npy file is read as part of an array directory: put the features in "
                    "features.npy and the labels in labels.npy (or train_ and test_ pairs) in one directory, and "
                    "give the directory (or np.savez them into one .npz file)");
  } else if (path.extension() == ".npz") {
    if (has_table_options(spec)) {
      throw DataError(path.string() +
                      ": an .npz archive's features and labels are its arrays; features, target and "
                      "table format apply to table files only");
    }
    data = load_npz_file(path);
  } else {
    data = load_table_file(path, spec);
  }
  if (data.sample_shape.empty()) data.sample_shape = {data.features.size(1)};
  return data;
}

std::vector<fs::path> dataset_files(const std::string& argument) {
  fs::path path;
  try {
    path = resolve(argument);
  } catch (const DataError&) {
    return {};
  }
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return {path};
  std::vector<fs::path> files;
  for (const char* name : {"features.npy", "labels.npy", "train_features.npy", "train_labels.npy", "test_features.npy",
                           "test_labels.npy", "data.txt", "index_features.txt", "index_target.txt", "n_splits.txt"}) {
    if (fs::exists(path / name, ec)) files.push_back(path / name);
  }
  // The standard splits' index files: index_train_<k>.txt and index_test_<k>.txt.
  for (auto it = fs::directory_iterator(path, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if ((name.starts_with("index_train_") || name.starts_with("index_test_")) && name.ends_with(".txt")) {
      files.push_back(it->path());
    }
  }
  return files;
}

DataSplit uci_split(const Dataset& data, int k) {
  if (!data.uci_splits) {
    throw DataError(data.source.string() +
                    ": no standard splits (those come with a UCI-format directory's "
                    "n_splits.txt and index files); split by fractions instead");
  }
  SplitIndices split = load_uci_split(data.source, k, data.features.size(0));
  return {std::move(split.train), {}, std::move(split.test)};
}

}  // namespace packtrain::runtime
