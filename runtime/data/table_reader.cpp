#include "packtrain/runtime/data/table_reader.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/input_file.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <system_error>
#include <unordered_map>

namespace packtrain::runtime {

namespace fs = std::filesystem;

namespace {

// One row as read: its fields and the file line where it starts.
struct Record {
  int64_t line = 0;
  std::vector<std::string> fields;
};

std::string at_line(const fs::path& file, int64_t line) { return file.string() + ":" + std::to_string(line); }

// A cell as it appears in a one-line message: line breaks escaped, long text cut.
std::string shown(std::string_view text) {
  std::string out;
  for (char ch : text.substr(0, 60)) out += ch == '\n' ? std::string("\\n") : std::string(1, ch);
  return text.size() > 60 ? out + "..." : out;
}

std::string_view trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

std::string read_text(const fs::path& file) {
  std::string text = read_input_file(file, "table file");
  strip_bom(text);
  return text;
}

// How often `delimiter` occurs outside quotes in each of the first `limit`
// non-blank records (a line break inside quotes does not end a record).
std::vector<int64_t> counts_per_record(std::string_view text, char delimiter, size_t limit) {
  std::vector<int64_t> counts;
  int64_t count = 0;
  bool quoted = false, blank = true;
  for (char ch : text) {
    if (ch == '"') quoted = !quoted;  // "" toggles twice, so escapes need no special case
    if (ch == '\n' && !quoted) {
      if (!blank) counts.push_back(count);
      if (counts.size() == limit) return counts;
      count = 0, blank = true;
      continue;
    }
    if (ch == delimiter && !quoted) ++count;
    if (ch != ' ' && ch != '\t' && ch != '\r') blank = false;
  }
  if (!blank) counts.push_back(count);
  return counts;
}

// Whether the first `limit` non-blank lines all split into the same number (> 1)
// of whitespace-separated fields.
bool whitespace_consistent(std::string_view text, size_t limit) {
  size_t width = 0, seen = 0;
  for (size_t pos = 0; pos < text.size() && seen < limit;) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    std::istringstream words{std::string(text.substr(pos, end - pos))};
    size_t fields = 0;
    for (std::string word; words >> word;) ++fields;
    pos = end + 1;
    if (fields == 0) continue;
    if (seen++ == 0) width = fields;
    if (fields != width) return false;
  }
  return width > 1;
}

// The candidate that splits every sampled record into the same number of fields,
// the most fields winning; else whitespace if that splits every sampled line
// evenly (spaces and a stray tab); else, for a ragged file, the candidate most
// frequent in the first record, so the ragged row is reported rather than the
// file misread as one column. No candidate at all: whitespace.
char detect_delimiter(std::string_view text) {
  constexpr size_t kSample = 20;
  char consistent = 0, frequent = ' ';
  int64_t consistent_count = 0, frequent_count = 0;
  for (char candidate : {',', '\t', ';', '|'}) {
    const std::vector<int64_t> counts = counts_per_record(text, candidate, kSample);
    if (counts.empty() || counts.front() == 0) continue;
    const int64_t count = counts.front();
    const bool same = std::all_of(counts.begin(), counts.end(), [&](int64_t n) { return n == count; });
    if (same && count > consistent_count) consistent = candidate, consistent_count = count;
    if (count > frequent_count) frequent = candidate, frequent_count = count;
  }
  if (consistent != 0) return consistent;
  return whitespace_consistent(text, kSample) ? ' ' : frequent;
}

// A read position in the text that tracks the 1-based line number.
struct Cursor {
  std::string_view text;
  size_t pos = 0;
  int64_t line = 1;

