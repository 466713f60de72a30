// The packtrain binary's uncertainty, end to end: predict's decomposition and
// mixture intervals, evaluate's scores, calibration verdict and reliability
// diagram, and `acquire` ranking a real pool for both heads. (The numbers are
// checked against reference libraries in python/tests/test_calibration.py.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

constexpr const char* kRegression = "train --members 5 --epochs 30 --hidden 32 --device cpu";
constexpr const char* kClassifier =
    "train --data wine-quality-red --head classification --members 5 --epochs 15 --hidden 32 --device cpu";

std::vector<std::vector<double>> csv_rows(const std::string& text, std::string* header) {
  std::istringstream lines(text);
  std::getline(lines, *header);
  std::vector<std::vector<double>> rows;
  for (std::string line; std::getline(lines, line);) {
    std::vector<double> row;
    std::istringstream cells(line);
    for (std::string cell; std::getline(cells, cell, ',');) row.push_back(std::stod(cell));
    rows.push_back(row);
  }
  return rows;
}

TEST_F(Cli, PredictSplitsTheStdAndGivesTheMixturesIntervals) {
  const std::string ckpt = path("run.ckpt");
  ASSERT_EQ(run(std::string(kRegression) + " --checkpoint " + ckpt).status, 0);
  const Result r = run("predict " + ckpt + " " + concrete_csv("in.csv", 40, false) +
                       " --interval 0.5 --interval 0.95 -o " + path("out.csv"));
  ASSERT_EQ(r.status, 0) << r.out;
  std::string header;
  const auto rows = csv_rows(read_file(path("out.csv")), &header);
  EXPECT_EQ(header, "mean,std,aleatoric_std,epistemic_std,lower_50,upper_50,lower_95,upper_95");
  ASSERT_EQ(rows.size(), 40u);
  for (const auto& v : rows) {
    ASSERT_EQ(v.size(), 8u);
    const double mean = v[0], sd = v[1], aleatoric = v[2], epistemic = v[3];
    EXPECT_NEAR(sd * sd, aleatoric * aleatoric + epistemic * epistemic, 1e-6 * sd * sd);
    EXPECT_GT(aleatoric, 0);
    EXPECT_GT(epistemic, 0);
    EXPECT_LT(v[6], v[4]);  // the 95% interval holds the 50% one
    EXPECT_LT(v[4], v[5]);
    EXPECT_LT(v[5], v[7]);
    EXPECT_LT(v[6], mean);
    EXPECT_GT(v[7], mean);
  }
  const Result bad = run("predict " + ckpt + " " + concrete_csv("in2.csv", 3, false) + " --interval 1.5");
  EXPECT_NE(bad.status, 0);
  EXPECT_THAT(bad.out, HasSubstr("strictly between 0 and 1, got 1.5"));
}

TEST_F(Cli, EvaluateReportsCalibrationInWordsJsonAndADiagram) {
  const std::string ckpt = path("run.ckpt");
  const nlohmann::json trained = run_json(std::string(kRegression) + " --json --checkpoint " + ckpt);
  const nlohmann::json c = trained["calibration"];  // train's report carries it too
  ASSERT_TRUE(c.is_object()) << trained.dump();
  for (const char* key : {"rmse", "mixture_nll", "gaussian_nll", "crps", "miscalibration_area"}) {
    EXPECT_TRUE(c[key].is_number()) << key << " in " << c.dump();
  }
  EXPECT_EQ(c["rmse"], trained["ensemble"]["rmse"]);
  EXPECT_EQ(c["gaussian_nll"], trained["ensemble"]["nll"]);  // the ensemble's NLL: the moment-matched Gaussian's
  ASSERT_EQ(c["intervals"].size(), 3u);
  double previous_width = 0;
  for (const auto& i : c["intervals"]) {  // 50, 90, 95%: wider and covering more
    EXPECT_GE(i["coverage"].get<double>(), 0);
    EXPECT_GT(i["mean_width"].get<double>(), previous_width);
    previous_width = i["mean_width"].get<double>();
  }
  EXPECT_EQ(c["reliability"]["expected"].size(), 100u);

  const Result text = run("evaluate " + ckpt + " --device cpu --interval 0.8 --reliability " + path("rel.svg"));
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("NLL of the mixture"));
  EXPECT_THAT(text.out, HasSubstr("NLL of the moment-matched Gaussian"));
  EXPECT_THAT(text.out, HasSubstr("80% intervals cover"));
  EXPECT_THAT(text.out, HasSubstr("of 103 rows"));
  EXPECT_THAT(text.out, HasSubstr("miscalibration area"));
  EXPECT_EQ(read_file(path("rel.svg")).rfind("<svg", 0), 0u);
  EXPECT_THAT(read_file(path("rel.svg")), HasSubstr("central interval level"));
}

