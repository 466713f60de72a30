// Sizes without bounds end at once with exit 2: a run whose estimated memory is not
// available is refused before anything large is allocated, naming the estimate and
// what is available (runtime/trainers/memory_estimate.h); --threads is bounded;
// --temperature must be finite.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

class SizeLimits : public Cli {};

struct Timed {
  Result result;
  double seconds;
};

// `packtrain ARGS` with an address-space limit of 8 GiB (a CPU run needs well under
// 4), so that a regression fails with an allocator error in seconds instead of
// eating the machine's memory, and a time limit of 120 s (a hang exits 124).
Timed run_bounded(const std::string& args) {
  const auto start = std::chrono::steady_clock::now();
  Result r = run_command("ulimit -v 8388608; timeout 120 " + binary() + " " + args);
  return {std::move(r), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

struct SizeCase {
  std::string name;
  std::string args;
  std::string flags;  // the advice names these
};

TEST_F(SizeLimits, RunsThatCannotFitAreRefusedAtOnceNamingTheEstimateAndWhatIsAvailable) {
  const std::string ckpt = path("never.ckpt");
  const std::vector<SizeCase> cases = {
      {"members", "train --members 1000000000 --epochs 1 --device cpu --checkpoint " + ckpt, "--members"},
      {"hidden", "train --hidden 100000000 --epochs 1 --device cpu --checkpoint " + ckpt, "--hidden"},
      {"depth", "train --depth 100000 --epochs 1 --device cpu --checkpoint " + ckpt, "--depth"},
      {"multitask width", "multitask train --width 1000000 --epochs 1 --device cpu -q -o " + ckpt, "--width"},
      {"active-learn runs",
       "active-learn --runs 100000000 --rounds 1 --device cpu --quiet --csv " + path("c.csv") + " --plot " +
           path("c.svg"),
       "--runs"},
  };
  for (const SizeCase& c : cases) {
    const Timed t = run_bounded(c.args);
    EXPECT_EQ(t.result.status, 2) << c.name << ": " << t.result.out;
    EXPECT_LT(t.seconds, 30) << c.name << ": refused before any work";
    EXPECT_THAT(t.result.out, HasSubstr("this run needs about")) << c.name;
    EXPECT_THAT(t.result.out, HasSubstr("are available on cpu")) << c.name;
    EXPECT_THAT(t.result.out, HasSubstr(c.flags)) << c.name;
    EXPECT_FALSE(fs::exists(ckpt)) << c.name << ": nothing written";
  }
}

TEST_F(SizeLimits, ThreadsAreBoundedByTheCores) {
  const Timed t = run_bounded("--threads 100000 info");
  EXPECT_EQ(t.result.status, 2) << t.result.out;
  EXPECT_LT(t.seconds, 30);
  EXPECT_THAT(t.result.out, HasSubstr("--threads: must be between 0 and"));
  EXPECT_EQ(run("--threads 1 info").status, 0);
  EXPECT_THAT(run("--help").out, HasSubstr("at most 4 per core"));
}

TEST_F(SizeLimits, TemperatureMustBeFiniteAndNonNegative) {
  // Refused while the flags are read: the checkpoint is never opened.
  write_file(path("model.ckpt"), "not read");
  for (const std::string value : {"nan", "inf", "-inf", "-1", "1e400"}) {
    const Result r =
        run("multitask generate " + path("model.ckpt") + " --prompt hi --device cpu --temperature " + value);
    EXPECT_EQ(r.status, 2) << value << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr("--temperature: must be finite and >= 0, got " + value)) << value;
  }
}

}  // namespace
}  // namespace packtrain::cli_testing
