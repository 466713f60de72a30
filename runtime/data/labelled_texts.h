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
// runtime/dataset.h finds bundled data).
std::filesystem::path bundled_cola_dir();

}  // namespace packtrain::runtime