TEST_F(Cli, TrainRecalibratesOnItsValidationRowsAndEvaluateUsesTheScale) {
  const std::string ckpt = path("run.ckpt");
  const nlohmann::json trained = run_json(std::string(kRegression) + " --json --quiet --checkpoint " + ckpt);
  const nlohmann::json plain = run_json(std::string(kRegression) + " --recalibrate none --json --quiet");
  ASSERT_TRUE(trained["variance_scale"].is_number()) << trained.dump();
  const double s = trained["variance_scale"].get<double>();
  EXPECT_GT(s, 0);
  EXPECT_NE(s, 1.0) << "the default fits a scale on the validation rows";
  EXPECT_EQ(plain["variance_scale"].get<double>(), 1.0);
  EXPECT_EQ(trained["options"]["recalibration"], "variance");
  EXPECT_EQ(plain["options"]["recalibration"], "none");
  // The same members: the mean is untouched, the spread stretched by sqrt(s).
  EXPECT_DOUBLE_EQ(trained["ensemble"]["rmse"].get<double>(), plain["ensemble"]["rmse"].get<double>());
  const auto width = [](const nlohmann::json& j) {
    return j["calibration"]["intervals"][1]["mean_width"].get<double>();
  };
  EXPECT_NEAR(width(trained), std::sqrt(s) * width(plain), 1e-6 * width(trained)) << "90% intervals";
  // The checkpoint keeps it: evaluate scores the recalibrated mixture.
  const nlohmann::json evaluated = run_json("evaluate " + ckpt + " --device cpu --json");
  EXPECT_DOUBLE_EQ(evaluated["variance_scale"].get<double>(), s);
  EXPECT_DOUBLE_EQ(evaluated["ensemble"]["nll"].get<double>(), trained["ensemble"]["nll"].get<double>());
  const Result text = run(std::string(kRegression) + " --quiet");
  EXPECT_THAT(text.out, HasSubstr("Recalibrated on the validation rows: predictive variance x"));
  const Result bad = run(std::string(kRegression) + " --recalibrate temperature");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("expected none or variance"));
}

TEST_F(Cli, AcquireRanksARegressionPool) {
  const std::string ckpt = path("run.ckpt");
  ASSERT_EQ(run(std::string(kRegression) + " --checkpoint " + ckpt).status, 0);
  const std::string pool = concrete_csv("pool.csv", 200, false);
  const Result top = run("acquire " + ckpt + " " + pool + " --count 12 -o " + path("top.csv"));
  ASSERT_EQ(top.status, 0) << top.out;
  std::string header;
  const auto rows = csv_rows(read_file(path("top.csv")), &header);
  EXPECT_EQ(header, "rank,row,score");
  ASSERT_EQ(rows.size(), 12u);
  std::set<int> seen;
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i][0], static_cast<double>(i + 1));
    EXPECT_GE(rows[i][1], 0);
    EXPECT_LT(rows[i][1], 200);
    seen.insert(static_cast<int>(rows[i][1]));
    if (i > 0) EXPECT_LE(rows[i][2], rows[i - 1][2]) << "top-b: scores descending";
  }
  EXPECT_EQ(seen.size(), 12u);
  // The top score is the largest epistemic std that predict reports for the pool.
  const Result predicted = run("predict " + ckpt + " " + pool + " -o " + path("pred.csv"));
  ASSERT_EQ(predicted.status, 0) << predicted.out;
  const auto pred = csv_rows(read_file(path("pred.csv")), &header);
  double largest = 0;
  for (const auto& p : pred) largest = std::max(largest, p[3]);
  EXPECT_NEAR(rows[0][2], largest, 1e-6 * largest);
  EXPECT_NEAR(rows[0][2], pred[static_cast<size_t>(rows[0][1])][3], 1e-6 * largest);

  const nlohmann::json sampled = run_json("acquire " + ckpt + " " + pool +
                                          " --count 12 --selection power --power 4 "
                                          "--seed 3 --strategy variance --json");
  EXPECT_EQ(sampled["strategy"], "variance");
  EXPECT_EQ(sampled["chosen"].size(), 12u);
  EXPECT_EQ(sampled, run_json("acquire " + ckpt + " " + pool +
                              " --count 12 --selection power --power 4 --seed 3 "
                              "--strategy variance --json"))
      << "seeded: the same batch again";
  const Result wrong = run("acquire " + ckpt + " " + pool + " --strategy bald");
  EXPECT_NE(wrong.status, 0);
  EXPECT_THAT(wrong.out, HasSubstr("regressor (use epistemic, variance, ucb or random)"));
  const Result too_many = run("acquire " + ckpt + " " + pool + " --count 201");
  EXPECT_NE(too_many.status, 0);
  EXPECT_THAT(too_many.out, HasSubstr("only 200 rows"));
}

