// The packtrain binary end to end, as a user runs it: train -> predict -> evaluate
// -> resume on bundled data, a resumed run equal to an uninterrupted one, Ctrl-C
// saving a checkpoint, the Python load of an export, config files, --help, and
// active learning's learning-curve files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(Cli, TrainJsonReportsEveryMemberAndAnEnsembleBetterThanTheAverageMember) {
  const nlohmann::json json = run_json("train --members 6 --epochs 60 --json --device cpu");
  ASSERT_EQ(json["members"].size(), 6u) << json.dump();
  double mean_rmse = 0;
  for (const auto& m : json["members"]) mean_rmse += m["rmse"].get<double>() / 6;
  const double ensemble_rmse = json["ensemble"]["rmse"].get<double>();
  // Concrete's target spans 2-83 MPa (std ~16.7): far better than the mean, and
  // averaging members does not hurt.
  EXPECT_LT(ensemble_rmse, 10.0);
  EXPECT_LE(ensemble_rmse, mean_rmse + 1e-9);
  EXPECT_EQ(json["test_rows"], 103);
  EXPECT_THAT(json["data"].get<std::string>(), HasSubstr("834 train / 93 validation / 103 test"));
}

TEST_F(Cli, TrainStopsOnTheEnsemblesValidationLossByDefaultAndNotWithoutValidationRows) {
  // A short patience so the run stops well before its epochs: every member at once,
  // at the ensemble's best epoch.
  const nlohmann::json stopped =
      run_json("train --data yacht --members 4 --hidden 32 --epochs 400 --patience 3 --json --device cpu");
  ASSERT_EQ(stopped["members"].size(), 4u) << stopped.dump();
  const int64_t best = stopped["members"][0]["best_epoch"].get<int64_t>();
  EXPECT_GT(best, 0);
  EXPECT_LT(best, 397) << "stopped early";
  for (const auto& m : stopped["members"]) {
    EXPECT_EQ(m["status"], "stopped") << m.dump();
    EXPECT_EQ(m["best_epoch"].get<int64_t>(), best) << "the ensemble decides for all of its members";
  }
  const Result text = run("train --data yacht --members 4 --hidden 32 --epochs 3 --device cpu");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("early stopping on the ensemble's validation loss (patience 50)"));
  // Without validation rows there is nothing to stop on: the default is off, not an error.
  const Result none = run("train --data yacht --members 4 --hidden 32 --epochs 3 --val-fraction 0 --device cpu");
  ASSERT_EQ(none.status, 0) << none.out;
  EXPECT_THAT(none.out, Not(HasSubstr("early stopping")));
  // Each member's own loss, on request: a member stops alone.
  const Result own = run("train --data yacht --members 4 --hidden 32 --epochs 3 --early-stopping member --device cpu");
  EXPECT_THAT(own.out, HasSubstr("early stopping on each member's validation loss (patience 50)"));
  const Result bad = run("train --data yacht --epochs 3 --early-stopping all --device cpu");
  EXPECT_NE(bad.status, 0);
  EXPECT_THAT(bad.out, HasSubstr("member or ensemble"));
}

// A second member architecture by name (ensemble/architectures.h): trained, saved,
// evaluated and resumed as the MLP is; export (MLP and CNN members only) refuses it, exit 2.
TEST_F(Cli, ResidualMlpMembersTrainEvaluateAndResumeAndExportRefusesThem) {
  const std::string ckpt = path("residual.ckpt");
  const Result trained =
      run("train --data yacht --architecture residual-mlp --members 3 --hidden 16 --depth 1 "
          "--epochs 4 --device cpu --checkpoint " +
          ckpt);
  ASSERT_EQ(trained.status, 0) << trained.out;
  EXPECT_THAT(trained.out, HasSubstr("1x16 residual-mlp"));
  const Result evaluated = run("evaluate " + ckpt);
  ASSERT_EQ(evaluated.status, 0) << evaluated.out;
  EXPECT_THAT(evaluated.out, HasSubstr("RMSE"));
  const Result resumed = run("resume " + ckpt + " --epochs 6");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_THAT(resumed.out, HasSubstr("residual-mlp"));
  const Result exported = run("export " + ckpt + " " + path("members.pt"));
  EXPECT_EQ(exported.status, 2) << exported.out;
  EXPECT_THAT(exported.out,
              HasSubstr("export writes MLP and CNN members only: this ensemble's members are residual-mlp"));
  const Result unknown = run("train --data yacht --architecture no-such-net --epochs 1 --device cpu");
  EXPECT_EQ(unknown.status, 2) << unknown.out;
  EXPECT_THAT(unknown.out, HasSubstr("unknown architecture 'no-such-net' (expected mlp"));
  EXPECT_THAT(unknown.out, HasSubstr("residual-mlp"));
}

