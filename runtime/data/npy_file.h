// Reads NumPy .npy array files (format versions 1.0, 2.0 and 3.0), and .npz archives
// of them, with the same bounds and error policy as tables: a regular file of at most
// kMaxInputBytes, and
// every problem — a malformed header, a dtype or layout it does not read, truncated
// or trailing data, a non-finite feature, a label that is not a class index, row
// counts that disagree — is a DataError naming the file and what is wrong.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace packtrain::runtime {

// The element types read: little-endian (or byte-sized), as NumPy writes them on x86
// and ARM: '<f4', '<f8', '<i8', '<i4', '|u1'.
enum class NpyDtype { kFloat32, kFloat64, kInt64, kInt32, kUInt8 };

struct NpyHeader {
  NpyDtype dtype = NpyDtype::kFloat32;
  std::vector<int64_t> shape;  // () for a scalar
  int64_t data_offset = 0;     // bytes before the first element
};

// The header of the .npy bytes `bytes` read from `file` (named in errors): the magic
// string, the version, the header length and its dictionary {'descr': ...,
// 'fortran_order': False, 'shape': (...)}. DataError for anything else, including
// fortran_order True ("save it with np.ascontiguousarray"), a big-endian or other
// dtype (naming the ones accepted), or a negative or non-integer dimension.
NpyHeader parse_npy_header(std::string_view bytes, const std::filesystem::path& file);

struct NpyArray {
  std::vector<int64_t> shape;
  at::Tensor values;  // the elements in `shape`, converted to float64, CPU
};

// The whole array of a .npy file. DataError unless the data after the header are
// exactly shape's elements (truncated, or bytes left over, each named with the counts).
NpyArray read_npy(const std::filesystem::path& file);

// The arrays of a .npz archive, as np.savez and np.savez_compressed write it (a zip of
// NAME.npy members, stored or deflated): each by NAME. Bounded like a .npy file (the
// archive at most kMaxInputBytes, its members together unpacked too); DataError
// naming the archive (and "archive[member.npy]" for an array's own problems) for a
// file that is not a zip, a member that is not NAME.npy or fails to unpack (its CRC).
std::map<std::string, NpyArray> read_npz(const std::filesystem::path& file);

// An array set's features and labels, read together (features.npy and labels.npy).
struct NpyFeaturesAndLabels {
  at::Tensor features;                // (N, I) float64: each sample flattened in C order
  at::Tensor labels;                  // (N) int64, class indices
  std::vector<int64_t> sample_shape;  // one sample's shape, e.g. (C, H, W) or (C, L); I is its product
};

// The largest class index a label may be: classes are numbered 0..kMaxNpyLabel,
// exactly representable in float32.
inline constexpr int64_t kMaxNpyLabel = int64_t{1} << 24;

// Features of at least one dimension beyond the row (N, ...) with every element
// finite, and labels of shape (N): whole numbers in [0, kMaxNpyLabel] in any of the
// accepted dtypes. DataError naming the file and, where there is one, the row
// (0-based) and element: "labels.npy: row 7: label 2.5 is not a whole number".
NpyFeaturesAndLabels read_npy_features_and_labels(const std::filesystem::path& features_file,
                                                  const std::filesystem::path& labels_file);
// The same checks on arrays already read (an .npz's members); the paths name them in errors.
NpyFeaturesAndLabels features_and_labels(const NpyArray& features, const std::filesystem::path& features_file,
                                         const NpyArray& labels, const std::filesystem::path& labels_file);

}  // namespace packtrain::runtime
