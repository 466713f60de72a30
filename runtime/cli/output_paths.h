// Outputs checked before any work: a run must not train for an hour and then find
// it cannot write its checkpoint, nor write over one of its own inputs.
#pragma once

#include <string>
#include <vector>

namespace packtrain::runtime {
struct DataArgs;
}

namespace packtrain::cli {

// A file a command reads or writes, with the flag that named it (for messages).
struct NamedPath {
  std::string flag;
  std::string path;  // "" or "-": none (stdout)
  // An output that also writes files named after it (a member-parallel manifest's
  // shards, a pipeline checkpoint's stage files): it must name a regular file.
  bool writes_beside = false;
};

// Throws UsageError (exit 2) naming the flag and path unless each output can be
// written where it is named (runtime::output_target). A regular file or a new
// name: its directory exists, is a directory and is writable; its name leaves room
// for the temporary a save uses (NAME_MAX); an existing unrelated file is replaced
// atomically when the command writes. A character device (/dev/null) or a FIFO:
// written in place, never replaced (so no input is lost), and several outputs may
// name it; not for an output that writes files beside itself. A directory, block
// device or socket: refused. No other output may be the same file (device and
// inode, so links and other spellings count) as any input — the command's own and
// every file registered with add_read_file — nor as another output.
void check_outputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs);

// A file this process reads whatever the command (the --config file): an input
// for every later check_outputs.
void add_read_file(NamedPath file);

// The files a run's data arguments read (--data — a directory's every data file,
// runtime::dataset_files — and the index files), as inputs for check_outputs.
std::vector<NamedPath> data_inputs(const runtime::DataArgs& data);

}  // namespace packtrain::cli