// Convolutional members (ensemble/packed_cnn.h) over image and sequence arrays, whose
// sample shape comes from the data: trained, evaluated and resumed from a checkpoint;
// on a table, whose rows have no shape, refused (exit 2) saying what they need.
TEST_F(Cli, CnnMembersTrainOnImagesAndSequencesAndResumeAndATableIsRefused) {
  const std::string ckpt = path("cnn.ckpt");
  const nlohmann::json trained = run_json(
      "train --data optdigits --architecture cnn --channels 8,16 --hidden 32 --depth 1 --head classification "
      "--members 2 --epochs 3 --device cpu --json --checkpoint " +
      ckpt);
  EXPECT_GT(trained["ensemble"]["accuracy"].get<double>(), 0.8) << trained.dump();
  const Result evaluated = run("evaluate " + ckpt);
  ASSERT_EQ(evaluated.status, 0) << evaluated.out;
  EXPECT_THAT(evaluated.out, HasSubstr("accuracy"));
  const Result resumed = run("resume " + ckpt + " --epochs 4");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  const Result sequences =
      run("train --data mnist1d --architecture cnn --channels 8 --hidden 16 --depth 1 "
          "--head classification --members 2 --epochs 1 --device cpu");
  ASSERT_EQ(sequences.status, 0) << sequences.out;
  const Result table = run("train --data yacht --architecture cnn --epochs 1 --device cpu");
  EXPECT_EQ(table.status, 2) << table.out;
  EXPECT_THAT(table.out, HasSubstr("the cnn architecture needs the shape of each sample"));
}

TEST_F(Cli, TrainPredictEvaluateResumeOnBundledData) {
  const std::string ckpt = path("run.ckpt");
  const nlohmann::json trained = run_json(std::string("train ") + kSmall + " --json --checkpoint " + ckpt);
  ASSERT_TRUE(fs::exists(ckpt));
  // evaluate: the same test rows, the same metrics as train printed.
  const nlohmann::json evaluated = run_json("evaluate " + ckpt + " --json --device cpu");
  EXPECT_EQ(evaluated["ensemble"]["rmse"], trained["ensemble"]["rmse"]);
  EXPECT_EQ(evaluated["members"].size(), 4u);
  // predict: one row per input row, mean and std, per-member columns on request.
  const std::string input = concrete_csv("in.csv", 25, false);
  const Result predicted = run("predict " + ckpt + " " + input + " --members -o " + path("out.csv"));
  ASSERT_EQ(predicted.status, 0) << predicted.out;
  std::istringstream lines(read_file(path("out.csv")));
  std::string header, line;
  std::getline(lines, header);
  EXPECT_EQ(header, "mean,std,aleatoric_std,epistemic_std,lower_90,upper_90,member_0,member_1,member_2,member_3");
  int rows = 0;
  while (std::getline(lines, line)) {
    ++rows;
    double mean = 0, std = 0, member_sum = 0, skipped = 0;
    char comma = 0;
    std::istringstream cells(line);
    cells >> mean >> comma >> std;
    for (int c = 0; c < 4; ++c) cells >> comma >> skipped;  // the decomposition and the interval
    for (int k = 0; k < 4; ++k) {
      double m = 0;
      cells >> comma >> m;
      member_sum += m;
    }
    EXPECT_NEAR(mean, member_sum / 4, 1e-6 * std::abs(mean)) << "the mean of the member columns";
    EXPECT_GT(std, 0);
    EXPECT_GT(mean, 0) << "MPa, original units";
  }
  EXPECT_EQ(rows, 25);
  // evaluate on a table with features and target.
  const nlohmann::json on_table = run_json("evaluate " + ckpt + " " + concrete_csv("xy.csv", 50, true) + " --json");
  EXPECT_EQ(on_table["rows"], 50);
  // resume to 12 epochs == train 12 epochs straight.
  const nlohmann::json resumed =
      run_json("resume " + ckpt + " --epochs 12 --json --device cpu --checkpoint " + path("r.ckpt"));
  const nlohmann::json straight = run_json("train --members 4 --epochs 12 --hidden 32 --device cpu --json");
  EXPECT_EQ(resumed["epochs_run"], 12);
  EXPECT_EQ(resumed["ensemble"]["rmse"], straight["ensemble"]["rmse"]) << "resume continues exactly";
  EXPECT_EQ(resumed["members"][3]["nll"], straight["members"][3]["nll"]);
}

