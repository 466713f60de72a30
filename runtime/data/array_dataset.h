// Array directories and .npz archives: a data set stored as NumPy arrays (images, sequences),
// read by runtime/data/npy_file.h, flattened to a table's (N, I) with the sample
// shape kept, e.g. the bundled optdigits (1, 8, 8) and mnist1d (1, 40).
#pragma once

#include "packtrain/runtime/data/dataset.h"

#include <filesystem>

namespace packtrain::runtime {

// Whether `dir` holds features.npy, or train_features.npy (the two layouts below).
bool is_array_directory(const std::filesystem::path& dir);

// A directory with
//   features.npy (N, ...) and labels.npy (N): split later like a table file, or
//   train_features.npy, train_labels.npy, test_features.npy, test_labels.npy: its
//   own split, the training rows first (Dataset::own_split).
// Features in any accepted dtype (npy_file.h), flattened in C order to (N, I) float64
// with Dataset::sample_shape the rest of their shape; labels, whole numbers >= 0, as
// the (N, 1) float64 targets of a classification set. DataError naming the file for
// any problem, both layouts at once, or train and test samples of different shapes.
Dataset load_array_directory(const std::filesystem::path& dir);

// An .npz archive (np.savez or np.savez_compressed) with the same arrays as members:
// features and labels, or train_features, train_labels, test_features, test_labels.
// DataError naming the archive (and the member) as for a directory, and for a
// missing array, listing the ones it holds.
Dataset load_npz_file(const std::filesystem::path& file);

}  // namespace packtrain::runtime
