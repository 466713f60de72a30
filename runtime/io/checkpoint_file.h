// Checkpoint files: crash-safe (write a temporary, fsync, rename) and checksummed,
// so a save interrupted at any point leaves the previous checkpoint readable, and a
// damaged file is reported as such instead of loading as garbage.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

// Declared only, to keep ivalue.h out of this header; callers that build or read
// payloads include <ATen/core/ivalue.h>.
namespace c10 {
struct IValue;
}  // namespace c10

namespace packtrain::runtime {

// A file that could not be written (a full disk, a directory made read-only during
// the run): the environment failed, not the input and not the program.
class WriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What an output's path names decides how it is written (the policy docs/errors.md
// states). Symbolic links are followed.
enum class OutputKind {
  kFile,     // nothing, or a regular file: a temporary beside it, renamed over it
  kStream,   // a character device (/dev/null, a terminal) or a FIFO: written in place,
             // never replaced (no temporary, no rename, no truncation)
  kRefused,  // a directory, a block device, a socket: never written
};
struct OutputTarget {
  OutputKind kind = OutputKind::kFile;
  std::string type;  // for messages: "regular file", "character device", "FIFO", "socket", ...
};
OutputTarget output_target(const std::filesystem::path& path);

// Writes `bytes` to `path`. A regular file (or none) is written atomically: into a
// temporary `path` + ".tmp.<pid>.<random>" in the same directory, created
// exclusively (a symlink or file planted at a predictable name is never written
// through), fsync, close, rename over `path`, then fsync the directory. A crash at
// any point leaves either the old file or the new one at `path`, never a torn one;
// the temporaries of crashed saves are removed by the next save to the same path.
// A character device or FIFO (OutputKind::kStream) is opened for writing and
// written in place, as a shell's `>` would (a FIFO waits for its reader; a reader
// that closes early is a WriteError, not SIGPIPE). Anything else is refused. On
// failure throws WriteError naming `path` and the errno text, and removes the
// temporary.
// `crash_after_bytes` is a test hook (-1 = off): after writing that many bytes the
// process ends with std::_Exit(70), as a crash mid-save would.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes, int64_t crash_after_bytes = -1);

// Removes `<target>.tmp.<pid>.<suffix>` entries — files, or with `folders` the
// folders write_folder_atomically stages — whose process is gone (kill(pid, 0) says
// ESRCH): what a save killed before its rename leaves behind. Best effort.
void remove_stale_temporaries(const std::filesystem::path& target, bool folders = false);

// Removes `path` and, for a folder, everything in it, never following a symbolic
// link (a link is removed, not what it names). Best effort; true when `path` is gone.
// (Not std::filesystem::remove_all: libtorch exports a broken copy of it that
// interposes on libstdc++'s.)
bool remove_tree(const std::filesystem::path& path);

// fsync of the directory holding `path`: a rename is durable only once the directory
// entry is on disk. WriteError naming `path` on failure.
void sync_directory_of(const std::filesystem::path& path);

// Saves `payload` (any IValue torch::pickle_save accepts: a GenericDict of strings,
// ints, doubles, tensors, lists, nested dicts) atomically in packtrain's container:
//   8 bytes   magic "PKTRNCK1"
//   uint32    format version (1), little-endian
//   uint64    payload length M, little-endian
//   uint64    FNV-1a 64 checksum of the payload, little-endian
//   M bytes   payload = torch::pickle_save(payload)
void save_checkpoint(const std::filesystem::path& path, const c10::IValue& payload, int64_t crash_after_bytes = -1);

// Loads a checkpoint back, tensors on CPU. Throws packtrain::UserError, one line naming the
// file, when it is missing, not a packtrain checkpoint (bad magic), of an
// unsupported version, truncated, corrupted (checksum mismatch or trailing bytes),
// or its payload cannot be decoded.
c10::IValue load_checkpoint(const std::filesystem::path& path);

// The payload checksum in a checkpoint's header (the header alone is read and
// checked): what a member-parallel manifest records of each shard it commits.
uint64_t checkpoint_checksum(const std::filesystem::path& path);

}  // namespace packtrain::runtime
