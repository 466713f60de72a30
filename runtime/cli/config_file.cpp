#include "packtrain/runtime/cli/config_file.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/input_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <sstream>

namespace packtrain::cli {

namespace {

std::string trim(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

bool is_key(const std::string& key) {
  return !key.empty() && std::all_of(key.begin(), key.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '-' || c == '.';
  });
}

// Net '[' minus ']' outside quoted strings: > 0 while an array continues on the next line.
int bracket_depth(const std::string& value) {
  int depth = 0;
  char quote = 0;
  for (const char c : value) {
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      break;
    } else {
      depth += c == '[' ? 1 : c == ']' ? -1 : 0;
    }
  }
  return depth;
}

// The key's flag spellings: CLI11 matches `batch_size` and `batch-size` to --batch-size.
bool names_flag(const std::string& text, const std::string& key) {
  std::string flag = key.substr(key.rfind('.') + 1);
  std::replace(flag.begin(), flag.end(), '_', '-');
  flag = "--" + flag;
  for (size_t at = text.find(flag); at != std::string::npos; at = text.find(flag, at + 1)) {
    const size_t end = at + flag.size();
    if (end == text.size() || !(std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '-')) return true;
  }
  return false;
}

}  // namespace

ConfigLines scan_config_file(const std::string& path) {
  ConfigLines out{path, {}};
  std::istringstream in(runtime::read_input_file(path, "config file", uint64_t{1} << 20));
  std::string line, section;
  int depth = 0;  // inside a multi-line array
  for (int number = 1; std::getline(in, line); ++number) {
    if (number == 1) runtime::strip_bom(line);
    const std::string text = trim(line);
    const auto fail = [&](const std::string& problem) {
      return runtime::DataError(fmt::format("{}:{}: {}", path, number, problem));
    };
    if (depth > 0) {
      depth += bracket_depth(text);
      continue;
    }
    if (text.empty() || text[0] == '#' || text[0] == ';') continue;
    if (text[0] == '[') {
      const size_t close = text.find(']');
      const std::string rest = close == std::string::npos ? "" : trim(text.substr(close + 1));
      section = close == std::string::npos ? "" : trim(text.substr(1, close - 1));
      if (!is_key(section) || !(rest.empty() || rest[0] == '#')) {
        throw fail(fmt::format("expected a [section] header, got '{}'", text));
      }
      continue;
    }
    const size_t eq = text.find('=');
    const std::string key = eq == std::string::npos ? "" : trim(text.substr(0, eq));
    const std::string value = eq == std::string::npos ? "" : trim(text.substr(eq + 1));
    if (!is_key(key) || value.empty()) {
      throw fail(fmt::format("expected `key = value` (a flag's name without dashes), got '{}'", text));
    }
    const std::string full = section.empty() ? key : section + "." + key;
    if (const auto [at, added] = out.line_of_key.emplace(full, number); !added) {
      throw fail(fmt::format("'{}' is set twice (first on line {})", full, at->second));
    }
    // A bare list (`lr = 1e-3,3e-3`) is split by CLI11, which drops a trailing empty
    // element the command line refuses (`--lr 1e-3,`): refused here too.
    if (value[0] != '[' && value[0] != '"' && value[0] != '\'' &&
        trim(value.substr(0, value.find('#'))).ends_with(',')) {
      throw fail(fmt::format("'{}' ends with a comma: an element of the list is empty (remove the comma)", text));
    }
    depth = std::max(0, bracket_depth(value));
  }
  return out;
}

std::string config_location(const ConfigLines& config, const std::string& message,
                            const std::vector<std::string>& args) {
  const std::string* best = nullptr;
  int line = 0;
  for (const auto& [key, number] : config.line_of_key) {
    const std::string name = key.substr(key.rfind('.') + 1);
    // CLI11 names a flag ("--members: must be > 0") or, for an unknown key, ends
    // with it ("INI was not able to parse train.nope").
    const bool named = names_flag(message, key) || message.ends_with("." + name) || message.ends_with(" " + name);
    if (!named) continue;
    const bool on_command_line = std::any_of(args.begin(), args.end(), [&](const std::string& arg) {
      return arg.starts_with("--") && names_flag(arg.substr(0, arg.find('=')), name);
    });
    if (on_command_line) continue;
    if (best == nullptr || key.size() > best->size()) best = &key, line = number;
  }
  return best == nullptr ? std::string() : fmt::format("{}:{}: ", config.path, line);
}

}  // namespace packtrain::cli
