#include "packtrain/runtime/data/run_data.h"

#include "packtrain/base/enum_names.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/fingerprint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace packtrain::runtime {

// Each field once: the JSON keys are the member names (from_json throws on a missing key).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DataArgs, data, features, target, delimiter, header, split, train_index, val_index,
                                   test_index, val_fraction, test_fraction, split_seed)
// Missing keys keep their defaults: earlier checkpoints have no data_fingerprint.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RunDescription, data, feature_names, target_name, data_fingerprint)

std::string to_json(const RunDescription& run) { return nlohmann::json(run).dump(); }

RunDescription run_description_from_json(const std::string& text) {
  const nlohmann::json root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object() || !root.contains("data")) {
    throw DataError("checkpoint: no description of its data (was it written by `packtrain train`?)");
  }
  try {
    return root.get<RunDescription>();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(std::string("checkpoint: bad data description: ") + e.what());
  }
}

namespace {
// The delimiter names (with the characters themselves accepted too).
enum class Delimiter { kAuto, kComma, kTab, kSemicolon, kSpace };
constexpr EnumNames<Delimiter, 5> kDelimiterNames{"delimiter",
                                                  {{{Delimiter::kAuto, "auto"},
                                                    {Delimiter::kComma, "comma"},
                                                    {Delimiter::kTab, "tab"},
                                                    {Delimiter::kSemicolon, "semicolon"},
                                                    {Delimiter::kSpace, "space"}}}};
constexpr EnumNames<HeaderMode, 3> kHeaderModeNames{
    "header mode", {{{HeaderMode::kDetect, "auto"}, {HeaderMode::kYes, "yes"}, {HeaderMode::kNo, "no"}}}};

char delimiter_char(const std::string& name) {
  if (name == ",") return ',';
  if (name == "\\t") return '\t';
  if (name == ";") return ';';
  if (name == "whitespace") return ' ';
  const auto d = kDelimiterNames.find(name);
  if (!d) throw DataError("unknown delimiter '" + name + "' (expected " + kDelimiterNames.expected() + ")");
  switch (*d) {
    case Delimiter::kAuto: return 0;
    case Delimiter::kComma: return ',';
    case Delimiter::kTab: return '\t';
    case Delimiter::kSemicolon: return ';';
    case Delimiter::kSpace: return ' ';
  }
  return 0;
}

void check_fraction(double f, const char* name) {
  if (!(f >= 0 && f < 1)) throw DataError(fmt::format("{} must be in [0, 1), got {}", name, f));
}
}  // namespace

TableFormat table_format(const DataArgs& a) {
  TableFormat format;
  format.delimiter = delimiter_char(a.delimiter);
  const auto header = kHeaderModeNames.find(a.header);
  if (!header) throw DataError("unknown header mode '" + a.header + "' (expected " + kHeaderModeNames.expected() + ")");
  format.header = *header;
  return format;
}

DatasetSpec dataset_spec(const DataArgs& a) {
  DatasetSpec spec;
  spec.path = a.data;
  spec.format = table_format(a);
  for (size_t start = 0; start < a.features.size();) {
    const size_t comma = a.features.find(',', start);
    const size_t end = comma == std::string::npos ? a.features.size() : comma;
    if (end > start) spec.features.push_back(a.features.substr(start, end - start));
    start = end + 1;
  }
  spec.target = a.target;
  return spec;
}

SplitData load_split_data(const DataArgs& a) {
  check_fraction(a.val_fraction, "--val-fraction");
  check_fraction(a.test_fraction, "--test-fraction");
  SplitData out;
  out.all = load_dataset(dataset_spec(a));
  const int64_t rows = out.all.features.size(0);
  std::string how;
  if (!a.train_index.empty() || !a.test_index.empty()) {
    if (a.train_index.empty() || a.test_index.empty()) {
      throw DataError("--train-index and --test-index go together (--val-index is optional)");
    }
    out.split.train = read_index_file(a.train_index, rows);
    out.split.test = read_index_file(a.test_index, rows);
    how = "index files";
  } else if (out.all.uci_splits) {
    out.split = uci_split(out.all, a.split);
    how = fmt::format("split {}", a.split);
  } else if (out.all.own_split) {
    if (a.split != 0) {
      throw DataError(fmt::format("{}: --split {}: an array directory has one train / test split, its own",
                                  out.all.source.string(), a.split));
    }
    out.split = *out.all.own_split;
    how = "own train / test split";
  } else {
    if (a.split != 0) {  // a UCI split's number: nothing here to pick
      throw DataError(
          fmt::format("{}: --split {}: only a UCI-format directory has numbered splits; these rows are split by "
                      "--val-fraction and --test-fraction (another draw: --split-seed)",
                      out.all.source.string(), a.split));
    }
    out.split = split_by_fractions(rows, a.val_fraction, a.test_fraction, a.split_seed);
    how = fmt::format("random split (seed {})", a.split_seed);
  }
  if (!a.val_index.empty()) {
    out.split.validation = read_index_file(a.val_index, rows);
  } else if (out.split.validation.empty() && a.val_fraction > 0) {
    carve_validation(out.split, a.val_fraction, a.split_seed);
  }
  check_split(out.split, rows);
  out.description = fmt::format(
      "{} {} ({} train / {} validation / {} test rows, {} features{})", out.all.name, how, out.split.train.size(),
      out.split.validation.size(), out.split.test.size(), out.all.features.size(1),
      out.all.sample_shape.size() > 1 ? fmt::format(", samples of shape ({})", fmt::join(out.all.sample_shape, ", "))
                                      : "");
  out.fingerprint = fingerprint(out);
  return out;
}

bool check_same_data(const RunDescription& run, const SplitData& data, const std::string& advice) {
  if (run.data_fingerprint.empty()) return false;
  const std::string now = fingerprint_hex(data.fingerprint);
  // A checkpoint from before the sample shape was fingerprinted records the rows' and
  // split's alone: the same rows still match it.
  const bool before_shapes = run.data_fingerprint == fingerprint_hex(fingerprint(data, /*with_shape=*/false));
  if (run.data_fingerprint != now && !before_shapes) {
    throw DataError(
        fmt::format("{}: the data, its sample shape or its split changed since this run was trained (fingerprint "
                    "{}, now {}); {}",
                    run.data.data, run.data_fingerprint, now, advice));
  }
  return true;
}

}  // namespace packtrain::runtime
