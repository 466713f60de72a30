// Output folders written as a unit (runtime/io/output_folder.h).
#include "packtrain/runtime/io/output_folder.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/io/checkpoint_file.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <system_error>

namespace packtrain::runtime {

namespace {

namespace fs = std::filesystem;

const char* kind_of(const struct stat& st) {
  return S_ISREG(st.st_mode)    ? "regular file"
         : S_ISFIFO(st.st_mode) ? "FIFO"
         : S_ISCHR(st.st_mode)  ? "character device"
         : S_ISBLK(st.st_mode)  ? "block device"
         : S_ISSOCK(st.st_mode) ? "socket"
                                : "special file";
}

bool same_inode(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

[[noreturn]] void write_failed(const fs::path& dir, const std::string& step, int error) {
  throw WriteError("cannot write '" + dir.string() + "': " + step + ": " + std::strerror(error));
}

}  // namespace

void check_output_folder(const fs::path& dir, const std::vector<std::string>& names,
                         const std::vector<fs::path>& inputs) {
  if (dir.empty()) throw UserError("the output folder is '' (empty): name a folder");
  const std::string where = "output folder '" + dir.string() + "'";
  struct stat st {};
  const bool exists = ::stat(dir.c_str(), &st) == 0;
  if (!exists && errno != ENOENT) {
    throw UserError(where + ": cannot be used (" + std::strerror(errno) + ")");
  }
  if (exists && !S_ISDIR(st.st_mode)) {
    throw UserError(where + " is a " + kind_of(st) + ": name a folder (a new one, or an earlier export)");
  }
  // No input may be the folder or lie in it: the trunk's own folder is never replaced.
  for (const fs::path& input : inputs) {
    struct stat in {};
    if (exists && ::stat(input.c_str(), &in) == 0) {
      struct stat parent {};
      const fs::path input_dir = input.has_parent_path() ? input.parent_path() : fs::path(".");
      if (same_inode(in, st) || (::stat(input_dir.c_str(), &parent) == 0 && same_inode(parent, st))) {
        throw UserError(where + " holds the input '" + input.string() +
                        "' (the trunk's own folder, or the checkpoint's): name another folder");
      }
    }
  }
  if (!exists) return;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      throw UserError(where + " holds '" + name +
                      "', which an export does not write; the folder is replaced as a whole, so name a new "
                      "folder or an earlier export's");
    }
    if (it->is_directory(ec) && !it->is_symlink(ec)) {
      throw UserError(where + ": '" + name + "' is a directory, where the export writes a file");
    }
  }
  if (ec) throw UserError(where + ": cannot list it (" + ec.message() + ")");
}

void write_folder_atomically(const fs::path& dir, const std::function<void(const fs::path& staging)>& write) {
  const fs::path target = dir.filename().empty() ? dir.parent_path() : dir;  // "out/" names "out"
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) write_failed(target, "create the folder '" + parent.string() + "'", ec.value());
  remove_stale_temporaries(target, /*folders=*/true);
  std::string name = target.string() + ".tmp." + std::to_string(::getpid()) + ".XXXXXX";
  if (::mkdtemp(name.data()) == nullptr) write_failed(target, "create a staging folder '" + name + "'", errno);
  const fs::path staging = name;
  ::chmod(staging.c_str(), 0755);  // mkdtemp makes 0700; a checkpoint folder is an ordinary one
  try {
    write(staging);
    // Each file was synced as it was written; the staging folder's entries too.
    sync_directory_of(staging / "x");
    struct stat st {};
    if (::lstat(target.c_str(), &st) == 0) {
      // Swap the finished folder in; the earlier one now sits at the staging name.
      if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
        if (errno != EINVAL && errno != ENOSYS) write_failed(target, "swap '" + staging.string() + "' in", errno);
        // A file system without the exchange: the earlier folder aside, then the new one in.
        const fs::path aside = staging.string() + ".old";
        if (::rename(target.c_str(), aside.c_str()) != 0) write_failed(target, "move it aside", errno);
        if (::rename(staging.c_str(), target.c_str()) != 0) {
          const int error = errno;
          ::rename(aside.c_str(), target.c_str());
          write_failed(target, "rename '" + staging.string() + "' to it", error);
        }
        remove_tree(aside);
      } else {
        remove_tree(staging);  // the earlier folder
      }
    } else if (::rename(staging.c_str(), target.c_str()) != 0) {
      write_failed(target, "rename '" + staging.string() + "' to it", errno);
    }
    sync_directory_of(target);
  } catch (...) {
    remove_tree(staging);
    throw;
  }
}

}  // namespace packtrain::runtime
