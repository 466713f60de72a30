#include "packtrain/runtime/data/npy_file.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/input_file.h"
#include "packtrain/runtime/data/table_reader.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <zip.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

namespace packtrain::runtime {

namespace fs = std::filesystem;

// The element bytes are copied as they are: the host must be little-endian too.
static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian host");

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

struct DtypeName {
  NpyDtype dtype;
  std::string_view descr;  // as NumPy writes it
  at::ScalarType scalar;
  int64_t bytes;
};
// '<u1' is accepted too (a byte has no order; NumPy writes '|u1').
constexpr std::array<DtypeName, 6> kDtypes{{{NpyDtype::kFloat32, "<f4", at::kFloat, 4},
                                            {NpyDtype::kFloat64, "<f8", at::kDouble, 8},
                                            {NpyDtype::kInt64, "<i8", at::kLong, 8},
                                            {NpyDtype::kInt32, "<i4", at::kInt, 4},
                                            {NpyDtype::kUInt8, "|u1", at::kByte, 1},
                                            {NpyDtype::kUInt8, "<u1", at::kByte, 1}}};

const DtypeName& dtype_info(NpyDtype dtype) {
  for (const DtypeName& d : kDtypes) {
    if (d.dtype == dtype) return d;
  }
  throw std::logic_error("npy: unknown dtype");
}

std::string shape_text(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

// The header's dictionary, {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), },
// as NumPy writes it (keys in any order, either quote, a trailing comma).
class HeaderDictionary {
 public:
  HeaderDictionary(std::string_view text, const fs::path& file) : text_(text), file_(file) {}

  NpyHeader parse() {
    NpyHeader header;
    bool has_descr = false, has_order = false, has_shape = false;
    expect('{');
    while (!consume('}')) {
      const std::string key = quoted("a key");
      expect(':');
      if (key == "descr") {
        header.dtype = dtype(quoted_or_structured());
        has_descr = true;
      } else if (key == "fortran_order") {
        if (boolean()) {
          fail_format(
              "the array is in Fortran order (fortran_order: True); only C order is read — save it "
              "with np.save(path, np.ascontiguousarray(a))");
        }
        has_order = true;
      } else if (key == "shape") {
        header.shape = tuple();
        has_shape = true;
      } else {
        fail(fmt::format("unknown key '{}' (a .npy header has descr, fortran_order and shape)", key));
      }
      if (!consume(',')) {
        expect('}');
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) fail("text after the closing '}'");
    if (!has_descr || !has_order || !has_shape) {
      fail(fmt::format("no '{}' key", !has_descr ? "descr" : !has_order ? "fortran_order" : "shape"));
    }
    return header;
  }

 private:
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n')) ++pos_;
  }
  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) fail(fmt::format("expected '{}' at byte {} of the header", c, pos_));
  }
  std::string quoted(const char* what) {
    skip_space();
    const char quote = pos_ < text_.size() ? text_[pos_] : 0;
    if (quote != '\'' && quote != '"') fail(fmt::format("expected {} in quotes at byte {} of the header", what, pos_));
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) fail("an unterminated string");
    std::string s(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return s;
  }
  std::string quoted_or_structured() {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == '[') {
      fail_format(
          "a structured dtype (descr is a list of fields); save plain numeric arrays, features and "
          "labels in files of their own");
    }
    return quoted("the dtype");
  }
  NpyDtype dtype(const std::string& descr) {
    for (const DtypeName& d : kDtypes) {
      if (d.descr == descr) return d.dtype;
    }
    std::string hint;
    if (!descr.empty() && descr[0] == '>')
      hint = "; it is big-endian: save it with a.astype(a.dtype.newbyteorder('<'))";
    fail_format(
        fmt::format("dtype '{}' is not read (float32 '<f4', float64 '<f8', int64 '<i8', int32 '<i4' and "
                    "uint8 '|u1' are){}",
                    descr, hint));
  }
  bool boolean() {
    skip_space();
    for (const auto& [word, value] : {std::pair<std::string_view, bool>{"True", true}, {"False", false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    fail(fmt::format("expected True or False at byte {} of the header", pos_));
  }
  std::vector<int64_t> tuple() {
    expect('(');
    std::vector<int64_t> dims;
    while (!consume(')')) {
      skip_space();
      if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') {
        fail(fmt::format("expected a dimension (a whole number >= 0) at byte {} of the header", pos_));
      }
      int64_t value = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (value > (int64_t{1} << 56)) fail("a dimension too large to be read");
        value = value * 10 + (text_[pos_++] - '0');
      }
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2's long literal
      dims.push_back(value);
      if (!consume(',')) {
        expect(')');
        break;
      }
    }
    return dims;
  }
  [[noreturn]] void fail(std::string_view what) const {
    throw DataError(fmt::format("{}: malformed .npy header: {} (header: {})", file_.string(), what,
                                printable(text_.substr(0, std::min<size_t>(text_.find_last_not_of(" \n") + 1, 200)))));
  }
  // The header's bytes as one line of plain text: a control byte (a newline, a
  // terminal escape) or a non-ASCII one as \xNN, never echoed raw.
  static std::string printable(std::string_view bytes) {
    std::string out;
    for (const char c : bytes) {
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x20 && u < 0x7f) {
        out += c;
      } else {
        out += fmt::format("\\x{:02x}", u);
      }
    }
    return out;
  }
  // Well formed, but not a layout or type the reader takes.
  [[noreturn]] void fail_format(std::string_view what) const {
    throw DataError(fmt::format("{}: {}", file_.string(), what));
  }

  std::string_view text_;
  const fs::path& file_;
  size_t pos_ = 0;
};

