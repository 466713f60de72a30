// Output folders (runtime/io/output_folder.h): what may be replaced is checked before
// any work, a planted symlink is never written through, and the folder is replaced as
// a unit — a write that fails leaves the earlier folder as it was and no staging
// folder behind.
#include "packtrain/runtime/io/output_folder.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "tests/support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

const std::vector<std::string> kNames{"config.json", "model.safetensors", "tokenizer.json"};

std::string text_of(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// The folder's entries, sorted (staging folders included: none may remain).
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(OutputFolder, RefusesWhatIsNotAFolderItMayReplace) {
  const packtrain::testing::ScopedTempDir dir("output_folder");
  const fs::path file = dir.path() / "file", fifo = dir.path() / "fifo", other = dir.path() / "other";
  write_text(file, "x");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_directory(other);
  write_text(other / "notes.txt", "the user's own");
  EXPECT_THAT([&] { check_output_folder("", kNames, {}); }, ThrowsMessage<UserError>(HasSubstr("empty")));
  EXPECT_THAT([&] { check_output_folder(file, kNames, {}); },
              ThrowsMessage<UserError>(HasSubstr("is a regular file: name a folder")));
  EXPECT_THAT([&] { check_output_folder(fifo, kNames, {}); }, ThrowsMessage<UserError>(HasSubstr("is a FIFO")));
  EXPECT_THAT([&] { check_output_folder(other, kNames, {}); },
              ThrowsMessage<UserError>(HasSubstr("holds 'notes.txt', which an export does not write")));
  fs::remove(other / "notes.txt");
  fs::create_directory(other / "model.safetensors");
  EXPECT_THAT([&] { check_output_folder(other, kNames, {}); },
              ThrowsMessage<UserError>(HasSubstr("'model.safetensors' is a directory")));
  // New folders and earlier exports pass.
  EXPECT_NO_THROW(check_output_folder(dir.path() / "new" / "deeper", kNames, {}));
  fs::remove(other / "model.safetensors");
  write_text(other / "config.json", "{}");
  EXPECT_NO_THROW(check_output_folder(other, kNames, {}));
}

TEST(OutputFolder, RefusesTheFolderOfAnInput) {
  const packtrain::testing::ScopedTempDir dir("output_folder");
  const fs::path trunk = dir.path() / "trunk";
  fs::create_directory(trunk);
  write_text(trunk / "config.json", "{}");
  write_text(trunk / "model.safetensors", "weights");
  fs::create_directory_symlink(trunk, dir.path() / "alias");
  for (const fs::path& out : {trunk, dir.path() / "alias", dir.path() / "trunk" / "."}) {
    EXPECT_THAT(
        [&] {
          check_output_folder(out, kNames, {trunk / "config.json", trunk / "model.safetensors"});
        },
        ThrowsMessage<UserError>(HasSubstr("holds the input")))
        << out;
  }
}

TEST(OutputFolder, ReplacesTheFolderAsAUnitAndNeverWritesThroughASymlink) {
  const packtrain::testing::ScopedTempDir dir("output_folder");
  const fs::path out = dir.path() / "export", victim = dir.path() / "victim";
  write_text(victim, "precious");
  fs::create_directory(out);
  write_text(out / "config.json", "old config");
  write_text(out / "model.safetensors", "old weights");
  fs::create_symlink(victim, out / "tokenizer.json");  // planted
  check_output_folder(out, kNames, {});
  write_folder_atomically(out, [](const fs::path& staging) {
    write_file_atomically(staging / "model.safetensors", "new weights");
    write_file_atomically(staging / "tokenizer.json", "new tokenizer");
    write_file_atomically(staging / "config.json", "new config");
  });
  EXPECT_EQ(text_of(victim), "precious");
  EXPECT_FALSE(fs::is_symlink(out / "tokenizer.json"));
  EXPECT_EQ(text_of(out / "config.json"), "new config");
  EXPECT_EQ(text_of(out / "model.safetensors"), "new weights");
  EXPECT_EQ(text_of(out / "tokenizer.json"), "new tokenizer");
  EXPECT_EQ(entries(dir.path()), (std::vector<std::string>{"export", "victim"}));  // no staging folder left
}

TEST(OutputFolder, AFailedWriteLeavesTheEarlierFolderAsItWas) {
  const packtrain::testing::ScopedTempDir dir("output_folder");
  const fs::path out = dir.path() / "export";
  fs::create_directory(out);
  write_text(out / "config.json", "old config");
  write_text(out / "model.safetensors", "old weights");
  EXPECT_THROW(write_folder_atomically(out,
                                       [](const fs::path& staging) {
                                         write_file_atomically(staging / "model.safetensors", "new weights");
                                         throw std::runtime_error("killed half way");
                                       }),
               std::runtime_error);
  EXPECT_EQ(text_of(out / "config.json"), "old config");
  EXPECT_EQ(text_of(out / "model.safetensors"), "old weights");
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"export"});
  // A new folder, parents created.
  write_folder_atomically(dir.path() / "a" / "b",
                          [](const fs::path& staging) { write_file_atomically(staging / "config.json", "fresh"); });
  EXPECT_EQ(text_of(dir.path() / "a" / "b" / "config.json"), "fresh");
}

// What an export killed before its rename leaves (a staging folder of a process that
// no longer runs) is removed by the next export to the same folder.
TEST(OutputFolder, AStagingFolderOfADeadProcessIsRemoved) {
  const packtrain::testing::ScopedTempDir dir("output_folder");
  const fs::path out = dir.path() / "export";
  const fs::path stale = dir.path() / "export.tmp.999999999.abcdef";  // no such pid
  fs::create_directory(stale);
  write_text(stale / "model.safetensors", "half");
  write_folder_atomically(out, [](const fs::path& staging) { write_file_atomically(staging / "config.json", "x"); });
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"export"});
}

}  // namespace
}  // namespace packtrain::runtime
