// Safetensors files, Hugging Face's weight format, both ways: an 8-byte little-endian
// header length N, N bytes of JSON ({name: {"dtype", "shape", "data_offsets": [begin,
// end]}, optional "__metadata__": {string: string}}), then the tensors' bytes, offsets
// relative to the end of the header. A file is opened and its whole header checked
// before any tensor is read: a header that does not parse, an entry without a
// known dtype, a shape whose bytes are not its offsets' span, offsets outside the data,
// overlapping or leaving holes, and data longer than the header says are each a
// UserError naming the file and the tensor. Reading preads one tensor (in the file's
// dtype) from the open file — no memory map, so a file truncated while it is read is
// a UserError naming it, not SIGBUS; writing goes through write_file_atomically.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace packtrain::runtime {

class SafetensorsFile {
 public:
  struct Entry {
    c10::ScalarType dtype = c10::ScalarType::Float;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte offsets into the data section
  };

  // Opens and checks `path`; UserError naming it (and the tensor) for anything above.
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Tensor names in the header's (sorted) order.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // UserError naming the file when there is no such tensor.
  const Entry& entry(const std::string& name) const;
  // The tensor's values, read from the file (an owned CPU tensor, the file's dtype).
  at::Tensor tensor(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  void read_at(void* into, size_t bytes, uint64_t offset) const;

  std::filesystem::path path_;
  int fd_ = -1;
  size_t size_ = 0;        // when opened
  size_t data_start_ = 0;  // 8 + N
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// The safetensors name of a dtype ("F32", "BF16", ...); throws for one the format has none for.
std::string safetensors_dtype_name(c10::ScalarType dtype);

// Writes `tensors` (contiguous copies are made as needed; CPU or not) in order with
// `metadata` as `path`, atomically (write_file_atomically: a crash leaves the old file
// or none). Names must be distinct.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace packtrain::runtime