uint32_t little_endian(std::string_view bytes) {
  uint32_t value = 0;
  for (size_t i = bytes.size(); i-- > 0;) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  return value;
}

// The flat index of the first element of `values` (float64) that is not finite or
// beyond float32's range, or -1.
int64_t first_unusable(const at::Tensor& values) {
  const at::Tensor bad = values.isfinite().logical_not().logical_or(values.abs() > kMaxCellMagnitude);
  if (!bad.any().item<bool>()) return -1;
  return bad.reshape({-1}).nonzero()[0][0].item<int64_t>();
}

}  // namespace

NpyHeader parse_npy_header(std::string_view bytes, const fs::path& file) {
  if (bytes.size() < 10 || bytes.substr(0, kMagic.size()) != kMagic) {
    throw DataError(fmt::format("{}: not a .npy file (it does not start with \\x93NUMPY)", file.string()));
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  if (major < 1 || major > 3) {
    throw DataError(fmt::format("{}: .npy format version {}.{} is not read (1.0, 2.0 and 3.0 are)", file.string(),
                                major, static_cast<unsigned char>(bytes[7])));
  }
  const size_t length_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + length_bytes) throw DataError(file.string() + ": truncated .npy header");
  const uint64_t header_length = little_endian(bytes.substr(8, length_bytes));
  const uint64_t offset = 8 + length_bytes + header_length;
  if (offset > bytes.size()) {
    throw DataError(fmt::format("{}: truncated .npy header: it says {} bytes, the file has {} after the preamble",
                                file.string(), header_length, bytes.size() - 8 - length_bytes));
  }
  NpyHeader header = HeaderDictionary(bytes.substr(8 + length_bytes, header_length), file).parse();
  header.data_offset = static_cast<int64_t>(offset);
  return header;
}

