#include "packtrain/runtime/cli/output_paths.h"

#include "packtrain/runtime/data/dataset.h"
#include "packtrain/runtime/data/run_data.h"
#include "packtrain/runtime/io/checkpoint_file.h"

#include "packtrain/runtime/cli/cli_common.h"

#include <fmt/format.h>

#include <sys/stat.h>
#include <unistd.h>
#include <climits>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

namespace packtrain::cli {

namespace {
namespace fs = std::filesystem;

bool none(const NamedPath& p) { return p.path.empty() || p.path == "-"; }

std::optional<struct stat> stat_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return st;
}

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

// ".tmp.<pid>.XXXXXX": what write_file_atomically appends to the name.
constexpr size_t kTemporarySuffix = 5 + 10 + 7;

std::vector<NamedPath>& read_files() {
  static std::vector<NamedPath> files;
  return files;
}

bool written_in_place(const NamedPath& p) {
  return runtime::output_target(p.path).kind == runtime::OutputKind::kStream;
}
}  // namespace

void add_read_file(NamedPath file) { read_files().push_back(std::move(file)); }

void check_outputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& command_inputs) {
  std::vector<NamedPath> inputs = command_inputs;
  inputs.insert(inputs.end(), read_files().begin(), read_files().end());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& out = outputs[i];
    if (none(out)) continue;
    const std::string where = out.flag + " " + out.path;
    const fs::path path(out.path);
    const std::optional<struct stat> existing = stat_of(out.path);
    if (existing && S_ISDIR(existing->st_mode)) throw UsageError(where + ": is a directory; name a file");
    const runtime::OutputTarget target = runtime::output_target(out.path);
    if (target.kind == runtime::OutputKind::kRefused) {
      throw UsageError(fmt::format("{}: is a {}; name a regular file, a character device such as /dev/null, or a FIFO",
                                   where, target.type));
    }
    if (target.kind == runtime::OutputKind::kStream) {
      if (out.writes_beside) {
        throw UsageError(
            fmt::format("{}: is a {}, but this checkpoint is several files named after it; name a "
                        "regular file (or leave {} out to keep none)",
                        where, target.type, out.flag));
      }
      continue;  // written in place, never replaced: no input is lost, no directory entry made
    }
    const std::string name = path.filename().string();
    if (name.empty()) throw UsageError(where + ": names a directory; name a file");
    if (name.size() + kTemporarySuffix > NAME_MAX) {
      throw UsageError(fmt::format("{}: the file name is {} bytes; at most {} fit beside the temporary a save uses",
                                   where, name.size(), NAME_MAX - kTemporarySuffix));
    }
    const std::string dir = path.has_parent_path() ? path.parent_path().string() : ".";
    const std::optional<struct stat> d = stat_of(dir);
    if (!d) throw UsageError(where + ": the directory " + dir + " does not exist");
    if (!S_ISDIR(d->st_mode)) throw UsageError(where + ": " + dir + " is not a directory");
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      throw UsageError(where + ": cannot write in " + dir + " (" + std::strerror(errno) + ")");
    }
    if (!existing) continue;
    for (const NamedPath& in : inputs) {
      if (none(in)) continue;
      if (const auto s = stat_of(in.path); s && same_file(*s, *existing)) {
        // (the positional "input" is named once: "the input in.csv", not "the input input in.csv")
        throw UsageError(fmt::format("{} is the same file as the input {}{}: refusing to overwrite an input", where,
                                     in.flag == "input" ? "" : in.flag + " ", in.path));
      }
    }
  }
  // Two outputs naming one file (existing or not): the later write would replace the earlier.
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (none(outputs[i]) || none(outputs[j])) continue;
      if (written_in_place(outputs[i]) && written_in_place(outputs[j])) continue;  // /dev/null twice
      std::error_code ec1, ec2;
      if (fs::weakly_canonical(outputs[i].path, ec1) == fs::weakly_canonical(outputs[j].path, ec2) && !ec1 && !ec2) {
        throw UsageError(fmt::format("{} {} and {} {} are the same file", outputs[i].flag, outputs[i].path,
                                     outputs[j].flag, outputs[j].path));
      }
    }
  }
}

std::vector<NamedPath> data_inputs(const runtime::DataArgs& data) {
  std::vector<NamedPath> inputs;
  // A directory's files one by one: an output inside the folder must not replace them.
  for (const fs::path& file : runtime::dataset_files(data.data)) inputs.push_back({"--data", file.string()});
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--train-index", data.train_index},
                                   {"--val-index", data.val_index},
                                   {"--test-index", data.test_index}}) {
    inputs.push_back({flag, path});
  }
  return inputs;
}

}  // namespace packtrain::cli
