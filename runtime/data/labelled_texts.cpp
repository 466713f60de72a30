#include "packtrain/runtime/data/labelled_texts.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/dataset.h"
#include "packtrain/runtime/data/input_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <string_view>

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

// Calls row(number, line) for each non-blank line of a checked input file, a
// leading byte-order mark (not part of the first value) and a trailing CR removed.
template <typename Row>
void for_each_line(const std::filesystem::path& path, std::string_view what, Row&& row) {
  check_input_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open (missing or unreadable)", path.string()));
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    check_line_length(path, number, line.size());
    if (number == 1) strip_bom(line);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!blank(line)) row(number, line);
  }
}
}  // namespace

LabelledTexts read_labelled_tsv(const std::filesystem::path& path, int64_t classes) {
  LabelledTexts out;
  out.source = path.string();
  for_each_line(path, "text data file", [&](int64_t number, const std::string& line) {
    const std::vector<std::string> cells = split_tabs(line);
    if (cells.size() != 4 && cells.size() != 2) {
      throw DataError(
          fmt::format("{}:{}: expected 4 tab-separated columns (source, label, notation, sentence) "
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
  });
  if (out.texts.empty()) throw DataError(fmt::format("{}: no labelled sentences", path.string()));
  return out;
}

std::filesystem::path bundled_cola_dir() { return bundled_data_dir() / "cola"; }

std::vector<BundledTextTask> bundled_text_tasks() {
  const std::filesystem::path languages = bundled_data_dir() / "fortunes-languages";
  return {
      {"languages",
       "which of 5 languages a sentence is in (English, German, Spanish, Italian, Portuguese fortune cookies from "
       "Debian; 8,000 train / 1,000 dev, classes balanced)",
       languages / "train.tsv",
       languages / "dev.tsv",
       {}},
      {"cola",
       "CoLA v1.1: is an English sentence grammatically acceptable (8,551 train / 527 in-domain dev, 70% "
       "acceptable)",
       bundled_cola_dir() / "in_domain_train.tsv",
       bundled_cola_dir() / "in_domain_dev.tsv",
       {"unacceptable", "acceptable"}},
  };
}

BundledTextTask bundled_text_task(const std::string& name) {
  std::vector<std::string> names;
  for (const BundledTextTask& task : bundled_text_tasks()) {
    if (task.name != name) {
      names.push_back(task.name);
      continue;
    }
    BundledTextTask out = task;
    if (out.class_names.empty()) out.class_names = read_class_names(out.train.parent_path() / "labels.txt");
    return out;
  }
  throw DataError(fmt::format("no bundled text task '{}' (there are: {})", name, fmt::join(names, ", ")));
}

std::vector<std::string> read_class_names(const std::filesystem::path& path) {
  std::vector<std::string> names;
  for_each_line(path, "class names file", [&](int64_t number, const std::string& line) {
    if (std::find(names.begin(), names.end(), line) != names.end()) {
      throw DataError(fmt::format("{}:{}: the class name '{}' is given twice", path.string(), number, line));
    }
    names.push_back(line);
  });
  if (names.size() < 2) {
    throw DataError(
        fmt::format("{}: {} class name(s); a classifier needs at least 2, one per line", path.string(), names.size()));
  }
  return names;
}

int64_t classes_in(const LabelledTexts& texts) {
  const int64_t largest = texts.labels.empty() ? 0 : *std::max_element(texts.labels.begin(), texts.labels.end());
  return std::max<int64_t>(2, largest + 1);
}

}  // namespace packtrain::runtime
