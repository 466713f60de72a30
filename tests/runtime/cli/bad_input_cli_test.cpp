// Bad input end to end: exit status 2 with a one-line message naming the file (and
// line:column) for each kind of bad data, flag, checkpoint or multi-task input, and
// outputs left untouched.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

// --- bad input: exit 2, one line naming the file (and line:column), outputs untouched

struct BadCase {
  std::string name;
  std::string file_text;  // written to bad.csv when not empty
  std::string args;       // {f} = that file's path
  std::string expect;     // in the message
};

TEST_F(Cli, BadInputExitsTwoWithOneLineNamingTheFile) {
  const std::string good = "a,b,y\n1,2,3\n4,5,6\n7,8,9\n1,1,1\n2,2,2\n";
  const std::vector<BadCase> cases = {
      {"missing file", "", "train --data " + path("nope.csv"), "nope.csv"},
      {"empty file", " ", "train --data {f}", "bad.csv"},
      {"ragged row", "a,b,y\n1,2,3\n4,5\n6,7,8\n", "train --data {f}", "bad.csv:3"},
      {"non-numeric cell", "a,b,y\n1,2,3\n4,x5,6\n", "train --data {f}", "bad.csv:3:2"},
      {"NaN", "a,b,y\n1,2,3\n4,nan,6\n", "train --data {f}", "bad.csv:3:2"},
      {"Inf", "a,b,y\n1,2,3\n4,5,inf\n", "train --data {f}", "bad.csv:3:3"},
      {"unknown column", good, "train --data {f} --target zz", "unknown column 'zz'"},
      {"members <= 0", "", "train --members 0", "--members"},
      {"batch <= 0", good, "train --data {f} --batch 0", "--batch"},  // a larger one than the rows: small_data_cli_test
      {"unknown data set", "", "train --data no_such_set", "no_such_set"},
      {"bad split", "", "train --split 99", "split 99"},
      {"unknown activation", "", "train --activation swish", "swish"},
  };
  for (const BadCase& c : cases) {
    std::string args = c.args;
    if (!c.file_text.empty()) {
      write_file(path("bad.csv"), c.file_text);
      args.replace(args.find("{f}"), 3, path("bad.csv"));
    }
    const Result r = run(args + " --epochs 1 --device cpu --checkpoint " + path("never.ckpt"));
    EXPECT_EQ(r.status, 2) << c.name << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(c.expect)) << c.name;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << c.name << ": one line: " << r.out;
    EXPECT_FALSE(fs::exists(path("never.ckpt"))) << c.name << ": nothing written";
  }
}

TEST_F(Cli, BadCheckpointsExitTwoAndLeaveOutputsUntouched) {
  const std::string ckpt = path("ok.ckpt");
  ASSERT_EQ(run(std::string("train ") + kSmall + " --quiet --checkpoint " + ckpt).status, 0);
  const std::string bytes = read_file(ckpt);
  write_file(path("truncated.ckpt"), bytes.substr(0, bytes.size() / 2));
  std::string flipped = bytes;
  flipped[flipped.size() - 100] ^= 0x5a;
  write_file(path("corrupted.ckpt"), flipped);
  write_file(path("out.csv"), "precious\n");
  const std::string input = concrete_csv("in.csv", 5, false);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"predict " + path("truncated.ckpt") + " " + input + " -o " + path("out.csv"), "truncated"},
      {"predict " + path("corrupted.ckpt") + " " + input + " -o " + path("out.csv"), "checksum"},
      {"predict " + path("missing.ckpt") + " " + input + " -o " + path("out.csv"), "missing.ckpt"},
      // another model shape: 9 columns where the model takes 8 features
      {"predict " + ckpt + " " + concrete_csv("nine.csv", 5, true) + " --header no -o " + path("out.csv"),
       "the model takes 8 feature columns"},
      {"resume " + path("truncated.ckpt") + " --device cpu", "truncated"},
      {"evaluate " + path("corrupted.ckpt"), "checksum"},
  };
  for (const auto& [args, expect] : cases) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(expect)) << args;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << ": " << r.out;
  }
  EXPECT_EQ(read_file(path("out.csv")), "precious\n") << "a failed predict leaves the output alone";
  EXPECT_EQ(read_file(ckpt), bytes) << "and the checkpoint";
}

