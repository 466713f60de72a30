// Input files a user names (tables, text data, splits, configs, manifests), read
// with bounds: a regular file (a directory, device, FIFO or socket is refused —
// /dev/zero would never end, a FIFO could block forever) of at most a size limit,
// with lines of at most kMaxLineBytes. Every refusal is a DataError naming the file
// (and the line), so the CLI exits 2 with one line.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace packtrain::runtime {

inline constexpr uint64_t kMaxInputBytes = uint64_t{4} << 30;  // 4 GiB
inline constexpr size_t kMaxLineBytes = size_t{16} << 20;      // 16 MiB: a row of a million cells

// Throws DataError unless `file` is a regular file (after following symlinks; a
// loop is named as one) of at most `max_bytes`. `what` says what the file is for
// ("table file", "config file").
// Returns its size in bytes.
uint64_t check_input_file(const std::filesystem::path& file, std::string_view what,
                          uint64_t max_bytes = kMaxInputBytes);

// check_input_file, then the whole content; DataError naming the first line longer
// than kMaxLineBytes.
std::string read_input_file(const std::filesystem::path& file, std::string_view what,
                            uint64_t max_bytes = kMaxInputBytes);

// check_input_file, then the whole content, whatever its lines (a minified JSON
// file is one long line).
std::string read_input_bytes(const std::filesystem::path& file, std::string_view what,
                             uint64_t max_bytes = kMaxInputBytes);

// check_input_file, then FNV-1a 64 of the whole content, read in blocks (a weight
// file of gigabytes is never held at once).
uint64_t input_file_checksum(const std::filesystem::path& file, std::string_view what, uint64_t max_bytes = UINT64_MAX);

// Removes a UTF-8 byte-order mark (spreadsheet exports start with one) from the
// start of `text`, the first line of a file.
void strip_bom(std::string& text);

// DataError "<file>:<line>: line longer than ..." when `line` is too long.
void check_line_length(const std::filesystem::path& file, int64_t number, size_t length);

}  // namespace packtrain::runtime