namespace {

// The array of the .npy bytes `bytes` (of a file, or an .npz member), `file` naming it in errors.
NpyArray npy_from_bytes(std::string_view bytes, const fs::path& file) {
  const NpyHeader header = parse_npy_header(bytes, file);
  const DtypeName& type = dtype_info(header.dtype);
  const uint64_t available = bytes.size() - static_cast<uint64_t>(header.data_offset);
  // The element count, capped above the most elements any input can hold (so neither
  // it nor its byte count overflows, whatever the header says).
  constexpr uint64_t cap = kMaxInputBytes + 1;
  uint64_t count = 1;
  for (int64_t d : header.shape) {
    if (d != 0 && count > cap / static_cast<uint64_t>(d))
      count = cap;
    else
      count *= static_cast<uint64_t>(d);
  }
  if (count >= cap) {
    throw DataError(fmt::format("{}: truncated: shape {} of {} needs more than the {} data bytes the file has",
                                file.string(), shape_text(header.shape), type.descr, available));
  }
  const uint64_t needed = count * static_cast<uint64_t>(type.bytes);
  if (needed != available) {
    throw DataError(fmt::format("{}: {}: shape {} of {} needs {} data bytes, the file has {}", file.string(),
                                needed > available ? "truncated" : "bytes left over after the array",
                                shape_text(header.shape), type.descr, needed, available));
  }
  at::Tensor raw = at::empty({static_cast<int64_t>(count)}, at::TensorOptions().dtype(type.scalar));
  if (count > 0) std::memcpy(raw.data_ptr(), bytes.data() + header.data_offset, static_cast<size_t>(needed));
  return {header.shape, raw.to(at::kDouble).reshape(header.shape)};
}

}  // namespace

NpyArray read_npy(const fs::path& file) { return npy_from_bytes(read_input_bytes(file, ".npy file"), file); }

std::map<std::string, NpyArray> read_npz(const fs::path& file) {
  check_input_file(file, ".npz file");
  int code = 0;
  const std::unique_ptr<zip_t, decltype(&zip_discard)> archive(zip_open(file.c_str(), ZIP_RDONLY, &code), &zip_discard);
  if (!archive) {
    zip_error_t error;
    zip_error_init_with_code(&error, code);
    const std::string why = zip_error_strerror(&error);
    zip_error_fini(&error);
    throw DataError(fmt::format("{}: not a readable .npz (zip) archive: {}", file.string(), why));
  }
  std::map<std::string, NpyArray> arrays;
  uint64_t total = 0;
  const zip_int64_t entries = zip_get_num_entries(archive.get(), 0);
  for (zip_int64_t i = 0; i < entries; ++i) {
    zip_stat_t stat;
    if (zip_stat_index(archive.get(), static_cast<zip_uint64_t>(i), 0, &stat) != 0 ||
        (stat.valid & (ZIP_STAT_NAME | ZIP_STAT_SIZE)) != (ZIP_STAT_NAME | ZIP_STAT_SIZE)) {
      throw DataError(fmt::format("{}: member {} of the archive cannot be read: {}", file.string(), i,
                                  zip_strerror(archive.get())));
    }
    const std::string name = stat.name;
    if (name.size() < 4 || name.substr(name.size() - 4) != ".npy") {
      throw DataError(
          fmt::format("{}: member '{}' is not a .npy array (an .npz holds NAME.npy members, as np.savez "
                      "writes them)",
                      file.string(), name));
    }
    total += stat.size;
    if (total > kMaxInputBytes) {
      throw DataError(fmt::format("{}: its arrays unpack to more than the {} bytes an input may have", file.string(),
                                  kMaxInputBytes));
    }
    const std::unique_ptr<zip_file_t, decltype(&zip_fclose)> member(
        zip_fopen_index(archive.get(), static_cast<zip_uint64_t>(i), 0), &zip_fclose);
    std::string bytes(static_cast<size_t>(stat.size), '\0');
    const zip_int64_t got = member ? zip_fread(member.get(), bytes.data(), bytes.size()) : -1;
    char extra = 0;
    const zip_int64_t more = got == static_cast<zip_int64_t>(bytes.size()) ? zip_fread(member.get(), &extra, 1) : 0;
    if (got != static_cast<zip_int64_t>(bytes.size()) || more != 0) {
      // libzip's own text, unless it has none ("No error": the directory's size lied).
      const int code = member ? zip_error_code_zip(zip_file_get_error(member.get())) : ZIP_ER_OK;
      const std::string why = code != ZIP_ER_OK ? zip_file_strerror(member.get())
                              : !member         ? zip_strerror(archive.get())
                              : got < 0         ? "a read error"
                                                : fmt::format(
                                                      "the archive's directory says {} bytes, the member "
                                                              "holds {}",
                                                      bytes.size(), more > 0 ? "more" : std::to_string(got));
      throw DataError(fmt::format("{}: member '{}' cannot be unpacked: {}", file.string(), name, why));
    }
    const fs::path shown = file.string() + "[" + name + "]";
    // NumPy keeps the last of two members of one name, a reader of the first would
    // train on other data: refused.
    if (!arrays.emplace(name.substr(0, name.size() - 4), npy_from_bytes(bytes, shown)).second) {
      throw DataError(fmt::format("{}: the archive holds two members named '{}'", file.string(), name));
    }
  }
  return arrays;
}

