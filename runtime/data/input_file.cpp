#include "packtrain/runtime/data/input_file.h"

#include "packtrain/base/fnv1a.h"
#include "packtrain/runtime/data/data_error.h"

#include <fmt/format.h>

#include <sys/stat.h>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

namespace packtrain::runtime {

uint64_t check_input_file(const std::filesystem::path& file, std::string_view what, uint64_t max_bytes) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) {
    const int error = errno;
    if (error == ELOOP) throw DataError(fmt::format("{}: a loop of symbolic links, not a {}", file.string(), what));
    throw DataError(
        fmt::format("{}: cannot open file ({}; a {} was expected)", file.string(), std::strerror(error), what));
  }
  if (S_ISDIR(st.st_mode)) throw DataError(fmt::format("{}: is a directory, not a {}", file.string(), what));
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISFIFO(st.st_mode)                         ? "a FIFO"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                       : S_ISSOCK(st.st_mode)                       ? "a socket"
                                                                    : "not a regular file";
    throw DataError(
        fmt::format("{}: is {}, not a regular file; a {} must be a regular file", file.string(), kind, what));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    throw DataError(
        fmt::format("{}: {} bytes, more than the {} bytes a {} may have", file.string(), st.st_size, max_bytes, what));
  }
  return static_cast<uint64_t>(st.st_size);
}

uint64_t input_file_checksum(const std::filesystem::path& file, std::string_view what, uint64_t max_bytes) {
  check_input_file(file, what, max_bytes);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open the {} (unreadable)", file.string(), what));
  Fnv1a hash;
  std::vector<char> block(size_t{1} << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    hash.add(block.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) throw DataError(file.string() + ": read error");
  return hash.value();
}

void strip_bom(std::string& text) {
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);
}

void check_line_length(const std::filesystem::path& file, int64_t number, size_t length) {
  if (length > kMaxLineBytes) {
    throw DataError(fmt::format("{}:{}: a line of {} bytes, longer than the {} bytes a line may have", file.string(),
                                number, length, kMaxLineBytes));
  }
}

std::string read_input_bytes(const std::filesystem::path& file, std::string_view what, uint64_t max_bytes) {
  const uint64_t size = check_input_file(file, what, max_bytes);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open the {} (unreadable)", file.string(), what));
  std::string text;
  text.resize(static_cast<size_t>(size));
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw DataError(file.string() + ": read error");
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

std::string read_input_file(const std::filesystem::path& file, std::string_view what, uint64_t max_bytes) {
  std::string text = read_input_bytes(file, what, max_bytes);
  int64_t number = 1;
  for (size_t start = 0; start < text.size(); ++number) {
    const size_t end = std::min(text.find('\n', start), text.size());
    check_line_length(file, number, end - start);
    start = end + 1;
  }
  return text;
}

}  // namespace packtrain::runtime