// The reported attack: a symlink planted at the name a trace or checkpoint save
// would use for its temporary gets its target overwritten. Every save creates its
// temporary exclusively under an unpredictable name: the planted links are left
// alone and the victim keeps its content.
TEST_F(Cli, SymlinksAtTemporaryNamesAreNeverWrittenThrough) {
  const fs::path victim = dir() / "victim.txt";
  { std::ofstream(victim) << "precious"; }
  for (const std::string name : {"t.json.tmp", "run.ckpt.tmp"}) fs::create_symlink(victim, dir() / name);
  const Result r = run("train --members 4 --epochs 1 --hidden 32 --device cpu --quiet --trace " + path("t.json") +
                       " --checkpoint " + path("run.ckpt"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_file(victim), "precious");
  EXPECT_TRUE(nlohmann::json::parse(read_file(dir() / "t.json")).contains("traceEvents"));
  EXPECT_TRUE(fs::is_symlink(dir() / "t.json.tmp"));
  const Result p = run("profile --members 4 --steps 5 --trace " + path("t.json"));
  ASSERT_EQ(p.status, 0) << p.out;
  EXPECT_EQ(read_file(victim), "precious");
}

// Inputs that would never end or could block (a device, a FIFO) are refused before
// a byte is read, and so is a line too long to be a row; each under `timeout`, so
// code that reads them anyway fails the test instead of hanging it.
TEST_F(Cli, NonRegularOrUnboundedInputsAreRefusedBeforeReading) {
  const std::string fifo = path("fifo");
  ASSERT_EQ(run_command("mkfifo " + fifo).status, 0);
  // Under a 4 GB address-space limit too: code that read /dev/zero would fail at
  // once instead of filling the machine's memory (it grew to 16.7 GB in 60 s).
  const std::string bounded = "ulimit -v 4000000; timeout 60 " + binary() + " ";
  const struct {
    std::string args, says;
  } cases[] = {
      {"train --epochs 1 --device cpu --data /dev/zero", "/dev/zero: is a device, not a regular file"},
      {"train --epochs 1 --device cpu --config /dev/zero", "/dev/zero: is a device, not a regular file; a config file"},
      {"train --epochs 1 --device cpu --data " + fifo, "is a FIFO, not a regular file"},
      {"evaluate " + fifo, "is a FIFO, not a regular file"},
      {"multitask train --epochs 1 --train /dev/zero", "/dev/zero: is a device"},
  };
  for (const auto& c : cases) {
    const Result r = run_command(bounded + c.args + " 2>&1");
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(c.says)) << c.args;
  }
  // One line of 17 MiB: refused naming the file and line, not parsed.
  {
    std::ofstream out(path("long.csv"));
    out << "a,b\n" << std::string(17u << 20, '1') << ",1\n";
  }
  const Result r = run_command(bounded + "train --epochs 1 --device cpu --data " + path("long.csv") + " 2>&1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("long.csv:2: a line of"));
}

// Peak memory grows with the table, by a bounded factor (a 200 MB one-line file
// peaked at 12.1 GB, 60x its size). Two runs, 2,000 and 200,000 rows of 10 cells:
// the larger one's extra peak resident memory over the smaller one's stays below
// 10x the extra bytes of file (measured 7.2x here and 6.0x for a 36 MB file on this
// project's 2-core machine: the text, each cell's string, the float64 tensors and
// the split copies). The rows themselves were proportional before; what made a
// file 60x was one huge line, now refused (NonRegularOrUnboundedInputs...).
TEST_F(Cli, PeakMemoryOfATableRunIsProportionalToTheFile) {
  const auto table = [&](const std::string& name, int rows) {
    std::ofstream out(path(name));
    out << "c0,c1,c2,c3,c4,c5,c6,c7,c8,y\n";
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < 10; ++c) out << (c ? "," : "") << 0.5 + 1e-6 * ((r * 7919 + c * 104729) % 999983);
      out << "\n";
    }
    return path(name);
  };
  const auto peak_kib = [&](const std::string& data) {
    const pid_t pid = start_packtrain({"train", "--data", data, "--members", "2", "--epochs", "1", "--hidden", "8",
                                       "--batch", "1024", "--device", "cpu", "--quiet"},
                                      path("err.txt"));
    int64_t kib = 0;
    EXPECT_EQ(exit_status(pid, &kib), 0) << read_file(path("err.txt"));
    return kib;
  };
  const std::string small = table("small.csv", 2000), large = table("large.csv", 200000);
  const double extra_bytes = static_cast<double>(fs::file_size(large) - fs::file_size(small));
  const double extra_peak = static_cast<double>(peak_kib(large) - peak_kib(small)) * 1024;
  EXPECT_GT(extra_bytes, 15e6);
  EXPECT_LT(extra_peak, 10 * extra_bytes) << "peak grew " << extra_peak / extra_bytes << "x the file";
  std::printf("peak resident memory grew %.1fx the extra file bytes (%.1f MB of file)\n", extra_peak / extra_bytes,
              extra_bytes / 1e6);
}

