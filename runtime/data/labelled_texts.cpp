#include "packtrain/runtime/data/labelled_texts.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/input_file.h"
#include "packtrain/runtime/data/dataset.h"

#include <fmt/format.h>

#include <charconv>
#include <fstream>

namespace packtrain::runtime {

namespace {
std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t tab; (tab = line.find('\t', start)) != std::string::npos; start = tab + 1)
    out.push_back(line.substr(start, tab - start));
  out.push_back(line.substr(start));
  return out;
}

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r") == std::string::npos; }
}  // namespace

LabelledTexts read_labelled_tsv(const std::filesystem::path& path, int64_t classes) {
  check_input_file(path, "text data file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open (missing or unreadable)", path.string()));
  LabelledTexts out;
  out.source = path.string();
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    check_line_length(path, number, line.size());
    if (number == 1) strip_bom(line);  // not part of the first label
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (blank(line)) continue;
    const std::vector<std::string> cells = split_tabs(line);
    if (cells.size() != 4 && cells.size() != 2) {
      throw DataError(fmt::format("{}:{}: expected 4 tab-separated columns (source, label, notation, sentence) "
                                  "or 2 (label, sentence), found {}",
                                  path.string(), number, cells.size()));
    }
    const std::string& label_text = cells.size() == 4 ? cells[1] : cells[0];
    const std::string& text = cells.back();
    int64_t label = -1;
    const auto [end, error] = std::from_chars(label_text.data(), label_text.data() + label_text.size(), label);
    if (error != std::errc() || end != label_text.data() + label_text.size() || label < 0 || label >= classes) {
      throw DataError(fmt::format("{}:{}: unknown label '{}' (labels are integers 0 to {})", path.string(), number,
                                  label_text, classes - 1));
    }
    if (blank(text)) throw DataError(fmt::format("{}:{}: the sentence is empty", path.string(), number));
    out.texts.push_back(text);
    out.labels.push_back(label);
  }
  if (out.texts.empty()) throw DataError(fmt::format("{}: no labelled sentences", path.string()));
  return out;
}

std::filesystem::path bundled_cola_dir() { return bundled_data_dir() / "cola"; }

}  // namespace packtrain::runtime