TEST_F(Cli, AcquireRanksAClassificationPoolAndEvaluateScoresIt) {
  const std::string ckpt = path("cls.ckpt");
  const nlohmann::json trained = run_json(std::string(kClassifier) + " --json --checkpoint " + ckpt);
  const nlohmann::json c = trained["calibration"];
  for (const char* key : {"accuracy", "nll", "brier", "ece"}) EXPECT_TRUE(c[key].is_number()) << key << c.dump();
  EXPECT_EQ(c["ece_bins"], 15);
  EXPECT_EQ(c["accuracy"], trained["ensemble"]["accuracy"]);
  const Result text = run("evaluate " + ckpt + " --device cpu");
  EXPECT_THAT(text.out, HasSubstr("expected calibration error"));
  EXPECT_THAT(text.out, HasSubstr("Brier score"));
  // The pool: the wine table's feature columns (11), 150 rows.
  const std::string wine = read_file(data_dir() + "/wine-quality-red/data.txt");
  std::istringstream lines(wine);
  std::string pool;
  int n = 0;
  for (std::string line; n < 150 && std::getline(lines, line); ++n) {
    std::istringstream cells(line);
    std::vector<std::string> values;
    for (std::string v; cells >> v;) values.push_back(v);
    values.pop_back();  // the quality label
    for (size_t i = 0; i < values.size(); ++i) pool += (i ? "," : "") + values[i];
    pool += "\n";
  }
  write_file(path("pool.csv"), pool);
  for (const char* strategy : {"bald", "entropy", "margin", "variation-ratio", "random"}) {
    const nlohmann::json j =
        run_json("acquire " + ckpt + " " + path("pool.csv") + " --count 5 --json --strategy " + strategy);
    EXPECT_EQ(j["chosen"].size(), 5u) << strategy;
    EXPECT_EQ(j["pool_rows"], 150) << strategy;
  }
  const nlohmann::json bald = run_json("acquire " + ckpt + " " + path("pool.csv") + " --count 5 --json");
  EXPECT_EQ(bald["strategy"], "bald") << "a classifier's default";
  const Result wrong = run("acquire " + ckpt + " " + path("pool.csv") + " --strategy ucb");
  EXPECT_THAT(wrong.out, HasSubstr("classifier (use bald, batchbald, entropy, margin, variation-ratio or random)"));
  // BatchBALD: the first pick is BALD's with its score, then rows that raise the
  // batch's joint mutual information (each score a gain), distinct, seeded.
  const std::string batchbald = "acquire " + ckpt + " " + path("pool.csv") + " --count 8 --json --strategy batchbald";
  const nlohmann::json joint = run_json(batchbald);
  ASSERT_EQ(joint["chosen"].size(), 8u) << joint.dump();
  EXPECT_EQ(joint["chosen"][0]["row"], bald["chosen"][0]["row"]);
  EXPECT_NEAR(joint["chosen"][0]["score"].get<double>(), bald["chosen"][0]["score"].get<double>(), 1e-9);
  std::set<int64_t> rows;
  for (size_t i = 0; i < joint["chosen"].size(); ++i) {
    const nlohmann::json& r = joint["chosen"][i];
    rows.insert(r["row"].get<int64_t>());
    // Counted exactly for the first 4 picks (at most 10^4 configurations): no loss.
    if (i < 4) EXPECT_GE(r["score"].get<double>(), -1e-9) << "the joint information does not fall: " << r.dump();
  }
  EXPECT_EQ(rows.size(), 8u);
  EXPECT_EQ(joint, run_json(batchbald)) << "the same batch again";
  const Result sampled = run(batchbald + " --selection softmax");
  EXPECT_NE(sampled.status, 0);
  EXPECT_THAT(sampled.out, HasSubstr("use the selection top"));
}

}  // namespace
}  // namespace packtrain::cli_testing
