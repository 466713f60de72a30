#include "runtime/cli/cli_common.h"

#include "runtime/data_error.h"
#include "runtime/distributed/process_group.h"
#include "runtime/distributed/rank_info.h"
#include "runtime/ensemble_trainer.h"
#include "runtime/model_export.h"

#include <ATen/Context.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace packtrain::cli {

c10::Device pick_device(const std::string& name) {
  c10::Device device(c10::kCPU);
  if (name == "auto") {
    if (!at::hasCUDA()) return device;
    device = c10::Device(c10::kCUDA);
  }
  try {
    if (name != "auto") device = c10::Device(name);
  } catch (const c10::Error&) {
    throw UsageError("unknown device '" + name + "' (expected auto, cpu, cuda or cuda:N)");
  }
  if (device.is_cuda() && !at::hasCUDA()) throw UsageError("device '" + name + "' requested but no CUDA device is available");
  if (!device.is_cuda() && !device.is_cpu()) throw UsageError("device '" + name + "' is not supported (cpu or cuda)");
  // "cuda" means the first device (graphs and pools compare devices with their
  // index), or this rank's in a multi-process run.
  if (device.is_cuda() && device.index() < 0) {
    const runtime::distributed::RankInfo rank = runtime::distributed::rank_info_from_environment();
    const int64_t gpus = static_cast<int64_t>(at::getNumGPUs());
    if (rank.launched() && rank.local_rank >= gpus) {
      throw UsageError(fmt::format("rank {} (local rank {}) has no GPU of its own: this machine has {}; packtrain "
                                   "runs one GPU per process (start at most {} processes per machine, or use --device "
                                   "cpu)",
                                   rank.rank, rank.local_rank, gpus, gpus));
    }
    device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(rank.launched() ? rank.local_rank : 0));
  }
  return device;
}

std::unique_ptr<runtime::distributed::ProcessGroup> join_if_launched(c10::Device device) {
  const runtime::distributed::RankInfo rank = runtime::distributed::rank_info_from_environment();
  if (!rank.launched()) return nullptr;
  return runtime::distributed::ProcessGroup::join(rank, runtime::distributed::collective_timeout(), device);
}

// Each field once: the JSON keys are the member names (from_json throws on a missing key).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DataArgs, data, features, target, delimiter, header, split, train_index, val_index,
                                   test_index, val_fraction, test_fraction, split_seed)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RunDescription, data, feature_names, target_name)

std::string to_json(const RunDescription& run) { return nlohmann::json(run).dump(); }

RunDescription run_description_from_json(const std::string& text) {
  const nlohmann::json root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object() || !root.contains("data")) {
    throw runtime::DataError("checkpoint: no description of its data (was it written by `packtrain train`?)");
  }
  try {
    return root.get<RunDescription>();
  } catch (const nlohmann::json::exception& e) {
    throw runtime::DataError(std::string("checkpoint: bad data description: ") + e.what());
  }
}

void export_members(const std::string& path, const runtime::EnsembleTrainer& trainer,
                    const std::vector<std::string>& feature_names, const std::vector<int64_t>& members) {
  runtime::ExportExtras extras;
  extras.x_mean = trainer.x_scale().mean;
  extras.x_std = trainer.x_scale().std;
  extras.y_mean = trainer.y_scale().mean;
  extras.y_std = trainer.y_scale().std;
  extras.head = std::string(runtime::to_string(trainer.options().head()));
  extras.min_variance = trainer.options().min_variance();
  extras.feature_names = feature_names;
  extras.classes = trainer.classes();
  for (int64_t k : members) {
    if (k < 0 || k >= trainer.options().members()) {
      throw UsageError(fmt::format("member {} does not exist (the pack has members 0..{})", k,
                                   trainer.options().members() - 1));
    }
  }
  runtime::export_for_pytorch(path, trainer.model(), members, extras);
}

runtime::TableFormat table_format(const DataArgs& a) {
  runtime::TableFormat format;
  if (a.delimiter == "auto") format.delimiter = 0;
  else if (a.delimiter == "comma" || a.delimiter == ",") format.delimiter = ',';
  else if (a.delimiter == "tab" || a.delimiter == "\\t") format.delimiter = '\t';
  else if (a.delimiter == "semicolon" || a.delimiter == ";") format.delimiter = ';';
  else if (a.delimiter == "space" || a.delimiter == "whitespace") format.delimiter = ' ';
  else throw UsageError("unknown delimiter '" + a.delimiter + "' (expected auto, comma, tab, semicolon or space)");
  if (a.header == "auto") format.header = runtime::HeaderMode::kDetect;
  else if (a.header == "yes") format.header = runtime::HeaderMode::kYes;
  else if (a.header == "no") format.header = runtime::HeaderMode::kNo;
  else throw UsageError("unknown header mode '" + a.header + "' (expected auto, yes or no)");
  return format;
}

runtime::DatasetSpec dataset_spec(const DataArgs& a) {
  runtime::DatasetSpec spec;
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

namespace {
void check_fraction(double f, const char* name) {
  if (!(f >= 0 && f < 1)) throw UsageError(fmt::format("{} must be in [0, 1), got {}", name, f));
}
}  // namespace

SplitData load_split_data(const DataArgs& a) {
  check_fraction(a.val_fraction, "--val-fraction");
  check_fraction(a.test_fraction, "--test-fraction");
  SplitData out;
  out.all = runtime::load_dataset(dataset_spec(a));
  const int64_t rows = out.all.features.size(0);
  std::string how;
  if (!a.train_index.empty() || !a.test_index.empty()) {
    if (a.train_index.empty() || a.test_index.empty()) {
      throw UsageError("--train-index and --test-index go together (--val-index is optional)");
    }
    out.split.train = runtime::read_index_file(a.train_index, rows);
    out.split.test = runtime::read_index_file(a.test_index, rows);
    how = "index files";
  } else if (out.all.uci_splits) {
    out.split = runtime::uci_split(out.all, a.split);
    how = fmt::format("split {}", a.split);
  } else {
    out.split = runtime::split_by_fractions(rows, a.val_fraction, a.test_fraction, a.split_seed);
    how = fmt::format("random split (seed {})", a.split_seed);
  }
  if (!a.val_index.empty()) {
    out.split.validation = runtime::read_index_file(a.val_index, rows);
  } else if (out.split.validation.empty() && a.val_fraction > 0) {
    runtime::carve_validation(out.split, a.val_fraction, a.split_seed);
  }
  runtime::check_split(out.split, rows);
  out.description = fmt::format("{} {} ({} train / {} validation / {} test rows, {} features)", out.all.name, how,
                                out.split.train.size(), out.split.validation.size(), out.split.test.size(),
                                out.all.features.size(1));
  return out;
}

}  // namespace packtrain::cli
