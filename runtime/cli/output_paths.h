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
};

// Throws UsageError (exit 2) naming the flag and path unless each output can be
// written where it is named: not a directory; its directory exists, is a
// directory and is writable; its name leaves room for the temporary a save uses
// (NAME_MAX); it is not the same file (device and inode, so links and other spellings
// count) as any input or as another output. An existing unrelated file is allowed:
// it is replaced atomically when the command writes (the policy README states).
void check_outputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs);

// The files a run's data arguments name (--data and the index files), as inputs
// for check_outputs.
std::vector<NamedPath> data_inputs(const runtime::DataArgs& data);

}  // namespace packtrain::cli