// A rate that passes a sign check but not a finiteness one made every member
// diverge and ended in an internal error.
TEST_F(Cli, NonFiniteRatesAreRefused) {
  for (const std::string option : {"--lr inf", "--lr nan", "--weight-decay inf"}) {
    const Result r = run("train --epochs 1 --device cpu " + option);
    EXPECT_EQ(r.status, 2) << option << "\n" << r.out;
    EXPECT_THAT(r.out, ::testing::AnyOf(HasSubstr("finite"), HasSubstr("positive"))) << option << "\n" << r.out;
  }
}

// What a command prints on stdout must reach it: a full device is an error.
TEST_F(Cli, AFailedWriteToStandardOutputIsAnError) {
  const std::string ckpt = path("c.ckpt");
  ASSERT_EQ(run(std::string("train ") + kSmall + " --quiet --checkpoint " + ckpt).status, 0);
  const std::string input = concrete_csv("in.csv", 200, false);
  // A full device of our own (c 1 7, as /dev/full) in the test's directory: the real
  // /dev is never touched. (stderr still reaches the result; stdout goes to it.)
  const std::string full = path("full");
  if (::mknod(full.c_str(), S_IFCHR | 0666, makedev(1, 7)) != 0) {
    GTEST_SKIP() << "cannot make a device node here (mknod: " << std::strerror(errno) << ")";
  }
  const Result predicted = run_command("(" + binary() + " predict " + ckpt + " " + input + " > " + full + ")");
  EXPECT_NE(predicted.status, 0);
  EXPECT_THAT(predicted.out, HasSubstr("cannot write to standard output")) << predicted.out;
  const Result trained = run_command("(" + binary() + " train " + kSmall + " --json > " + full + ")");
  EXPECT_NE(trained.status, 0);
  EXPECT_THAT(trained.out, HasSubstr("cannot write to standard output")) << trained.out;
}

// Outputs are checked before any work (exit 2 in well under a second, nothing
// trained and lost): a missing or read-only directory, an existing directory, a
// name too long for the save's temporary; and an output that is one of the run's
// inputs — even through a hard link or another spelling — is refused, so no
// command destroys its data or its checkpoint. An unrelated existing file is
// replaced (the documented policy).
TEST_F(Cli, OutputsAreCheckedBeforeWorkAndNeverOverwriteAnInput) {
  const std::string train = "train --members 2 --epochs 200 --hidden 8 --device cpu --quiet ";
  fs::create_directories(dir() / "ro");
  fs::permissions(dir() / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  const bool root = ::geteuid() == 0;  // root writes anywhere: the read-only case says nothing then
  const std::string long_name = std::string(250, 'n') + ".ckpt";
  const struct {
    std::string args, says;
  } refused[] = {
      {train + "--checkpoint " + path("missing/run.ckpt"), "the directory " + path("missing") + " does not exist"},
      {train + "--checkpoint " + dir().string(), "is a directory"},
      {train + "--checkpoint " + path(long_name), "the file name is 255 bytes"},
      {train + "--trace " + path("missing/t.json"), "--trace"},
      {train + "--log " + path("missing/l.log"), "--log"},
      {train + "--checkpoint " + path("x") + " --trace " + path("x"), "are the same file"},
  };
  for (const auto& c : refused) {
    const auto start = std::chrono::steady_clock::now();
    const Result r = run(c.args);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(c.says)) << c.args;
    EXPECT_LT(seconds, 20) << "refused only after training (200 epochs): " << c.args;
  }
  if (!root) {
    const Result r = run(train + "--checkpoint " + path("ro/run.ckpt"));
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_THAT(r.out, HasSubstr("cannot write in"));
  }
  fs::permissions(dir() / "ro", fs::perms::owner_all);

  // Inputs: the data file, the checkpoint, the predictions' input.
  const std::string data = concrete_csv("data.csv", 120, true), ckpt = path("c.ckpt");
  const std::string data_bytes = read_file(data);
  const Result overwrite_data = run(train + "--data " + data + " --checkpoint " + data);
  EXPECT_EQ(overwrite_data.status, 2) << overwrite_data.out;
  EXPECT_THAT(overwrite_data.out, HasSubstr("refusing to overwrite an input"));
  fs::create_hard_link(data, path("alias.csv"));
  EXPECT_EQ(run(train + "--data " + data + " --export " + path("alias.csv")).status, 2)
      << "a hard link is the same file";
  EXPECT_EQ(read_file(data), data_bytes) << "the training data survived";
  ASSERT_EQ(run(std::string("train ") + kSmall + " --quiet --checkpoint " + ckpt).status, 0);
  const std::string ckpt_bytes = read_file(ckpt);
  EXPECT_EQ(run("export " + ckpt + " " + ckpt).status, 2);
  EXPECT_EQ(run("export " + ckpt + " " + path("./c.ckpt")).status, 2) << "another spelling of the same file";
  const std::string input = concrete_csv("in.csv", 10, false);
  EXPECT_EQ(run("predict " + ckpt + " " + input + " -o " + ckpt).status, 2);
  EXPECT_EQ(run("predict " + ckpt + " " + input + " -o " + input).status, 2);
  EXPECT_EQ(read_file(ckpt), ckpt_bytes) << "the checkpoint survived";
  // An unrelated existing file is replaced.
  { std::ofstream(path("old.csv")) << "old"; }
  EXPECT_EQ(run("predict " + ckpt + " " + input + " -o " + path("old.csv")).status, 0);
  EXPECT_THAT(read_file(path("old.csv")), HasSubstr("mean,std"));
}