NpyFeaturesAndLabels read_npy_features_and_labels(const fs::path& features_file, const fs::path& labels_file) {
  const NpyArray features = read_npy(features_file);
  return features_and_labels(features, features_file, read_npy(labels_file), labels_file);
}

NpyFeaturesAndLabels features_and_labels(const NpyArray& features, const fs::path& features_file,
                                         const NpyArray& labels, const fs::path& labels_file) {
  if (features.shape.size() < 2) {
    throw DataError(
        fmt::format("{}: features of shape {}: expected a row axis and at least one more, (N, I), "
                    "(N, C, L) or (N, C, H, W)",
                    features_file.string(), shape_text(features.shape)));
  }
  const int64_t rows = features.shape[0];
  const std::vector<int64_t> sample_shape(features.shape.begin() + 1, features.shape.end());
  const int64_t width = features.values.numel() / std::max<int64_t>(rows, 1);
  if (rows == 0 || width == 0) {
    throw DataError(fmt::format("{}: features of shape {}: no {}", features_file.string(), shape_text(features.shape),
                                rows == 0 ? "rows" : "elements in a sample"));
  }
  const at::Tensor flat = features.values.reshape({rows, width});
  if (const int64_t bad = first_unusable(flat); bad >= 0) {
    throw DataError(
        fmt::format("{}: row {}, element {} of {}: value {} is {}", features_file.string(), bad / width, bad % width,
                    width, flat.reshape({-1})[bad].item<double>(),
                    std::isfinite(flat.reshape({-1})[bad].item<double>()) ? "beyond float32's range" : "not finite"));
  }

  if (labels.shape.size() != 1) {
    throw DataError(fmt::format("{}: labels of shape {}: expected one dimension, (N){}", labels_file.string(),
                                shape_text(labels.shape), labels.shape.size() == 2 ? "; save labels.reshape(-1)" : ""));
  }
  if (labels.shape[0] != rows) {
    throw DataError(fmt::format("{}: {} labels for the {} rows of {}", labels_file.string(), labels.shape[0], rows,
                                features_file.string()));
  }
  const at::Tensor whole = labels.values.isfinite().logical_and(labels.values == labels.values.round());
  const at::Tensor usable = whole.logical_and(labels.values >= 0).logical_and(labels.values <= kMaxNpyLabel);
  if (!usable.all().item<bool>()) {
    const int64_t row = usable.logical_not().nonzero()[0][0].item<int64_t>();
    const double value = labels.values[row].item<double>();
    throw DataError(fmt::format("{}: row {}: label {} is {}", labels_file.string(), row, value,
                                whole[row].item<bool>()
                                    ? fmt::format("out of range (class indices are 0 to {})", kMaxNpyLabel)
                                    : "not a whole number"));
  }
  return {flat, labels.values.to(at::kLong), sample_shape};
}

}  // namespace packtrain::runtime
