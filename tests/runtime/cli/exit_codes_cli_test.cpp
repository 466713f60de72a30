// The exit-status table of runtime/cli/main.cpp, one case per family of user error:
// each exits with status exactly 2 and ends with one line "packtrain: error: ...",
// never "internal error" (status 1 is for a bug, a failed write or a failed peer).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::StartsWith;

// The last line of `text` (the error line comes after whatever the run printed).
std::string last_line(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') + 1);  // npos + 1 == 0: a text of one line
}

struct Family {
  std::string name;
  std::string command;  // a shell line running packtrain
  std::string starts;   // how its last line starts
};

TEST_F(Cli, EachUserErrorFamilyExitsTwoWithItsMessage) {
  write_file(path("unknown_key.toml"), "nosuchkey = 3\n");
  const std::string cpu = " --epochs 1 --device cpu --checkpoint " + path("never.ckpt");
  const std::vector<Family> families = {
      // CLI11 rejects a flag before any command runs.
      {"flag", with_env({}, "train --no-such-flag"),
       "packtrain: error: The following argument was not expected: --no-such-flag"},
      {"config key", with_env({}, "train --config " + path("unknown_key.toml")),
       "packtrain: error: " + path("unknown_key.toml") + ":1: INI was not able to parse train.nosuchkey"},
      // runtime::DataError: the data cannot be read.
      {"DataError", with_env({}, "train --data " + path("nope.csv") + cpu),
       "packtrain: error: " + path("nope.csv") + ": no such file or directory, nor a bundled data set"},
      // cli::UsageError: an argument the parser could not check.
      {"UsageError", with_env({{"PACKTRAIN_THREADS", "abc"}}, "train" + cpu),
       "packtrain: error: PACKTRAIN_THREADS='abc': must be an integer between 0 and "},
      // packtrain::UserError from the library (was "internal error", status 1).
      {"UserError", with_env({}, "active-learn --members 1 --rounds 2 --epochs 1 --device cpu"),
       "packtrain: error: active learning: an ensemble's disagreement needs at least 2 members per ensemble, got 1"},
      {"UserError (patience)", with_env({}, "active-learn --patience 5 --rounds 2 --epochs 1 --device cpu"),
       "packtrain: error: active learning: there is no validation data to stop early on: patience must be 0, got 5"},
  };
  for (const Family& f : families) {
    const Result r = run_command(f.command);
    EXPECT_EQ(r.status, 2) << f.name << ": " << r.out;
    EXPECT_THAT(last_line(r.out), StartsWith(f.starts)) << f.name << ": " << r.out;
    EXPECT_THAT(r.out, ::testing::Not(::testing::HasSubstr("internal error"))) << f.name;
  }
  EXPECT_FALSE(fs::exists(path("never.ckpt"))) << "no run got as far as writing";
}

}  // namespace
}  // namespace packtrain::cli_testing