// Out-of-range numbers say the bound in a few words (CLI11's own message printed a
// 309-digit range), and a negative seed is refused instead of wrapping to 2^64 - 1.
TEST_F(Cli, RangeErrorsStateTheBoundAndNegativeSeedsAreRefused) {
  const struct {
    std::string args, says;
  } cases[] = {
      {"train --members 0", "--members: must be > 0, got 0"},
      {"train --epochs -3", "--epochs: must be > 0, got -3"},
      {"train --depth -1", "--depth: must be >= 0, got -1"},
      {"train --seed -1", "--seed: must be >= 0, got -1"},
      {"multitask train --seed -1", "--seed: must be >= 0, got -1"},
  };
  for (const auto& c : cases) {
    const Result r = run(c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(c.says)) << c.args;
    EXPECT_LT(r.out.size(), 200u) << "one short line: " << r.out;
  }
}

// Every member diverging (a huge but finite rate) used to end in an internal error
// after replacing a good checkpoint with an unusable one: now it stops at that
// epoch, says so, exits 2 and leaves the checkpoint as it was.
TEST_F(Cli, EveryMemberDivergingKeepsThePreviousCheckpoint) {
  const std::string ckpt = path("good.ckpt");
  ASSERT_EQ(run(std::string("train ") + kSmall + " --quiet --checkpoint " + ckpt).status, 0);
  const std::string before = read_file(ckpt);
  const Result r = run("train --members 2 --epochs 5 --device cpu --lr 1e30 --quiet --checkpoint " + ckpt);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("every member diverged by epoch 1"));
  EXPECT_THAT(r.out, HasSubstr(ckpt + " is as it was"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("internal error")));
  EXPECT_EQ(read_file(ckpt), before) << "the good checkpoint was replaced";
}

// Small ones: a resume that would train nothing is refused (it rewrote the file);
// a symlink loop is named as one (it was "no such file"); a BOM at the start of a
// TSV is not part of the first label.
TEST_F(Cli, ResumeBelowTheEpochSymlinkLoopsAndBomsAreHandled) {
  const std::string ckpt = path("c.ckpt");
  ASSERT_EQ(run(std::string("train ") + kSmall + " --quiet --checkpoint " + ckpt).status, 0);
  const std::string before = read_file(ckpt);
  const Result r = run("resume " + ckpt + " --epochs 3 --device cpu --quiet");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("is at epoch 8; give --epochs above it"));
  EXPECT_EQ(read_file(ckpt), before);

  fs::create_symlink(path("loop2"), path("loop1"));
  fs::create_symlink(path("loop1"), path("loop2"));
  const Result loop = run("train --epochs 1 --device cpu --data " + path("loop1"));
  EXPECT_EQ(loop.status, 2) << loop.out;
  EXPECT_THAT(loop.out, HasSubstr("a loop of symbolic links"));

  std::string rows;
  for (int i = 0; i < 40; ++i) rows += std::string(i % 2 ? "1" : "0") + "\tsentence number " + std::to_string(i) + "\n";
  { std::ofstream(path("bom.tsv")) << "\xEF\xBB\xBF" << rows; }
  const Result bom = run("multitask train --epochs 1 --batch 8 --device cpu --quiet --train " + path("bom.tsv") +
                         " --dev " + path("bom.tsv") + " -o " + path("m.ckpt"));
  EXPECT_EQ(bom.status, 0) << bom.out;
}