TEST_F(Cli, CtrlCSavesACheckpointThatResumes) {
  const std::string ckpt = path("int.ckpt"), log = path("progress.log");
  const std::string& exe = binary();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // No early stopping: the test is about the interrupt, and with patience a run
    // interrupted late (a slow or busy machine) could stop on its own before the
    // epochs the resume asks for (seen in CI: interrupted at 55, stopped at 64).
    execl(exe.c_str(), exe.c_str(), "train", "--epochs", "100000", "--members", "2", "--device", "cpu", "--patience",
          "0", "--quiet", "--checkpoint", ckpt.c_str(), "--log", log.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 600 && read_file(log).find("epoch    3/") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_THAT(read_file(log), HasSubstr("epoch    3/100000")) << "training made progress";
  kill(child, SIGINT);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  ASSERT_TRUE(fs::exists(ckpt));
  // The last epoch the log recorded is where the checkpoint stands (a fast machine
  // gets well past epoch 3 before the signal lands): resume 10 epochs beyond it.
  const std::string text = read_file(log);
  const size_t at = text.rfind("epoch ");
  ASSERT_NE(at, std::string::npos);
  const int interrupted = std::stoi(text.substr(text.find_first_not_of(' ', at + 6)));
  const nlohmann::json resumed =
      run_json("resume " + ckpt + " --epochs " + std::to_string(interrupted + 10) + " --json --device cpu");
  EXPECT_EQ(resumed["epochs_run"], interrupted + 10) << "interrupted after epoch " << interrupted;
}

// A checkpoint trained on the CPU is used on a GPU machine's default device (auto =
// CUDA): evaluate, predict, export and resume all work there, and the GPU's
// metrics are the CPU's up to float32 rounding. Runs where a GPU is; skips here.
TEST_F(Cli, ACpuCheckpointEvaluatesPredictsExportsAndResumesOnTheGpu) {
  const std::string unavailable = packtrain::testing::device_unavailable_reason(c10::Device(c10::kCUDA, 0));
  if (!unavailable.empty()) GTEST_SKIP() << unavailable;
  const std::string ckpt = path("cpu.ckpt");
  const nlohmann::json trained = run_json(std::string("train ") + kSmall + " --json --checkpoint " + ckpt);
  const nlohmann::json evaluated = run_json("evaluate " + ckpt + " --json --device cuda");
  EXPECT_NEAR(evaluated["ensemble"]["rmse"].get<double>(), trained["ensemble"]["rmse"].get<double>(),
              1e-4 * trained["ensemble"]["rmse"].get<double>());
  const std::string input = concrete_csv("in.csv", 25, false);
  const Result predicted = run("predict " + ckpt + " " + input + " --device cuda -o " + path("gpu.csv"));
  EXPECT_EQ(predicted.status, 0) << predicted.out;
  const Result exported = run("export " + ckpt + " " + path("m.pt"));
  EXPECT_EQ(exported.status, 0) << exported.out;
  // resume defaults to auto: the GPU.
  const Result resumed = run("resume " + ckpt + " --epochs 12 --json --quiet");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_THAT(resumed.out, ::testing::Not(HasSubstr("damaged or incompatible"))) << resumed.out;
}

TEST_F(Cli, PythonLoadsAnExportAndPredictsTheSame) {
  if (test_python().empty()) {
    GTEST_SKIP() << "no Python with torch and numpy was found at configure time (set PACKTRAIN_TEST_PYTHON)";
  }
  const std::string ckpt = path("m.ckpt");
  ASSERT_EQ(run(std::string("train ") + kSmall + " --quiet --checkpoint " + ckpt).status, 0);
  const Result exported = run("export " + ckpt + " " + path("m.pt"));
  ASSERT_EQ(exported.status, 0) << exported.out;
  const std::string input = concrete_csv("in.csv", 30, false);
  ASSERT_EQ(run("predict " + ckpt + " " + input + " -o " + path("cpp.csv")).status, 0);
  const Result py = run_command(test_python() + " " + source_dir() + "/scripts/load_packtrain_export.py " +
                                path("m.pt") + " " + input + " > " + path("py.csv"));
  ASSERT_EQ(py.status, 0) << py.out;
  std::istringstream cpp(read_file(path("cpp.csv"))), python(read_file(path("py.csv")));
  std::string a, b;
  std::getline(cpp, a);
  std::getline(python, b);
  int rows = 0;
  while (std::getline(cpp, a) && std::getline(python, b)) {
    double cm = 0, cs = 0, pm = 0, ps = 0;
    char comma = 0;
    std::istringstream(a) >> cm >> comma >> cs;
    std::istringstream(b) >> pm >> comma >> ps;
    EXPECT_NEAR(pm, cm, 1e-4 * std::abs(cm)) << "row " << rows;
    EXPECT_NEAR(ps, cs, 1e-4 * std::abs(cs)) << "row " << rows;
    ++rows;
  }
  EXPECT_EQ(rows, 30);
}

TEST_F(Cli, ConfigFileGivesFlagsAndRejectsUnknownKeys) {
  write_file(path("run.toml"), "members = 3\nepochs = 2\nhidden = 16\ndevice = \"cpu\"\n");
  const nlohmann::json json = run_json("train --config " + path("run.toml") + " --json");
  EXPECT_EQ(json["members"].size(), 3u);
  EXPECT_EQ(json["options"]["epochs"], 2);
  EXPECT_EQ(run_json("train --config " + path("run.toml") + " --epochs 3 --json")["options"]["epochs"], 3)
      << "the command line wins";
  write_file(path("bad.toml"), "members = 3\nmembrs = 4\n");
  const Result bad = run("train --config " + path("bad.toml") + " --device cpu");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("membrs"));
}

