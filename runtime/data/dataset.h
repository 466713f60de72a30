// The one entry point from a user's data argument to tensors: a bundled data
// set's name, a UCI-format directory, an array directory of .npy files
// (array_dataset.h), or a CSV / TSV / whitespace table file.
#pragma once

#include "packtrain/runtime/data/data_split.h"
#include "packtrain/runtime/data/table_reader.h"

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace packtrain::runtime {

struct Dataset {
  std::string name;                        // the directory name ("concrete") or the file stem
  std::filesystem::path source;            // the directory or file it was read from
  std::vector<std::string> feature_names;  // (I) header names, else the file's 0-based column numbers
  std::string target_name;
  at::Tensor features;            // (N, I) float64, CPU
  at::Tensor targets;             // (N, 1) float64, CPU
  std::optional<int> uci_splits;  // standard splits of a UCI directory (n_splits.txt)
  // One sample's shape before flattening to the I features: (C, H, W) for images,
  // (C, L) for sequences, (I) for a table; its product is always I.
  std::vector<int64_t> sample_shape;
  std::optional<DataSplit> own_split;  // an array directory's own train / test split
};

// The rows `rows` (0-based) of `data`, in that order, with the same names and source.
Dataset subset(const Dataset& data, const std::vector<int64_t>& rows);

struct DatasetSpec {
  // A bundled data set's name (concrete, energy, yacht, wine-quality-red, bostonHousing, kin8nm,
  // naval-propulsion-plant, power-plant, protein-tertiary-structure; the image sets optdigits and mnist1d), a
  // UCI-format directory, an array directory (features.npy and labels.npy, or train_ and test_ pairs) or an .npz
  // archive of them, or a CSV / TSV / whitespace table file.
  std::string path;
  TableFormat format;                 // table files only
  std::vector<std::string> features;  // table files: names or indices; empty = every column but the target
  std::string target;                 // table files: a name or index; empty = the last column
};

// Where the bundled data sets are: $PACKTRAIN_DATA_DIR if set; else data/ next to
// the running executable (<exe dir>/../../data for a build tree,
// <exe dir>/../share/packtrain/data for an install); else the source tree's data/.
std::filesystem::path bundled_data_dir();

// Resolves spec.path, an existing file or directory first, else a bundled name,
// and loads it. A UCI or array directory takes its columns from its own files, so
// spec.features / target / format must be left empty there; a lone .npy file is
// refused (it belongs in an array directory). DataError for an
// unknown name (listing the bundled sets), a target that is also a feature, a
// repeated feature, or a table with no feature column left.
Dataset load_dataset(const DatasetSpec& spec);

// Every file load_dataset (and uci_split) may read for `path` (a --data argument,
// resolved as load_dataset resolves it): a table or .npz file itself; an array
// directory's .npy arrays; a UCI-format directory's data.txt, n_splits.txt and index
// files. Only those that exist; none when `path` does not resolve (the load says
// why). The inputs an output must not overwrite (runtime/cli/output_paths.h).
std::vector<std::filesystem::path> dataset_files(const std::string& path);

// Standard split k of a data set loaded from a UCI directory (train and test; an
// empty validation set). DataError if it has no standard splits or k is out of range.
DataSplit uci_split(const Dataset& data, int k);

}  // namespace packtrain::runtime