TEST_F(Cli, MultitaskBadInputExitsTwoWithOneLine) {
  write_file(path("good.tsv"), yes_no_tsv(8));
  write_file(path("label.tsv"), "src\t1\t\tfine.\nsrc\tmaybe\t\tbad label.\n");
  write_file(path("cols.tsv"), "src\t1\t\tfine.\nsrc\t1\tthree columns\n");
  write_file(path("empty.tsv"), "src\t1\t\tfine.\nsrc\t0\t*\t \n");
  const std::string tiny = kTinyMultitask + " -o " + path("bad.ckpt");
  const std::string model = std::string(kTinyModel) + " --epochs 2 -o " + path("bad.ckpt");
  const struct {
    std::string args, expected;
  } cases[] = {
      {"multitask train --train " + path("label.tsv") + " --dev " + path("good.tsv") + " " + tiny,
       "label.tsv:2: unknown label 'maybe'"},
      {"multitask train --train " + path("cols.tsv") + " --dev " + path("good.tsv") + " " + tiny,
       "cols.tsv:2: expected 4 tab-separated columns"},
      {"multitask train --train " + path("empty.tsv") + " --dev " + path("good.tsv") + " " + tiny,
       "empty.tsv:2: the sentence is empty"},
      {"multitask train --train " + path("good.tsv") + " --dev " + path("good.tsv") + " " + model +
           " --heads 3 --buckets 16,32",
       "multiple of heads"},
      {"multitask train --train " + path("good.tsv") + " --dev " + path("good.tsv") + " " + model +
           " --heads 2 --buckets 16,64",
       "exceeds the model's max_length"},
  };
  for (const auto& c : cases) {
    const Result r = run(c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(c.expected)) << c.args;
  }
  EXPECT_FALSE(fs::exists(path("bad.ckpt")));
  ASSERT_EQ(run("multitask train --train " + path("good.tsv") + " --dev " + path("good.tsv") + " " + tiny).status, 0);
  const Result empty = run("multitask score " + path("bad.ckpt") + " 'fine.' ' ' --device cpu");
  EXPECT_EQ(empty.status, 2);
  EXPECT_THAT(empty.out, HasSubstr("text 2 is empty"));
  const Result long_prompt =
      run("multitask generate " + path("bad.ckpt") + " --prompt '" + std::string(40, 'x') + "' --device cpu");
  EXPECT_EQ(long_prompt.status, 2);
  EXPECT_THAT(long_prompt.out, HasSubstr("the model has 32 positions"));
  const Result not_multitask = run("multitask score " + path("good.tsv") + " 'fine.' --device cpu");
  EXPECT_EQ(not_multitask.status, 2) << not_multitask.out;
  for (const std::string sub : {"train", "resume", "score", "generate"}) {
    const Result help = run("multitask " + sub + " --help");
    EXPECT_EQ(help.status, 0);
    EXPECT_THAT(help.out, HasSubstr("Usage"));
  }
}