  bool done() const { return pos >= text.size(); }
  char peek() const { return text[pos]; }
  bool at_line_end() const {
    return done() || text[pos] == '\n' || (text[pos] == '\r' && pos + 1 < text.size() && text[pos + 1] == '\n');
  }
  void skip_line_end() {
    if (!done() && text[pos] == '\r') ++pos;
    if (!done() && text[pos] == '\n') ++pos, ++line;
  }
};

// Padding around a field; a tab is padding only when it is not the delimiter.
bool is_pad(char ch, char delimiter) { return (ch == ' ' || ch == '\t') && ch != delimiter; }

// After the opening quote: text up to the closing quote, "" meaning one quote;
// line breaks inside are part of the field (RFC 4180).
std::string read_quoted(Cursor& c, char delimiter, const fs::path& file) {
  const int64_t open_line = c.line;
  std::string out;
  for (++c.pos;; ++c.pos) {
    if (c.done())
      throw DataError(at_line(file, open_line) + ": unterminated quote (a field opened with \" never closes)");
    const char ch = c.peek();
    if (ch == '"' && c.pos + 1 < c.text.size() && c.text[c.pos + 1] == '"') {
      out += '"';
      ++c.pos;
    } else if (ch == '"') {
      break;
    } else {
      if (ch == '\n') ++c.line;
      out += ch;
    }
  }
  ++c.pos;  // the closing quote
  while (!c.done() && is_pad(c.peek(), delimiter)) ++c.pos;
  if (!c.at_line_end() && c.peek() != delimiter) {
    throw DataError(at_line(file, c.line) +
                    ": text after a closing quote (inside a quoted field write a quote as \"\")");
  }
  return out;
}

std::string read_field(Cursor& c, char delimiter, const fs::path& file) {
  while (!c.done() && is_pad(c.peek(), delimiter)) ++c.pos;
  if (!c.done() && c.peek() == '"') return read_quoted(c, delimiter, file);
  const size_t start = c.pos;
  while (!c.at_line_end() && c.peek() != delimiter) ++c.pos;
  return std::string(trim(c.text.substr(start, c.pos - start)));
}

std::vector<Record> parse_delimited(std::string_view text, char delimiter, const fs::path& file) {
  std::vector<Record> records;
  Cursor c{text};
  while (!c.done()) {
    Record record{c.line, {}};
    for (;;) {
      record.fields.push_back(read_field(c, delimiter, file));
      if (c.at_line_end()) break;
      ++c.pos;  // the delimiter
    }
    c.skip_line_end();
    const bool blank = record.fields.size() == 1 && record.fields.front().empty();
    if (!blank) records.push_back(std::move(record));
  }
  return records;
}

std::vector<Record> parse_whitespace(std::string_view text) {
  std::vector<Record> records;
  int64_t line = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    Record record{++line, {}};
    std::istringstream words{std::string(text.substr(pos, end - pos))};
    for (std::string word; words >> word;) record.fields.push_back(std::move(word));
    if (!record.fields.empty()) records.push_back(std::move(record));
    pos = end + 1;
  }
  return records;
}

void check_rectangular(const std::vector<Record>& records, const fs::path& file) {
  const size_t width = records.front().fields.size();
  for (const Record& record : records) {
    if (record.fields.size() != width) {
      throw DataError(at_line(file, record.line) + ": ragged row: " + std::to_string(record.fields.size()) +
                      " fields, expected " + std::to_string(width) + " (the first row has " + std::to_string(width) +
                      ")");
    }
  }
}

// Non-finite or huge text like "nan" or "1e300" still reads as a number here: it marks a data row.
bool looks_numeric(std::string_view cell) {
  const CellKind kind = parse_cell(cell).kind;
  return kind == CellKind::kNumber || kind == CellKind::kNonFinite || kind == CellKind::kOutOfRange;
}

bool detect_header(const std::vector<Record>& records) {
  const std::vector<std::string>& first = records.front().fields;
  for (size_t c = 0; c < first.size(); ++c) {
    if (looks_numeric(first[c])) continue;
    if (records.size() == 1 || looks_numeric(records[1].fields[c])) return true;
  }
  return false;
}

void check_delimiter(char delimiter, const fs::path& file) {
  if (delimiter == '"' || delimiter == '\n' || delimiter == '\r') {
    throw DataError(file.string() + ": unsupported delimiter '" + shown(std::string(1, delimiter)) +
                    "' (use 0 to detect, ' ' for whitespace, or a character such as ',' or '\\t')");
  }
}

std::string column_list(const std::vector<std::string>& columns) {
  constexpr size_t kShown = 30;  // wide tables: enough to spot a typo, still one line
  std::string out;
  for (size_t i = 0; i < std::min(columns.size(), kShown); ++i) out += (i ? ", " : "") + shown(columns[i]);
  if (columns.size() > kShown) out += ", ... (" + std::to_string(columns.size()) + " in all)";
  return out;
}

std::optional<int64_t> parse_integer(std::string_view text) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

ParsedCell parse_cell(std::string_view text) {
  if (text.empty()) return {CellKind::kEmpty, 0};
  // from_chars is locale-independent but rejects a leading '+', which exports write.
  if (text.size() > 1 && text[0] == '+' && text[1] != '+' && text[1] != '-') text.remove_prefix(1);
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::invalid_argument || end != text.data() + text.size()) return {CellKind::kNonNumeric, 0};
  // Out of range leaves `value` unset: strtod gives +-inf for overflow (an error
  // below) and 0 or a subnormal for underflow (a fine value).
  if (ec == std::errc::result_out_of_range) value = std::strtod(std::string(text).c_str(), nullptr);
  if (!std::isfinite(value)) return {CellKind::kNonFinite, value};
  return {std::abs(value) <= kMaxCellMagnitude ? CellKind::kNumber : CellKind::kOutOfRange, value};
}

