// What a checkpoint calls its ensemble is what every reader sees: after a sweep's
// `--select best`, predict, evaluate's member mean and the export (and so the
// Python loader) hold the kept configuration's members only.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "tests/runtime/cli/cli_harness.h"
#include "tests/runtime/cli/export_check.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

TEST_F(Cli, ASweepsSelectedEnsembleIsWhatEveryReaderSees) {
  // Two learning rates x 2 seeds; the second rate is large enough to train a
  // visibly different (worse) configuration.
  const std::string ckpt = path("sweep.ckpt");
  const Result trained =
      run("train --members 2 --lr 3e-3,0.3 --select best --epochs 6 --hidden 16 --device cpu "
          "--quiet --checkpoint " +
          ckpt);
  ASSERT_EQ(trained.status, 0) << trained.out;
  const nlohmann::json evaluated = run_json("evaluate " + ckpt + " --json");
  std::vector<int64_t> kept, dropped;
  for (size_t k = 0; k < evaluated["members"].size(); ++k) {
    (evaluated["members"][k]["in_ensemble"].get<bool>() ? kept : dropped).push_back(static_cast<int64_t>(k));
  }
  ASSERT_EQ(kept.size(), 2u);
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_EQ(evaluated["members"][dropped[0]]["status"], "deselected");

  // The export holds the kept members only; a deselected one is refused by name.
  const Result exported = run("export " + ckpt + " " + path("sweep.pt"));
  ASSERT_EQ(exported.status, 0) << exported.out;
  EXPECT_THAT(exported.out, HasSubstr("2 member(s)"));
  const Result refused = run("export " + ckpt + " " + path("one.pt") + " --member " + std::to_string(dropped[0]));
  EXPECT_EQ(refused.status, 2) << refused.out;
  EXPECT_THAT(refused.out, HasSubstr("not part of the ensemble (deselected"));
  EXPECT_EQ(run("export " + ckpt + " " + path("one.pt") + " --member " + std::to_string(kept[0])).status, 0);

  // evaluate's member mean averages the ensemble's members, and says so.
  const Result table = run("evaluate " + ckpt);
  ASSERT_EQ(table.status, 0) << table.out;
  EXPECT_THAT(table.out, HasSubstr("of the 2 members in the ensemble"));
  double kept_mean = 0;
  for (int64_t k : kept) kept_mean += evaluated["members"][k]["rmse"].get<double>() / 2;
  const size_t at = table.out.find("    mean  ");
  ASSERT_NE(at, std::string::npos) << table.out;
  EXPECT_NEAR(std::stod(table.out.substr(at + 10)), kept_mean, 1e-3 * kept_mean + 1e-3) << table.out;

  // The Python loader predicts what packtrain predicts.
  expect_export_predicts_as_packtrain(ckpt, path("sweep.pt"), concrete_csv("in.csv", 20, false), 20, dir().string());
}

// A member-parallel manifest is not one checkpoint: export says what to export instead.
TEST_F(Cli, ExportOfAMemberParallelManifestSaysToExportItsShards) {
  const std::string manifest = path("mp.ckpt");
  const Result trained = launch(2, std::string("train ") + kSmall +
                                       " --member-parallel --recalibrate none "
                                       "--patience 0 --quiet --checkpoint " +
                                       manifest);
  ASSERT_EQ(trained.status, 0) << trained.out;
  const Result r = run("export " + manifest + " " + path("mp.pt"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("member-parallel manifest (4 members in 2 shards)"));
  EXPECT_THAT(r.out, HasSubstr("shard-0-of-2"));
  EXPECT_FALSE(fs::exists(path("mp.pt")));
}

}  // namespace
}  // namespace packtrain::cli_testing
