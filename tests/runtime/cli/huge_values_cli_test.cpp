// Finite but huge numbers and the memory of large runs: a value beyond float32's
// range, or one the model's standardization would carry beyond it, is refused by
// every command that reads a table (exit 2, naming FILE:LINE:COLUMN) instead of
// NaN predictions with exit 0; a prediction that overflows inside the network
// anyway is refused naming the row; and a sweep too large for the memory is refused
// by the estimate before any per-member value is built (exit 2, not bad_alloc);
// acquire scores a pool chunk by chunk, its peak memory proportional to the file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// 40 rows of a, b and a target: column a has a tiny spread (std ~0.002), so a
// modest-looking a is many standard deviations away once standardized.
std::string training_csv(bool classification) {
  std::string out = "a,b,y\n";
  for (int k = 0; k < 40; ++k) {
    const double a = 0.001 * (k % 7), b = k;
    out += std::to_string(a) + "," + std::to_string(k) + "," +
           (classification ? std::to_string(k % 2) : std::to_string(b + 1000 * a)) + "\n";
  }
  return out;
}

class HugeValues : public Cli {
 protected:
  // A tiny checkpoint trained on training_csv(): regression, or a classifier.
  std::string checkpoint(bool classification, const std::string& flags = "") {
    const std::string name = classification ? "cls" : "reg";
    write_file(path(name + ".csv"), training_csv(classification));
    const Result r = run("train --data " + path(name + ".csv") +
                         " --members 2 --epochs 2 --hidden 8 --device cpu "
                         "--quiet --checkpoint " +
                         path(name + ".ckpt") + (classification ? " --head classification " : " ") + flags);
    EXPECT_EQ(r.status, 0) << r.out;
    return path(name + ".ckpt");
  }
  // Every command that reads rows for a checkpoint, on a pool (features only) and a
  // labelled table (features and target) written from the same rows: each exits 2
  // with FILE`at` and every part of `message`.
  void expect_refused_everywhere(const std::string& ckpt, const std::string& rows, const std::string& targets,
                                 const std::string& at, const std::vector<std::string>& message) {
    write_file(path("pool.csv"), "a,b\n" + rows);
    std::string labelled = "a,b,y\n", rest = rows;
    for (size_t i = 0; !rest.empty(); ++i) {
      const size_t end = rest.find('\n');
      labelled += rest.substr(0, end) + "," + targets.substr(i * 2, 1) + "\n";
      rest = rest.substr(end + 1);
    }
    write_file(path("labelled.csv"), labelled);
    for (const auto& [args, file] : {std::pair{"predict " + ckpt + " " + path("pool.csv"), path("pool.csv")},
                                     {"acquire " + ckpt + " " + path("pool.csv") + " --count 1", path("pool.csv")},
                                     {"evaluate " + ckpt + " " + path("labelled.csv"), path("labelled.csv")}}) {
      const Result r = run(args);
      EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
      EXPECT_THAT(r.out, HasSubstr("packtrain: error: " + file + at)) << args;
      for (const std::string& part : message) EXPECT_THAT(r.out, HasSubstr(part)) << args;
      EXPECT_THAT(r.out, Not(HasSubstr("nan"))) << args;
      EXPECT_THAT(r.out, Not(HasSubstr("calibrated"))) << args;
    }
  }
};

TEST_F(HugeValues, AFeatureBeyondFloat32IsRefusedByPredictAcquireAndEvaluateNamingFileLineAndColumn) {
  for (const bool classification : {false, true}) {
    const std::string ckpt = checkpoint(classification);
    // Data line 3 is file line 4; b is column 2.
    expect_refused_everywhere(ckpt, "0.001,3\n0.002,4\n0.003,1e300\n", "1,0,1,",
                              ":4:2: ", {"value '1e300' beyond float32's range", "column 'b'"});
  }
}

TEST_F(HugeValues, AFeatureThatStandardizesBeyondFloat32IsRefusedNamingFileLineAndColumn) {
  // 1e37 fits float32, but a's standard deviation (~0.002) carries it to ~5e39.
  for (const bool classification : {false, true}) {
    const std::string ckpt = checkpoint(classification);
    expect_refused_everywhere(ckpt, "0.001,3\n1e37,4\n", "1,0,", ":3:1: ",
                              {"column 'a': value 1e+37 is", "training standard deviations", "beyond float32's range"});
  }
}