std::string cell_problem(const ParsedCell& cell, std::string_view text) {
  switch (cell.kind) {
    case CellKind::kNumber: return "";
    case CellKind::kNonFinite: return "non-finite value '" + shown(text) + "'";
    case CellKind::kOutOfRange:
      return "value '" + shown(text) + "' beyond float32's range (±3.4e38, the precision packtrain computes in; " +
             "rescale the column)";
    case CellKind::kNonNumeric: return "non-numeric cell '" + shown(text) + "'";
    case CellKind::kEmpty: return "empty cell";
  }
  return "unreadable cell";
}

int64_t Table::column_index(const std::string& name_or_index) const {
  for (size_t i = 0; i < columns.size(); ++i) {
    if (columns[i] == name_or_index) return static_cast<int64_t>(i);
  }
  const std::optional<int64_t> index = parse_integer(name_or_index);
  if (!index)
    throw DataError(file.string() + ": unknown column '" + name_or_index + "' (columns: " + column_list(columns) + ")");
  const int64_t resolved = *index < 0 ? *index + cols() : *index;
  if (resolved < 0 || resolved >= cols()) {
    throw DataError(file.string() + ": column index " + name_or_index + " out of range: the table has " +
                    std::to_string(cols()) + " columns (0.." + std::to_string(cols() - 1) + ", or -" +
                    std::to_string(cols()) + "..-1 from the end)");
  }
  return resolved;
}

at::Tensor Table::numeric(const std::vector<int64_t>& chosen) const {
  for (int64_t c : chosen)
    TORCH_CHECK(c >= 0 && c < cols(), file.string(), ": column ", c, " out of range [0, ", cols(), ")");
  at::Tensor out = at::empty({rows(), static_cast<int64_t>(chosen.size())}, at::kDouble);
  auto values = out.accessor<double, 2>();
  for (int64_t r = 0; r < rows(); ++r) {
    for (size_t j = 0; j < chosen.size(); ++j) {
      const std::string& text = cells[r][chosen[j]];
      const ParsedCell cell = parse_cell(text);
      if (cell.kind != CellKind::kNumber) {
        throw DataError(at_line(file, line_numbers[r]) + ":" + std::to_string(chosen[j] + 1) + ": " +
                        cell_problem(cell, text) + " in column '" + shown(columns[chosen[j]]) + "'");
      }
      values[r][j] = cell.value;
    }
  }
  return out;
}

Table read_table(const fs::path& file, const TableFormat& format) {
  check_delimiter(format.delimiter, file);
  const std::string text = read_text(file);
  Table table;
  table.file = file;
  table.delimiter = format.delimiter != 0 ? format.delimiter : detect_delimiter(text);
  std::vector<Record> records =
      table.delimiter == ' ' ? parse_whitespace(text) : parse_delimited(text, table.delimiter, file);
  if (records.empty()) throw DataError(file.string() + ": empty file (no rows)");
  check_rectangular(records, file);
  table.has_header =
      format.header == HeaderMode::kYes || (format.header == HeaderMode::kDetect && detect_header(records));
  if (table.has_header && records.size() == 1) throw DataError(file.string() + ": no data rows (only a header line)");
  if (table.has_header) {
    table.columns = std::move(records.front().fields);
    // A name twice would pick one of its columns by chance (as the target, or a feature).
    std::unordered_map<std::string_view, size_t> seen;
    for (size_t c = 0; c < table.columns.size(); ++c) {
      if (const auto [at, added] = seen.emplace(table.columns[c], c); !added) {
        throw DataError(
            fmt::format("{}: the header names column '{}' twice (columns {} and {}, 0-based); column "
                        "names must be unique",
                        at_line(file, records.front().line), shown(table.columns[c]), at->second, c));
      }
    }
  } else {
    for (size_t c = 0; c < records.front().fields.size(); ++c) table.columns.push_back(std::to_string(c));
  }
  for (size_t r = table.has_header ? 1 : 0; r < records.size(); ++r) {
    table.cells.push_back(std::move(records[r].fields));
    table.line_numbers.push_back(records[r].line);
  }
  return table;
}

}  // namespace packtrain::runtime
