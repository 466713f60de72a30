// Labelled sentences from a TSV file: CoLA's four tab-separated columns (source,
// label, original notation, sentence) or two (label, sentence), no header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace packtrain::runtime {

struct LabelledTexts {
  std::vector<std::string> texts;
  std::vector<int64_t> labels;  // 0 .. classes-1
  std::string source;           // the file, for messages
  size_t size() const { return texts.size(); }
};

// Throws DataError naming FILE:LINE for a row with another column count, a label
// that is not an integer in [0, classes), an empty (or all-blank) sentence, and for
// a file that is missing or has no rows. Blank lines and a trailing CR are skipped.
LabelledTexts read_labelled_tsv(const std::filesystem::path& path, int64_t classes = 2);

// The bundled CoLA directory (PACKTRAIN_DATA_DIR or the source tree's data/, as
// runtime/data/dataset.h finds bundled data).
std::filesystem::path bundled_cola_dir();

// A labelled-text task bundled in data/ (its README gives provenance and licence).
struct BundledTextTask {
  std::string name;         // what --task takes
  std::string description;  // one line for --help and the run's header
  std::filesystem::path train, dev;
  std::vector<std::string> class_names;  // line k names class k; their count is C
};

// "languages" (the default: which of five languages a fortune-cookie sentence is in,
// from Debian's fortunes packages, classes balanced) and "cola" (CoLA acceptability),
// under the bundled data directory as it is now.
std::vector<BundledTextTask> bundled_text_tasks();
// DataError listing the names for an unknown one; the class names are read here.
BundledTextTask bundled_text_task(const std::string& name);

// Class names, one per line (blank lines skipped); DataError for a missing file,
// a repeated name or fewer than two names.
std::vector<std::string> read_class_names(const std::filesystem::path& path);

// The number of classes the labels of `texts` imply: 1 + the largest (at least 2).
int64_t classes_in(const LabelledTexts& texts);

}  // namespace packtrain::runtime
