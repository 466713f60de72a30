// `--config FILE`: checked line by line before CLI11 reads it, so a mistake is
// reported at its file:line (CLI11 names neither) and a key given twice is an error
// (CLI11 keeps the first silently).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace packtrain::cli {

// Where each key of a config file is set: "section.key" (or "key" outside any
// [section]) -> its 1-based line.
struct ConfigLines {
  std::string path;
  std::map<std::string, int> line_of_key;
};

// Reads `path` (a regular file of at most 1 MiB) and checks its lines: blank, a
// comment (# or ;), a [section] header, or `key = value` (a value may be an array
// over several lines). DataError "FILE:LINE: ..." for any other line and for a key
// set twice in one section.
ConfigLines scan_config_file(const std::string& path);

// "FILE:LINE: " for a CLI11 error message about a flag whose value came from the
// config (the message names "--key" and `args`, the command line, does not set it:
// flags there win); empty otherwise.
std::string config_location(const ConfigLines& config, const std::string& message,
                            const std::vector<std::string>& args);

}  // namespace packtrain::cli
