// A training run's data: where its rows come from and how they are split
// (DataArgs, stored inside checkpoints so `resume` reloads the same rows), the
// description a checkpoint records, and the loaded, split data.
#pragma once

#include "packtrain/runtime/data/data_split.h"
#include "packtrain/runtime/data/dataset.h"

#include <cstdint>
#include <string>
#include <vector>

namespace packtrain::runtime {

// Where a run's data come from and how they are split. Defaults: the bundled
// concrete set, its standard split 0, 10% of the training rows for validation.
struct DataArgs {
  std::string data = "concrete";                   // bundled name, UCI directory, or CSV/TSV file
  std::string features;                            // comma-separated names or indices; empty: all but the target
  std::string target;                              // name or index; empty: the last column
  std::string delimiter = "auto";                  // auto, comma, tab, semicolon, space
  std::string header = "auto";                     // auto, yes, no
  int split = 0;                                   // UCI standard split
  std::string train_index, val_index, test_index;  // index files (0-based rows)
  double val_fraction = 0.1;   // carved from the training rows when there is no validation index file
  double test_fraction = 0.2;  // table files without index files
  uint64_t split_seed = 0;
};

// What a checkpoint records about its run besides the trainer: where the data
// came from and the feature and target names (predict matches input columns by them).
struct RunDescription {
  DataArgs data;
  std::vector<std::string> feature_names;
  std::string target_name;
  // fingerprint_hex of the split data (rows and split) when it was written; empty in
  // checkpoints from before fingerprints were stored.
  std::string data_fingerprint;
};
std::string to_json(const RunDescription& run);
// DataError when the text is not a run description.
RunDescription run_description_from_json(const std::string& json);

// The table reader's format from the delimiter and header arguments (DataError
// naming a bad one).
TableFormat table_format(const DataArgs& args);
DatasetSpec dataset_spec(const DataArgs& args);

struct SplitData {
  Dataset all;
  DataSplit split;
  std::string description;   // e.g. "concrete split 0 (834 train / 93 validation / 103 test rows)"
  uint64_t fingerprint = 0;  // of every row and of the split (runtime/data/fingerprint.h)
  Dataset train() const { return subset(all, split.train); }
  Dataset validation() const { return subset(all, split.validation); }
  Dataset test() const { return subset(all, split.test); }
};
// Loads and splits; throws DataError on bad data or split arguments.
SplitData load_split_data(const DataArgs& args);

// Whether `data` are the rows and split `run` was trained on: DataError (ending with
// `advice`) when its recorded fingerprint differs; false when it records none (a
// checkpoint from before fingerprints), true when they match.
bool check_same_data(const RunDescription& run, const SplitData& data, const std::string& advice);

}  // namespace packtrain::runtime