TEST_F(HugeValues, TrainingAndActiveLearningRefuseATargetBeyondFloat32NamingFileLineAndColumn) {
  std::string csv = training_csv(false);
  // The fourth data row (file line 5) gets a target of 1e300.
  size_t line = 0;
  for (int i = 0; i < 4; ++i) line = csv.find('\n', line) + 1;
  const size_t end = csv.find('\n', line), comma = csv.rfind(',', end);
  csv.replace(comma + 1, end - comma - 1, "1e300");
  write_file(path("bad.csv"), csv);
  const std::string ckpt = path("never.ckpt");
  for (const std::string& args : {"train --data " + path("bad.csv") +
                                      " --members 2 --epochs 2 --hidden 8 --device cpu --quiet --checkpoint " + ckpt,
                                  "active-learn --data " + path("bad.csv") +
                                      " --members 2 --epochs 2 --rounds 2 --initial 10 --acquire 5 "
                                      "--runs 1 --hidden 8 --device cpu --quiet --csv " +
                                      path("c.csv") + " --plot " + path("c.svg")}) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr("bad.csv:5:3: value '1e300' beyond float32's range")) << args;
    EXPECT_THAT(r.out, HasSubstr("column 'y'")) << args;
    EXPECT_THAT(r.out, Not(HasSubstr("inf"))) << args;
  }
  EXPECT_FALSE(fs::exists(ckpt));
}

TEST_F(HugeValues, APredictionThatOverflowsInsideTheNetworkIsRefusedNamingTheRow) {
  // a = 1e20 is representable and standardizes to ~5e22, but layer norm squares its
  // hidden values (1e45 overflows float32): the prediction is NaN.
  for (const bool classification : {false, true}) {
    const std::string ckpt = checkpoint(classification, "--layer-norm");
    expect_refused_everywhere(ckpt, "0.001,3\n1e20,4\n", "1,0,",
                              ":3: ", {"the ensemble's prediction for this row is not finite"});
  }
}

// `packtrain ARGS` under an address-space limit of `kib` KiB and a time limit.
Result run_limited(int64_t kib, const std::string& args) {
  return run_command("ulimit -v " + std::to_string(kib) + "; timeout 120 " + binary() + " " + args);
}

TEST_F(HugeValues, ASweepTooLargeForTheMemoryIsRefusedByTheEstimateBeforeItsPerMemberValuesExist) {
  // 2 x 3e7 (or 1e8) members: their per-member learning rates, weight decays and
  // dropout rates (1.4 GB a copy, and the options are copied: 5 GB resident before)
  // exceed a 3 GiB address space: built first, they end in bad_alloc ("internal
  // error", exit 1); estimated first, the run is refused (under 0.5 GB resident).
  const std::string ckpt = path("never.ckpt");
  for (const std::string members : {"30000000", "100000000"}) {
    const Result r = run_limited(
        3145728, "train --lr 1e-3,2e-3 --members " + members + " --epochs 1 --device cpu --checkpoint " + ckpt);
    EXPECT_EQ(r.status, 2) << members << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr("this run needs about")) << members;
    EXPECT_THAT(r.out, HasSubstr("sweep fewer values")) << members;
    EXPECT_THAT(r.out, Not(HasSubstr("internal error"))) << members;
  }
  EXPECT_FALSE(fs::exists(ckpt));
}

// acquire's peak memory grows with the pool by a bounded factor: the pool is
// predicted a chunk of rows at a time, keeping one score per row. Before, the whole
// pool went through the 16-member network at once: (16, rows, 64) float32 layers
// and (16, rows) float64 predictions, 5.3 GB for a 96 MB pool of 2 M rows (55x).
// Two runs, 2,000 and 200,000 rows: the larger one's extra peak resident memory
// stays below 10x the extra bytes of file (7x: the text and each cell's string
// while the table is read).
TEST_F(HugeValues, AcquireScoresAPoolInChunksWithPeakMemoryProportionalToTheFile) {
  ASSERT_EQ(run("train --quiet --epochs 2 --device cpu --checkpoint " + path("x.ckpt")).status, 0);
  const auto pool = [&](const std::string& name, int rows) {
    std::ofstream out(path(name));
    out << "cement,slag,ash,water,plasticizer,coarse,fine,age\n";
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < 8; ++c) out << (c ? "," : "") << 100 + ((r * 7919 + c * 104729) % 9973) / 10.0;
      out << "\n";
    }
    return path(name);
  };
  const auto peak_kib = [&](const std::string& file) {
    const pid_t pid = start_packtrain({"acquire", path("x.ckpt"), file, "-o", path("chosen.csv")}, path("err.txt"));
    int64_t kib = 0;
    EXPECT_EQ(exit_status(pid, &kib), 0) << read_file(path("err.txt"));
    return kib;
  };
  const std::string small = pool("small.csv", 2000), large = pool("large.csv", 200000);
  const double extra_bytes = static_cast<double>(fs::file_size(large) - fs::file_size(small));
  const double extra_peak = static_cast<double>(peak_kib(large) - peak_kib(small)) * 1024;
  EXPECT_GT(extra_bytes, 8e6);
  EXPECT_LT(extra_peak, 10 * extra_bytes) << "peak grew " << extra_peak / extra_bytes << "x the file";
  std::printf("acquire: peak resident memory grew %.1fx the extra pool bytes (%.1f MB of file)\n",
              extra_peak / extra_bytes, extra_bytes / 1e6);
}

}  // namespace
}  // namespace packtrain::cli_testing