// A member-parallel manifest is a small JSON file a user can edit or copy shards
// under: each lie used to crash evaluate (a segfault on "members": 0), print a
// phantom or duplicated member with exit 0, or pass a raw library message. Each is
// now refused with exit 2 naming the problem, by evaluate, predict and resume alike.
TEST_F(Cli, CraftedOrMismatchedMemberParallelManifestsAreRefused) {
  const std::string args = "train --members 4 --epochs 2 --hidden 16 --device cpu --quiet --member-parallel";
  ASSERT_EQ(launch(2, args + " --checkpoint " + path("mp.json")).status, 0);
  ASSERT_EQ(launch(2, args + " --seed 7 --checkpoint " + path("other.json")).status, 0);
  const nlohmann::json good = nlohmann::json::parse(read_file(path("mp.json")));
  const std::string shard0 = path("mp.json.e2.shard-0-of-2"), shard1 = path("mp.json.e2.shard-1-of-2");
  const std::string shard1_bytes = read_file(shard1);
  const auto manifest = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json m = good;
    edit(m);
    write_file(path(name), m.dump());
    return path(name);
  };
  const auto without_checksums = [](nlohmann::json& m) {
    for (auto& s : m["shards"]) s.erase("checksum");
  };
  write_file(path("empty.json"), R"({"format":"packtrain-member-parallel-1","members":0,"ranks":0,"shards":[]})");
  const struct {
    std::string name, manifest, expected;
    std::function<void()> damage = [] {};
  } cases[] = {
      {"no members (segfaulted)", path("empty.json"), "0 members, 0 ranks"},
      {"another epoch", manifest("epoch.json", [](auto& m) { m["epoch"] = 1; }),
       "is at epoch 2, but the manifest committed epoch 1"},
      {"members miscounted (a phantom member)",
       manifest("count.json",
                [](auto& m) {
                  m["members"] = 5;
                  m["shards"][1]["members"] = 3;
                }),
       "holds members 2..3, but the manifest names 2..4"},
      {"a shard outside the directory", manifest("up.json", [](auto& m) { m["shards"][0]["file"] = "../x"; }),
       "is not a file name in the manifest's directory"},
      {"one shard named twice",
       manifest("twice.json", [](auto& m) { m["shards"][1]["file"] = m["shards"][0]["file"]; }), "is named twice"},
      {"a shard copied over another", path("mp.json"), "is not the file this manifest committed",
       [&] { fs::copy_file(shard0, shard1, fs::copy_options::overwrite_existing); }},
      {"the same, with no checksums (duplicated members)", manifest("nosum.json", without_checksums),
       "holds members 0..1, but the manifest names 2..3",
       [&] { fs::copy_file(shard0, shard1, fs::copy_options::overwrite_existing); }},
      {"a shard of another run", manifest("mixed.json", without_checksums), "comes from another run",
       [&] { fs::copy_file(path("other.json.e2.shard-1-of-2"), shard1, fs::copy_options::overwrite_existing); }},
      {"a missing shard", path("mp.json"), "shard-1-of-2': no such file", [&] { fs::remove(shard1); }},
  };
  const std::string table = concrete_csv("in.csv", 3, false);
  for (const auto& c : cases) {
    write_file(shard1, shard1_bytes);
    c.damage();
    for (const std::string& command :
         {"evaluate " + c.manifest, "predict " + c.manifest + " " + table, "resume " + c.manifest + " --epochs 3"}) {
      const Result r =
          command.starts_with("resume") ? launch(1, command + " --device cpu --quiet") : run(command + " --device cpu");
      EXPECT_EQ(r.status, 2) << c.name << ": " << command << "\n" << r.out;
      EXPECT_THAT(r.out, HasSubstr(c.expected)) << c.name << ": " << command;
      if (!command.starts_with("resume")) {
        EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << c.name << ": one line: " << r.out;
      }
    }
  }
}

// Divergence where a run is spread or shaped otherwise: member parallel (each rank
// sees only its own members: they count them together) and multitask (it carried on
// with NaN losses, exit 0, and replaced a good checkpoint).
TEST_F(Cli, DivergenceInMemberParallelAndMultitaskRunsKeepsThePreviousCheckpoint) {
  const std::string mp = path("mp.json");
  const std::string args = "train --members 4 --hidden 16 --device cpu --quiet --member-parallel";
  ASSERT_EQ(launch(2, args + " --epochs 2 --checkpoint " + mp).status, 0);
  const std::string manifest = read_file(mp);
  const Result diverged = launch(2, args + " --epochs 4 --lr 1e30 --checkpoint " + mp);
  EXPECT_NE(diverged.status, 0) << diverged.out;
  EXPECT_THAT(diverged.out, HasSubstr("[rank 0] packtrain: error: every member diverged by epoch 1"));
  EXPECT_THAT(diverged.out, HasSubstr("[rank 1] packtrain: error: every member diverged by epoch 1"));
  EXPECT_EQ(read_file(mp), manifest) << "the committed manifest was replaced";
  EXPECT_EQ(run("evaluate " + mp + " --device cpu").status, 0);

  write_file(path("t.tsv"), yes_no_tsv(16));
  const std::string ckpt = path("m.ckpt");
  const std::string files = " --train " + path("t.tsv") + " --dev " + path("t.tsv") + " -o " + ckpt;
  ASSERT_EQ(run("multitask train " + kTinyMultitask + files).status, 0);
  const std::string before = read_file(ckpt);
  const Result r = run("multitask train " + kTinyMultitask + " --lr 1e30" + files);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("the training loss became non-finite in epoch 1"));
  EXPECT_THAT(r.out, HasSubstr(ckpt + " is as it was"));
  EXPECT_EQ(read_file(ckpt), before) << "the good checkpoint was replaced";
}