TEST_F(Cli, EverySubcommandExplainsItselfAndInfoNamesTheDevices) {
  for (const std::string sub :
       {"train", "resume", "predict", "evaluate", "export", "active-learn", "profile", "info"}) {
    const Result r = run(sub + " --help");
    EXPECT_EQ(r.status, 0) << sub;
    EXPECT_THAT(r.out, HasSubstr("Usage")) << sub;
  }
  EXPECT_THAT(run("train --help").out, HasSubstr("bundled UCI concrete"));
  EXPECT_THAT(run("active-learn --help").out, HasSubstr("--acquire"));
  const nlohmann::json info = run_json("info --json");
  EXPECT_EQ(info["devices"][0]["device"], "cpu");
  EXPECT_THAT(info["libtorch"].get<std::string>(), HasSubstr("2.11"));
}

// The sweep: 3 learning rates x 2 weight decays x 5 seeds, one 30-member pack,
// a row per configuration, the best by validation loss kept.
TEST_F(Cli, ASweepTrainsEveryConfigurationInOnePackAndKeepsTheBest) {
  const std::string ckpt = path("sweep.ckpt");
  const nlohmann::json j = run_json(
      "train --lr 1e-3,3e-3,1e-2 --weight-decay 0,1e-4 --members 5 --epochs 10 --hidden 16 "
      "--device cpu --json --select best --checkpoint " +
      ckpt);
  EXPECT_EQ(j["options"]["members"], 30);
  ASSERT_EQ(j["configurations"].size(), 6u) << j.dump();
  double best = 1e300;
  for (const auto& c : j["configurations"]) {
    EXPECT_EQ(c["members"], 5);
    best = std::min(best, c["val_loss"].get<double>());
    EXPECT_TRUE(c["test"]["rmse"].is_number());
  }
  int deselected = 0, kept_first = -1;
  for (size_t k = 0; k < j["members"].size(); ++k) {
    if (j["members"][k]["status"] == "deselected") {
      ++deselected;
    } else if (kept_first < 0) {
      kept_first = static_cast<int>(k);
    }
  }
  EXPECT_EQ(deselected, 25);
  ASSERT_GE(kept_first, 0);
  const nlohmann::json& kept = j["configurations"][static_cast<size_t>(kept_first / 5)];
  EXPECT_EQ(kept["val_loss"].get<double>(), best) << "the lowest validation loss is kept";
  EXPECT_DOUBLE_EQ(j["ensemble"]["rmse"].get<double>(), kept["test"]["rmse"].get<double>())
      << "the ensemble is the kept configuration's members";
  EXPECT_DOUBLE_EQ(run_json("evaluate " + ckpt + " --json --device cpu")["ensemble"]["rmse"].get<double>(),
                   j["ensemble"]["rmse"].get<double>());
  const Result text = run("train --lr 1e-3,1e-2 --members 2 --epochs 2 --hidden 8 --device cpu");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("Sweep: 2 configurations x 2 members"));
  const Result no_val = run("train --lr 1e-3,1e-2 --members 2 --epochs 2 --val-fraction 0 --select best --device cpu");
  EXPECT_NE(no_val.status, 0);
  EXPECT_THAT(no_val.out, HasSubstr("--select best chooses on validation rows"));
  const Result repeated = run("train --lr 1e-3,1e-3 --device cpu");
  EXPECT_NE(repeated.status, 0);
  EXPECT_THAT(repeated.out, HasSubstr("--lr: 0.001 is given twice (elements 1 and 2)"));
}

