// What every packtrain subcommand shares: the errors that mean "bad input" (exit
// status 2), device selection, and the loaded, split data of a training command.
#pragma once

#include "runtime/data_split.h"
#include "runtime/dataset.h"

#include <c10/core/Device.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace packtrain::runtime {
class EnsembleTrainer;
namespace distributed {
class ProcessGroup;
}
}

namespace packtrain::cli {

// A bad argument the parser could not catch (exit status 2, like DataError).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "auto" (CUDA when present, else CPU), "cpu", "cuda" or "cuda:N". In a
// multi-process run (torchrun, srun, packtrain launch) "auto" and "cuda" mean this
// rank's GPU, cuda:LOCAL_RANK: one GPU per process.
c10::Device pick_device(const std::string& name);

// Under torchrun, srun or packtrain launch (any number of processes, one too):
// joins the run's process group (Gloo, and NCCL on `device` when it is a GPU);
// started alone: nullptr.
std::unique_ptr<runtime::distributed::ProcessGroup> join_if_launched(c10::Device device);

// Where a training command's data come from and how they are split: stored in
// checkpoints (JSON) so `resume` reloads the same rows.
struct DataArgs {
  std::string data = "concrete";  // bundled name, UCI directory, or CSV/TSV file
  std::string features;           // comma-separated names or indices; empty: all but the target
  std::string target;             // name or index; empty: the last column
  std::string delimiter = "auto";  // auto, comma, tab, semicolon, space
  std::string header = "auto";     // auto, yes, no
  int split = 0;                   // UCI standard split
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
};
std::string to_json(const RunDescription& run);
// DataError when the text is not a run description.
RunDescription run_description_from_json(const std::string& json);

// The table reader's format from the delimiter and header arguments.
runtime::TableFormat table_format(const DataArgs& args);
runtime::DatasetSpec dataset_spec(const DataArgs& args);

struct SplitData {
  runtime::Dataset all;
  runtime::DataSplit split;
  std::string description;  // e.g. "concrete split 0 (834 train / 93 validation / 103 test rows)"
  runtime::Dataset train() const { return runtime::subset(all, split.train); }
  runtime::Dataset validation() const { return runtime::subset(all, split.validation); }
  runtime::Dataset test() const { return runtime::subset(all, split.test); }
};
// Loads and splits; throws DataError on bad data or split arguments.
SplitData load_split_data(const DataArgs& args);

// Writes `members` (all when empty) with the standardization, head and feature
// names for Python's torch.load (runtime/model_export.h).
void export_members(const std::string& path, const runtime::EnsembleTrainer& trainer,
                    const std::vector<std::string>& feature_names, const std::vector<int64_t>& members);
}  // namespace packtrain::cli