// Data edited on disk after training: `evaluate CKPT` scored the new rows under the
// run's name and `multitask resume` carried on with other sentences (exit 0, the
// checkpoint overwritten). Fingerprints stored with the run catch both; a table
// given explicitly is still evaluated (the user chose those rows).
TEST_F(Cli, DataChangedSinceTrainingIsCaughtByEvaluateAndResume) {
  const std::string csv = concrete_csv("data.csv", 200, true);
  const std::string ckpt = path("c.ckpt");
  ASSERT_EQ(run("train --data " + csv + " --members 2 --epochs 2 --hidden 16 --device cpu --quiet --checkpoint " + ckpt)
                .status,
            0);
  ASSERT_EQ(run("evaluate " + ckpt + " --device cpu").status, 0);
  std::string rows = read_file(csv);
  rows.insert(rows.size() - 1, "1");  // the last row's target (a test or a training row) gets another digit
  write_file(csv, rows);
  const std::string before = read_file(ckpt);
  const Result evaluated = run("evaluate " + ckpt + " --device cpu");
  EXPECT_EQ(evaluated.status, 2) << evaluated.out;
  EXPECT_THAT(evaluated.out, HasSubstr("the data, its sample shape or its split changed since this run was trained"));
  EXPECT_THAT(evaluated.out, HasSubstr("packtrain evaluate " + ckpt + " TABLE"));
  EXPECT_EQ(run("evaluate " + ckpt + " " + csv + " --device cpu").status, 0) << "an explicit table is evaluated";
  const Result resumed = run("resume " + ckpt + " --epochs 3 --device cpu --quiet");
  EXPECT_EQ(resumed.status, 2) << resumed.out;
  EXPECT_THAT(resumed.out, HasSubstr("changed since this run was trained"));
  EXPECT_EQ(read_file(ckpt), before);

  write_file(path("train.tsv"), yes_no_tsv(16));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const std::string m = path("m.ckpt");
  ASSERT_EQ(run("multitask train " + kTinyShape + " --epochs 1 --train " + path("train.tsv") + " --dev " +
                path("dev.tsv") + " -o " + m)
                .status,
            0);
  const std::string trained = read_file(m);
  const struct {
    std::string file, text, expected;
  } edits[] = {
      {"train.tsv", yes_no_tsv(8), "train.tsv: the training sentences changed"},  // halved
      {"dev.tsv", yes_no_tsv(6), "dev.tsv: the dev sentences changed"},           // shrunk
      {"train.tsv", "src\t0\t\tyes edited.\n" + yes_no_tsv(16).substr(yes_no_tsv(16).find('\n') + 1),
       "train.tsv: the training sentences changed"},  // one sentence edited
  };
  for (const auto& e : edits) {
    write_file(path("train.tsv"), yes_no_tsv(16));
    write_file(path("dev.tsv"), yes_no_tsv(8));
    write_file(path(e.file), e.text);
    const Result r = run("multitask resume " + m + " --epochs 2 --device cpu -q");
    EXPECT_EQ(r.status, 2) << e.expected << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(e.expected));
    EXPECT_EQ(read_file(m), trained) << e.expected << ": the checkpoint was replaced";
  }
}

// A final write that fails after the checks made before training (here a file-size
// limit: the disk filled up meanwhile) used to end the run with "internal error"
// before its results were printed: the results come first now, then one error
// line naming the file, exit 1.
TEST_F(Cli, AFinalWriteThatFailsStillPrintsTheResultsFirst) {
  const std::string limited = "trap '' XFSZ; ulimit -f 2; " + binary() + " ";  // 2 KiB: smaller than every output here
  const struct {
    std::string args, results, file;
  } cases[] = {
      {std::string("train ") + kSmall + " --checkpoint-every 100 --checkpoint " + path("c.ckpt"), "Test metrics",
       path("c.ckpt")},
      {std::string("train ") + kSmall + " --export " + path("e.pt"), "Test metrics", path("e.pt")},
      {"multitask train " + kTinyShape + " --epochs 1 --train " + path("t.tsv") + " --dev " + path("t.tsv") + " -o " +
           path("m.ckpt"),
       "Dev (t.tsv", path("m.ckpt")},
      {"active-learn --members 2 --epochs 2 --rounds 2 --initial 20 --acquire 10 --runs 1 --hidden 8 --device cpu "
       "--quiet --csv " +
           path("curve.csv") + " --plot " + path("curve.svg"),
       "Learning curve", path("curve.svg")},
  };
  write_file(path("t.tsv"), yes_no_tsv(16));
  for (const auto& c : cases) {
    const Result r = run_command(limited + c.args + " 2>&1");
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.out;
    const size_t results = r.out.find(c.results), error = r.out.find("packtrain: error: cannot write '" + c.file);
    EXPECT_NE(results, std::string::npos) << c.args << "\n" << r.out;
    EXPECT_NE(error, std::string::npos) << c.args << "\n" << r.out;
    EXPECT_LT(results, error) << "the results come first";
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("internal error")));
    EXPECT_FALSE(fs::exists(c.file)) << "no torn file";
  }
}