// --dropout takes a list as --lr does: a sweep axis of its own, in the table, the
// JSON and the --select best note; a resumed sweep keeps each member's rate.
TEST_F(Cli, ADropoutSweepTrainsInOnePack) {
  const std::string ckpt = path("dropout.ckpt");
  const std::string args =
      "train --dropout 0,0.2,0.5 --lr 3e-3,1e-2 --members 2 --epochs 4 --hidden 16 --patience 0 "
      "--device cpu --select best --checkpoint " +
      ckpt;
  const Result text = run(args);
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_THAT(text.out,
              HasSubstr("sweep: 6 configurations (hidden width x learning rate x weight decay x dropout) x 2 members"));
  EXPECT_THAT(text.out, HasSubstr("dropout"));
  EXPECT_THAT(text.out, ::testing::ContainsRegex(
                            "sweep: kept hidden 16, lr [0-9.e-]+, weight decay 0.0001, dropout (0|0.2|0.5) "));
  const nlohmann::json j = run_json(args + " --json");
  EXPECT_EQ(j["options"]["members"], 12);
  EXPECT_EQ(j["options"]["member_dropout"],
            nlohmann::json({0.0, 0.0, 0.2, 0.2, 0.5, 0.5, 0.0, 0.0, 0.2, 0.2, 0.5, 0.5}));
  ASSERT_EQ(j["configurations"].size(), 6u);
  EXPECT_EQ(j["configurations"][4]["lr"], 1e-2);
  EXPECT_EQ(j["configurations"][4]["dropout"], 0.2);
  const nlohmann::json resumed = run_json("resume " + ckpt + " --epochs 6 --device cpu --json -q");
  EXPECT_EQ(resumed["options"]["member_dropout"], j["options"]["member_dropout"]);
  const Result bad = run("train --dropout 0,1.5 --device cpu");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("dropout must be in [0, 1), got 1.5"));
}

TEST_F(Cli, ActiveLearnWritesTheLearningCurveAsCsvAndSvg) {
  const Result r =
      run("active-learn --data yacht --rounds 3 --initial 20 --acquire 10 --epochs 20 --members 3 --device cpu "
          "--csv " +
          path("curve.csv") + " --plot " + path("curve.svg"));
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string csv = read_file(path("curve.csv"));
  EXPECT_THAT(csv, HasSubstr("labelled"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 4) << csv;  // header + 3 rounds
  EXPECT_EQ(read_file(path("curve.svg")).rfind("<svg", 0), 0u);
}

}  // namespace
}  // namespace packtrain::cli_testing
