// The bytes of a .npy file (format 1.0 or 2.0), built here so the reader's tests need
// no Python: the magic string, the version, the header length and the header
// dictionary padded with spaces to a multiple of 64 bytes and ended with '\n', then
// the raw elements — as numpy.lib.format writes them.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace packtrain::testing {

// The elements of `values` as their in-memory (little-endian) bytes.
template <class T>
std::string raw_bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A .npy file whose header dictionary is `dictionary` verbatim (for malformed ones).
inline std::string npy_with_dictionary(const std::string& dictionary, const std::string& data, int major = 1) {
  const size_t preamble = major == 1 ? 10 : 12;
  std::string header = dictionary;
  while ((preamble + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const uint32_t length = static_cast<uint32_t>(header.size());
  for (size_t i = 0; i < preamble - 8; ++i) out += static_cast<char>((length >> (8 * i)) & 0xFF);
  return out + header + data;
}

// A well-formed .npy file: descr such as "<f4", shape as Python writes it ("(2, 3)", "(4,)").
inline std::string npy(const std::string& descr, const std::string& shape, const std::string& data, int major = 1) {
  return npy_with_dictionary("{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }", data,
                             major);
}

inline std::string read_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::filesystem::path write_bytes(const std::filesystem::path& file, const std::string& bytes) {
  std::ofstream(file, std::ios::binary) << bytes;
  return file;
}

}  // namespace packtrain::testing