// Columns are never matched by chance: a header naming a column twice is refused
// (the target was one of them, picked inconsistently), and a predict table whose
// header lacks the training names is refused (it was read by position silently).
TEST_F(Cli, AmbiguousOrMismatchedColumnNamesAreRefused) {
  write_file(path("dup.csv"), "a,b,a\n1,2,3\n4,5,6\n7,8,9\n1,1,1\n2,2,2\n");
  const Result dup = run("train --data " + path("dup.csv") + " --epochs 1 --device cpu");
  EXPECT_EQ(dup.status, 2) << dup.out;
  EXPECT_THAT(dup.out, HasSubstr("dup.csv:1: the header names column 'a' twice (columns 0 and 2"));

  const std::string data = concrete_csv("data.csv", 120, true), ckpt = path("c.ckpt");
  ASSERT_EQ(run("train --data " + data + " --members 2 --epochs 1 --hidden 8 --device cpu --quiet --checkpoint " + ckpt)
                .status,
            0);
  std::string renamed = read_file(data);
  renamed.replace(0, renamed.find(','), "something_else");  // the first feature's name
  write_file(path("renamed.csv"), renamed);
  const Result predicted = run("predict " + ckpt + " " + path("renamed.csv") + " --device cpu");
  EXPECT_EQ(predicted.status, 2) << predicted.out;
  EXPECT_THAT(predicted.out, HasSubstr("renamed.csv: its header lacks the model's feature column(s)"));
  // The same rows without a header are read by position, as before.
  const std::string rows = read_file(data).substr(read_file(data).find('\n') + 1);
  write_file(path("rows.csv"), rows);
  EXPECT_EQ(run("evaluate " + ckpt + " " + path("rows.csv") + " --header no --device cpu").status, 0);
}

// Config files: a key set twice was accepted silently (the first won) and syntax or
// type errors named neither the file nor the line. Each is FILE:LINE now, exit 2.
TEST_F(Cli, ConfigMistakesNameTheFileAndLine) {
  const struct {
    std::string text, expected;
  } cases[] = {
      {"members = 4\nepochs = 1\nmembers = 8\n", "c.toml:3: 'members' is set twice (first on line 1)"},
      {"epochs = 1\nmembers 4\n", "c.toml:2: expected `key = value`"},
      {"# runs\n\nmembers = \"abc\"\n", "c.toml:3: "},
      {"epochs = 1\nmembers = 0\n", "c.toml:2: --members: must be > 0, got 0"},
      {"[train\nmembers = 2\n", "c.toml:1: expected a [section] header"},
      {"epochs = 1\nnope = 2\n", "c.toml:2: "},
      {"epochs = [1, 2]\n", "c.toml:1: "},  // a list where one value goes (lr takes lists: a sweep)
  };
  for (const auto& c : cases) {
    write_file(path("c.toml"), c.text);
    const Result r = run("train --config " + path("c.toml") + " --device cpu --quiet --checkpoint " + path("x.ckpt"));
    EXPECT_EQ(r.status, 2) << c.text << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(c.expected)) << c.text;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << c.text << ": one line: " << r.out;
  }
  // A flag on the command line wins over the config: its error is not the config's.
  write_file(path("c.toml"), "members = 4\n");
  const Result r = run("train --config " + path("c.toml") + " --members 0 --device cpu");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("c.toml:")));
  // Arrays may span lines, sections hold a subcommand's keys, comments are skipped.
  write_file(path("ok.toml"), "# a run\n[train]\nmembers = 2 # two\nepochs = 1\n");
  EXPECT_EQ(run("train --config " + path("ok.toml") + " --device cpu --quiet").status, 0);
}

// `packtrain --threads N launch ...` ran every rank with LibTorch's default instead.
TEST_F(Cli, ThreadsReachTheLaunchedRanks) {
  const Result threads = run("--threads 3 launch --nproc 2 -- info --json");
  ASSERT_EQ(threads.status, 0) << threads.out;
  EXPECT_EQ(rank0_json(threads.out)["cpu_threads"], 3) << threads.out;
  size_t ranks = 0;
  for (size_t at = threads.out.find("\"cpu_threads\": 3"); at != std::string::npos;
       at = threads.out.find("\"cpu_threads\": 3", at + 1)) {
    ++ranks;
  }
  EXPECT_EQ(ranks, 2u) << "both ranks: " << threads.out;
}

}  // namespace
}  // namespace packtrain::cli_testing
