// Ctrl-C through the one run driver: `train` and `multitask train` stop the same
// way — after the current epoch, a checkpoint written, exit status 130, the same
// messages naming the command that continues the run — and that command continues it.
#include "tests/runtime/cli/cli_harness.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

struct Interrupted {
  int exit_status = -1;
  std::string stderr_text;
  int epoch = -1;  // the epoch the run says it stopped after
  std::string resume_command;
};

// Starts `packtrain ARGS` with stderr into a file, waits until its --log shows
// `progress` (training is under way), sends one SIGINT and reads what it said.
Interrupted interrupt(const std::vector<std::string>& args, const fs::path& log, const fs::path& err,
                      const std::string& progress) {
  const pid_t child = start_packtrain(args, err);
  Interrupted out;
  if (child < 0) return out;
  wait_for_text(log, progress);
  kill(child, SIGINT);
  out.exit_status = exit_status(child);
  out.stderr_text = read_file(err);
  std::smatch m;
  static const std::regex said(
      "packtrain: interrupted after epoch ([0-9]+); checkpoint saved: continue with `([^`]+)`");
  if (std::regex_search(out.stderr_text, m, said)) {
    out.epoch = std::stoi(m[1]);
    out.resume_command = m[2];
  }
  return out;
}

// The part of both commands' behaviour that must be the same.
void expect_stopped_after_an_epoch(const Interrupted& r, const std::string& resume_prefix, const fs::path& ckpt) {
  EXPECT_EQ(r.exit_status, 130) << r.stderr_text;
  EXPECT_THAT(r.stderr_text, HasSubstr("packtrain: stopping after this epoch (Ctrl-C again to stop at once)"));
  ASSERT_GE(r.epoch, 1) << r.stderr_text;
  EXPECT_EQ(r.resume_command, resume_prefix + " " + ckpt.string());
  EXPECT_TRUE(fs::exists(ckpt));
}

TEST_F(Cli, CtrlCStopsTrainAndMultitaskTheSameWayAndTheirResumeContinues) {
  // train: an ensemble on the bundled data, far more epochs than the test waits for.
  const fs::path ckpt = path("train.ckpt"), log = path("train.log");
  const Interrupted train =
      // --patience 0: early stopping would end the run (epoch 77, 0.3 s on an idle
      // machine) before the signal lands.
      interrupt({"train", "--epochs", "100000", "--patience", "0", "--members", "2", "--device", "cpu", "--checkpoint",
                 ckpt.string(), "--log", log.string()},
                log, path("train.err"), "epoch    2/");
  expect_stopped_after_an_epoch(train, "packtrain resume", ckpt);
  const nlohmann::json resumed =
      run_json("resume " + ckpt.string() + " --epochs " + std::to_string(train.epoch + 3) + " --json --device cpu");
  EXPECT_EQ(resumed["epochs_run"], train.epoch + 3);

  // multitask train: the same driver, the same behaviour.
  const fs::path tsv = path("texts.tsv"), mckpt = path("multitask.ckpt"), mlog = path("multitask.log");
  write_file(tsv, yes_no_tsv(64));
  std::vector<std::string> args{"multitask", "train",  "--train", tsv.string(),   "--dev", tsv.string(),
                                "--epochs",  "100000", "--out",   mckpt.string(), "--log", mlog.string()};
  for (const char* a : {"--width", "16", "--layers", "1", "--max-length", "32", "--batch", "4", "--heads", "2",
                        "--buckets", "16,32", "--device", "cpu"}) {
    args.emplace_back(a);
  }
  const Interrupted multitask = interrupt(args, mlog, path("multitask.err"), "epoch 2/");
  expect_stopped_after_an_epoch(multitask, "packtrain multitask resume", mckpt);
  const Result more = run("multitask resume " + mckpt.string() + " --epochs " + std::to_string(multitask.epoch + 1) +
                          " --device cpu --json");
  ASSERT_EQ(more.status, 0) << more.out;
  EXPECT_THAT(more.out, HasSubstr("\"epoch\": " + std::to_string(multitask.epoch + 1)));
}

}  // namespace
}  // namespace packtrain::cli_testing
