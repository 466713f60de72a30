// Safetensors files (runtime/io/safetensors_file.h).
#include "packtrain/runtime/io/safetensors_file.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/io/checkpoint_file.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

namespace packtrain::runtime {

namespace {

constexpr std::array<std::pair<const char*, c10::ScalarType>, 10> kDtypes{{
    {"F64", c10::ScalarType::Double},
    {"F32", c10::ScalarType::Float},
    {"F16", c10::ScalarType::Half},
    {"BF16", c10::ScalarType::BFloat16},
    {"I64", c10::ScalarType::Long},
    {"I32", c10::ScalarType::Int},
    {"I16", c10::ScalarType::Short},
    {"I8", c10::ScalarType::Char},
    {"U8", c10::ScalarType::Byte},
    {"BOOL", c10::ScalarType::Bool},
}};

// A header this large is no weight file's (Hugging Face's reader refuses past 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// One tensor's header entry, checked against the data section's size.
template <typename Fail>
SafetensorsFile::Entry parse_entry(const std::string& name, const nlohmann::json& value, uint64_t data_bytes,
                                   const Fail& fail) {
  using Entry = SafetensorsFile::Entry;
  const auto bad = [&](const std::string& problem) { return fail("tensor '" + name + "': " + problem); };
  if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets")) {
    throw bad("its entry needs dtype, shape and data_offsets");
  }
  Entry e;
  const nlohmann::json& dtype = value.at("dtype");
  const auto known = std::find_if(kDtypes.begin(), kDtypes.end(), [&](const auto& d) {
    return dtype.is_string() && dtype.get<std::string>() == d.first;
  });
  if (known == kDtypes.end()) throw bad("unknown dtype " + dtype.dump());
  e.dtype = known->second;
  const nlohmann::json& shape = value.at("shape");
  if (!shape.is_array()) throw bad("shape is not a list");
  uint64_t numel = 1;
  for (const nlohmann::json& s : shape) {
    if (!s.is_number_unsigned() || s.get<uint64_t>() > (uint64_t{1} << 40)) {
      throw bad("shape " + shape.dump() + " is not a list of sizes");
    }
    e.shape.push_back(s.get<int64_t>());
    if (numel > 0 && s.get<uint64_t>() > std::numeric_limits<uint64_t>::max() / numel) {
      throw bad("shape " + shape.dump() + " has more elements than can be counted");
    }
    numel *= s.get<uint64_t>();
  }
  const nlohmann::json& offsets = value.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    throw bad("data_offsets " + offsets.dump() + " is not [begin, end]");
  }
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_bytes) {
    throw bad("data_offsets " + offsets.dump() + " lie outside the file's " + std::to_string(data_bytes) +
              " bytes of data");
  }
  const uint64_t itemsize = c10::elementSize(e.dtype);
  if (numel > std::numeric_limits<uint64_t>::max() / itemsize || e.end - e.begin != numel * itemsize) {
    throw bad("shape " + shape.dump() + " of " + dtype.get<std::string>() + " needs " +
              std::to_string(numel * itemsize) + " bytes, data_offsets " + offsets.dump() + " hold " +
              std::to_string(e.end - e.begin));
  }
  return e;
}

}  // namespace

std::string safetensors_dtype_name(c10::ScalarType dtype) {
  for (const auto& [name, type] : kDtypes) {
    if (type == dtype) return name;
  }
  throw UserError(std::string("safetensors has no dtype for ") + c10::toString(dtype));
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const auto fail = [&](const std::string& problem) {
    return UserError("safetensors file '" + path.string() + "': " + problem);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw fail(std::string("cannot open it: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw fail("not a regular file");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // a regular file: ordinary blocking reads
  size_ = static_cast<size_t>(st.st_size);
  fd_ = fd;  // kept open: each tensor is read with pread, never memory-mapped
  try {
    if (size_ < 8) throw fail("shorter (" + std::to_string(size_) + " bytes) than the 8-byte header length");
    unsigned char length[8];
    read_at(length, 8, 0);
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length[i];  // little-endian
    if (header_bytes > kMaxHeaderBytes || header_bytes > size_ - 8) {
      throw fail("its header length " + std::to_string(header_bytes) + " runs past the file's " +
                 std::to_string(size_) + " bytes");
    }
    data_start_ = 8 + static_cast<size_t>(header_bytes);
    std::string header_text(static_cast<size_t>(header_bytes), '\0');
    read_at(header_text.data(), header_text.size(), 8);
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(header_text);
    } catch (const nlohmann::json::exception& e) {
      throw fail(std::string("its JSON header does not parse: ") + e.what());
    }
    if (!header.is_object()) throw fail("its JSON header is not an object");
    const uint64_t data_bytes = size_ - data_start_;
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        if (!value.is_object()) throw fail("__metadata__ is not an object of strings");
        for (const auto& [key, text] : value.items()) {
          if (!text.is_string()) throw fail("__metadata__ value '" + key + "' is not a string");
          metadata_[key] = text.get<std::string>();
        }
        continue;
      }
      Entry e = parse_entry(name, value, data_bytes, fail);
      spans.emplace_back(e.begin, e.end);
      entries_.emplace(name, std::move(e));
    }
    // The tensors tile the data section: no overlap, no hole, nothing after the last.
    std::sort(spans.begin(), spans.end());
    uint64_t covered = 0;
    for (const auto& [begin, end] : spans) {
      if (begin != covered) {
        throw fail(begin < covered ? "two tensors' data_offsets overlap at byte " + std::to_string(begin)
                                   : "bytes " + std::to_string(covered) + ".." + std::to_string(begin) +
                                         " of its data belong to no tensor");
      }
      covered = end;
    }
    if (covered != data_bytes) {
      throw fail("it holds " + std::to_string(data_bytes) + " bytes of data, its header accounts for " +
                 std::to_string(covered) + " (a truncated header, or a file longer than it says)");
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

// Reads exactly `bytes` at `offset`. A file that shrank since it was opened (rewritten
// in place while this process reads it) is a UserError naming it: reading, unlike a
// memory map, turns a truncation into an error instead of SIGBUS.
void SafetensorsFile::read_at(void* into, size_t bytes, uint64_t offset) const {
  auto* out = static_cast<char*>(into);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd_, out, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      throw UserError("safetensors file '" + path_.string() + "': cannot read it: " + std::strerror(errno));
    }
    if (got == 0) {
      struct stat st {};
      const bool known = ::fstat(fd_, &st) == 0;
      throw UserError("safetensors file '" + path_.string() + "' ended at byte " + std::to_string(offset) + " of the " +
                      std::to_string(size_) + " it had when opened" +
                      (known ? " (it now has " + std::to_string(st.st_size) + ")" : std::string()) +
                      ": it was truncated or rewritten while being read");
    }
    out += got;
    offset += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : entries_) out.push_back(name);
  return out;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw UserError("safetensors file '" + path_.string() + "' has no tensor '" + name + "'");
  return it->second;
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const Entry& e = entry(name);
  at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  if (e.end > e.begin) read_at(out.data_ptr(), e.end - e.begin, data_start_ + e.begin);
  return out;
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> contiguous;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (!seen.insert(name).second || name == "__metadata__") {
      throw UserError("write_safetensors: tensor name '" + name + "' given twice or reserved");
    }
    contiguous.push_back(t.detach().cpu().contiguous());
    const uint64_t bytes = contiguous.back().nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as Hugging Face's writer pads
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  bytes += text;
  bytes.reserve(bytes.size() + offset);
  for (const at::Tensor& t : contiguous) bytes.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  write_file_atomically(path, bytes);
}

}  // namespace packtrain::runtime
