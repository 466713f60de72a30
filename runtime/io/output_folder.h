// Output folders — a Hugging Face checkpoint folder that `multitask export` and
// save_pretrained write — as careful as output files (checkpoint_file.h): checked
// before any work, never written through a planted symlink, and replaced as a unit,
// so a crash leaves the earlier folder or the new one, never a mix (a config.json of
// one model beside another's weights).
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace packtrain::runtime {

// UserError (exit 2) unless `dir` can be written as a folder of the files `names`:
// a non-empty path; nothing there, or a directory (after symlinks) whose entries are
// all among `names` and none a directory (an earlier export: a folder holding anything
// else — the user's own files, a checkpoint — is not replaced); not `inputs`' own
// folder (the trunk's) nor any input file (device and inode: links count).
void check_output_folder(const std::filesystem::path& dir, const std::vector<std::string>& names,
                         const std::vector<std::filesystem::path>& inputs);

// Writes the folder `dir` as a unit: `write(staging)` fills a new folder beside it
// (`<dir>.tmp.<pid>.<random>`, created exclusively; what a killed export left there
// is removed first), which is synced and then takes `dir`'s place in one rename
// (renameat2's RENAME_EXCHANGE where `dir` exists; the earlier folder is then
// removed). Parent folders are created. On failure the staging folder is removed and
// `dir` is as it was; WriteError for a failed write.
void write_folder_atomically(const std::filesystem::path& dir,
                             const std::function<void(const std::filesystem::path& staging)>& write);

}  // namespace packtrain::runtime
