// The packtrain binary end to end, as a user runs it: train -> predict -> evaluate
// -> resume on bundled data, a resumed run equal to an uninterrupted one, Ctrl-C
// saving a checkpoint, the Python load of an export, config files, --help, and
// exit status 2 with a one-line message naming the file for each kind of bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct Result {
  int status;
  std::string out;  // stdout and stderr together
};

Result run_command(const std::string& command) {
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string out;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) out += buffer.data();
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

Result run(const std::string& args) { return run_command(std::string(PACKTRAIN_BINARY) + " " + args); }

// stdout only (JSON), stderr discarded.
nlohmann::json run_json(const std::string& args) {
  std::FILE* pipe = ::popen((std::string(PACKTRAIN_BINARY) + " " + args + " 2>/dev/null").c_str(), "r");
  std::string out;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) out += buffer.data();
  EXPECT_EQ(::pclose(pipe), 0) << args;
  return nlohmann::json::parse(out, nullptr, false);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// A shell fragment that kills $pid (SIGKILL) once `checkpoint` exists and half a
// second more has passed: midway through a run that has committed a checkpoint,
// however slowly the machine starts the processes.
std::string wait_then_kill(const std::string& checkpoint) {
  return "(while [ ! -e '" + checkpoint + "' ]; do sleep 0.1; done; sleep 0.5; kill -9 $pid)";
}

// A TCP port nothing listens on now (the kernel picks it), for ranks started by hand.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  if (fd >= 0) ::close(fd);
  EXPECT_GT(port, 0) << "no free port";
  return port;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("packtrain_cli_test_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    for (const auto& entry : fs::directory_iterator(dir_)) fs::remove(entry.path());
    fs::remove(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // A CSV of the first `rows` concrete rows: a header, 8 feature columns (+ target).
  std::string concrete_csv(const std::string& name, int rows, bool with_target) const {
    std::ifstream in(std::string(PACKTRAIN_SOURCE_DATA_DIR) + "/concrete/data.txt");
    std::string out = "cement,slag,ash,water,plasticizer,coarse,fine,age";
    out += with_target ? ",strength\n" : "\n";
    std::string line;
    for (int r = 0; r < rows && std::getline(in, line); ++r) {
      std::istringstream fields(line);
      std::string cell, row;
      for (int c = 0; c < (with_target ? 9 : 8) && fields >> cell; ++c) row += (c ? "," : "") + cell;
      out += row + "\n";
    }
    write_file(path(name), out);
    return path(name);
  }
  fs::path dir_;
};

constexpr const char* kSmall = "--members 4 --epochs 8 --hidden 32 --device cpu";

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
  EXPECT_EQ(header, "mean,std,member_0,member_1,member_2,member_3");
  int rows = 0;
  while (std::getline(lines, line)) {
    ++rows;
    double mean = 0, std = 0, member_sum = 0;
    char comma = 0;
    std::istringstream cells(line);
    cells >> mean >> comma >> std;
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
  const nlohmann::json resumed = run_json("resume " + ckpt + " --epochs 12 --json --device cpu --checkpoint " + path("r.ckpt"));
  const nlohmann::json straight = run_json("train --members 4 --epochs 12 --hidden 32 --device cpu --json");
  EXPECT_EQ(resumed["epochs_run"], 12);
  EXPECT_EQ(resumed["ensemble"]["rmse"], straight["ensemble"]["rmse"]) << "resume continues exactly";
  EXPECT_EQ(resumed["members"][3]["nll"], straight["members"][3]["nll"]);
}

TEST_F(Cli, CtrlCSavesACheckpointThatResumes) {
  const std::string ckpt = path("int.ckpt"), log = path("progress.log");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execl(PACKTRAIN_BINARY, PACKTRAIN_BINARY, "train", "--epochs", "100000", "--members", "2", "--device", "cpu",
          "--quiet", "--checkpoint", ckpt.c_str(), "--log", log.c_str(), static_cast<char*>(nullptr));
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

TEST_F(Cli, PythonLoadsAnExportAndPredictsTheSame) {
#ifndef PACKTRAIN_TEST_PYTHON
  GTEST_SKIP() << "no Python with torch and numpy was found at configure time";
#else
  const std::string ckpt = path("m.ckpt");
  ASSERT_EQ(run(std::string("train ") + kSmall + " --quiet --checkpoint " + ckpt).status, 0);
  const Result exported = run("export " + ckpt + " " + path("m.pt"));
  ASSERT_EQ(exported.status, 0) << exported.out;
  const std::string input = concrete_csv("in.csv", 30, false);
  ASSERT_EQ(run("predict " + ckpt + " " + input + " -o " + path("cpp.csv")).status, 0);
  const Result py = run_command(std::string(PACKTRAIN_TEST_PYTHON) + " " + PACKTRAIN_SOURCE_DIR +
                                "/scripts/load_packtrain_export.py " + path("m.pt") + " " + input + " > " +
                                path("py.csv"));
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
#endif
}

TEST_F(Cli, ConfigFileGivesFlagsAndRejectsUnknownKeys) {
  write_file(path("run.toml"), "members = 3\nepochs = 2\nhidden = 16\ndevice = \"cpu\"\n");
  const nlohmann::json json = run_json("train --config " + path("run.toml") + " --json");
  EXPECT_EQ(json["members"].size(), 3u);
  EXPECT_EQ(json["options"]["epochs"], 2);
  EXPECT_EQ(run_json("train --config " + path("run.toml") + " --epochs 3 --json")["options"]["epochs"], 3)
      << "the command line wins";
  write_file(path("bad.toml"), "members = 3\nmembrs = 4\n");
  const Result bad = run("train --config " + path("bad.toml"));
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("membrs"));
}

TEST_F(Cli, EverySubcommandExplainsItselfAndInfoNamesTheDevices) {
  for (const std::string sub : {"train", "resume", "predict", "evaluate", "export", "active-learn", "profile", "info"}) {
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

nlohmann::json rank0_json(const std::string& out);

// A tiny multi-task run: label 1 when a sentence starts with "yes".
constexpr const char* kTinyModel = "--width 16 --layers 1 --max-length 32 --batch 4 --device cpu -q";
const std::string kTinyShape = std::string(kTinyModel) + " --heads 2 --buckets 16,32";
const std::string kTinyMultitask = kTinyShape + " --epochs 2";

std::string yes_no_tsv(int rows) {
  std::string out;
  const char* words[] = {"the cat", "a dog ran", "on the mat", "it sat"};
  for (int i = 0; i < rows; ++i) out += std::string("src\t") + (i % 2 ? "1\t\tyes " : "0\t*\tno ") + words[i % 4] + ".\n";
  return out;
}

TEST_F(Cli, MultitaskTrainScoreGenerateFromACheckpoint) {
  write_file(path("train.tsv"), yes_no_tsv(24));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const nlohmann::json report = run_json("multitask train " + kTinyMultitask + " --train " +
                                         path("train.tsv") + " --dev " + path("dev.tsv") + " -o " + path("mt.ckpt") +
                                         " --json");
  ASSERT_TRUE(report.is_object());
  EXPECT_EQ(report["epochs"].size(), 2u);
  EXPECT_EQ(report["dev_metrics"]["examples"], 8);
  EXPECT_GT(report["dev_metrics"]["perplexity"].get<double>(), 1.0);
  EXPECT_TRUE(fs::exists(path("mt.ckpt")));

  const Result scored = run("multitask score " + path("mt.ckpt") + " 'yes the cat.' 'no a dog ran.' --device cpu");
  EXPECT_EQ(scored.status, 0) << scored.out;
  EXPECT_THAT(scored.out, HasSubstr("\tyes the cat."));
  EXPECT_THAT(scored.out, HasSubstr("\tno a dog ran."));

  const nlohmann::json generated = run_json("multitask generate " + path("mt.ckpt") +
                                            " --prompt 'yes the' --max-new-tokens 10 --seed 3 --score --json --device cpu");
  ASSERT_TRUE(generated.is_object());
  EXPECT_EQ(generated["continuations"].size(), 1u);
  EXPECT_EQ(generated["probabilities"].size(), 2u);
  EXPECT_EQ(run_json("multitask generate " + path("mt.ckpt") +
                     " --prompt 'yes the' --max-new-tokens 10 --seed 3 --json --device cpu")["continuations"],
            generated["continuations"])
      << "the same seed gives the same text";
}

TEST_F(Cli, MultitaskResumeEqualsTheUninterruptedRunAndConfigFilesWork) {
  write_file(path("train.tsv"), yes_no_tsv(16));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const std::string data = " --train " + path("train.tsv") + " --dev " + path("dev.tsv");
  ASSERT_EQ(run("multitask train " + kTinyShape + data + " --epochs 1 -o " + path("a.ckpt")).status, 0);
  const nlohmann::json resumed = run_json("multitask resume " + path("a.ckpt") + " --epochs 3 -q --json");
  // Epochs and width from a config file; the command line gives the rest.
  write_file(path("mt.toml"), "epochs = 3\nwidth = 16\n");
  const nlohmann::json straight = run_json("multitask train --config " + path("mt.toml") +
                                           " --layers 1 --max-length 32 --batch 4 --device cpu -q --heads 2 "
                                           "--buckets 16,32" + data + " -o " + path("b.ckpt") + " --json");
  ASSERT_TRUE(resumed.is_object() && straight.is_object());
  EXPECT_EQ(resumed["epochs"].size(), 2u);
  EXPECT_EQ(straight["epochs"].size(), 3u);
  EXPECT_EQ(resumed["dev_metrics"]["lm_loss"], straight["dev_metrics"]["lm_loss"]);
  EXPECT_EQ(resumed["dev_metrics"]["accuracy"], straight["dev_metrics"]["accuracy"]);
  const Result done = run("multitask resume " + path("a.ckpt") + " --epochs 3");
  EXPECT_EQ(done.status, 2);
  EXPECT_THAT(done.out, HasSubstr("is at epoch 3"));
}

TEST_F(Cli, MultitaskDataParallelEqualsOneProcessWithTheDoubledBatch) {
  write_file(path("train.tsv"), yes_no_tsv(32));
  write_file(path("dev.tsv"), yes_no_tsv(8));
  const std::string args = "multitask train " + kTinyShape + " --epochs 2 --train " + path("train.tsv") + " --dev " +
                           path("dev.tsv") + " --json";
  const nlohmann::json single = run_json(args + " -o " + path("one.ckpt"));
  const Result launched = run_command(std::string(PACKTRAIN_BINARY) + " launch --nproc 2 -- " + args + " -o " +
                                      path("two.ckpt") + " 2>/dev/null");
  ASSERT_EQ(launched.status, 0) << launched.out;
  const nlohmann::json parallel = rank0_json(launched.out);
  ASSERT_TRUE(parallel.is_object() && single.is_object()) << launched.out;
  // 2 ranks x 2 rows = one process's batch of 4 (kTinyModel's --batch 4).
  const double a = parallel["dev_metrics"]["lm_loss"].get<double>(), b = single["dev_metrics"]["lm_loss"].get<double>();
  EXPECT_NEAR(a, b, 1e-5 * std::abs(b));
  EXPECT_EQ(parallel["dev_metrics"]["accuracy"], single["dev_metrics"]["accuracy"]);
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

TEST_F(Cli, LaunchStartsRanksThatJoinOneGroupAndForwardsTheirOutput) {
  for (int n : {2, 3}) {
    const Result r = run("launch --nproc " + std::to_string(n) + " -- info --collectives");
    EXPECT_EQ(r.status, 0) << r.out;
    for (int rank = 0; rank < n; ++rank) {
      const std::string r_s = std::to_string(rank), n_s = std::to_string(n);
      EXPECT_THAT(r.out, HasSubstr("[rank " + r_s + "] rank " + r_s + " of " + n_s + " (local " + r_s + " of " + n_s + ")"))
          << r.out;
    }
    EXPECT_EQ(std::count_if(r.out.begin(), r.out.end(), [](char c) { return c == '\n'; }), n + 1) << r.out;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("WRONG")));
  }
  // A failing command fails the launch with its status; every rank's error is shown.
  const Result bad = run("launch --nproc 2 --grace 5 -- train --data " + path("missing.csv"));
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("[rank 0] packtrain: error:"));
  EXPECT_THAT(bad.out, HasSubstr("[rank 1] packtrain: error:"));
  EXPECT_EQ(run("launch --nproc 2").status, 2);
  // Rendezvous variables that do not add up are bad input, named.
  const Result no_addr = run_command("env RANK=0 WORLD_SIZE=2 " + std::string(PACKTRAIN_BINARY) + " info --collectives");
  EXPECT_EQ(no_addr.status, 2);
  EXPECT_THAT(no_addr.out, HasSubstr("MASTER_ADDR is not set"));
}

// The JSON a launched rank 0 printed (its lines carry the "[rank 0] " prefix).
nlohmann::json rank0_json(const std::string& out) {
  std::string json;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[rank 0] ", 0) == 0) json += line.substr(9) + "\n";
  }
  return nlohmann::json::parse(json, nullptr, false);
}

TEST_F(Cli, DataParallelTwoRanksEqualOneProcessWithTheDoubledBatch) {
  const std::string args = "train --members 4 --epochs 12 --hidden 32 --batch 64 --device cpu --json --quiet";
  const nlohmann::json single = run_json(args);
  // (Checksums compared every 4 steps too: the epoch runs in pieces, the same steps.)
  const Result launched = run_command(std::string(PACKTRAIN_BINARY) + " launch --nproc 2 -- " + args +
                                      " --rank-check-every 4 2>/dev/null");
  ASSERT_EQ(launched.status, 0) << launched.out;
  EXPECT_THAT(launched.out, ::testing::Not(HasSubstr("[rank 1] {"))) << "only rank 0 reports";
  const nlohmann::json parallel = rank0_json(launched.out);
  ASSERT_TRUE(parallel.is_object()) << launched.out;
  EXPECT_EQ(parallel["data_parallel"]["global_batch"], 64);
  EXPECT_EQ(parallel["data_parallel"]["per_rank_batch"], 32);
  // Per-rank batch 32 on each of 2 ranks, gradients averaged: the batch-64 run.
  const auto close = [](double a, double b) { return std::abs(a - b) <= 1e-6 * std::abs(b); };
  EXPECT_TRUE(close(parallel["ensemble"]["rmse"].get<double>(), single["ensemble"]["rmse"].get<double>()))
      << parallel["ensemble"] << " vs " << single["ensemble"];
  ASSERT_EQ(parallel["members"].size(), single["members"].size());
  for (size_t k = 0; k < single["members"].size(); ++k) {
    EXPECT_TRUE(close(parallel["members"][k]["rmse"].get<double>(), single["members"][k]["rmse"].get<double>()))
        << "member " << k;
  }
  // One launched process runs the data-parallel path (a group of one) and changes nothing.
  const Result one = run_command(std::string(PACKTRAIN_BINARY) + " launch --nproc 1 -- train --members 4 --epochs 12 "
                                 "--hidden 32 --batch 64 --device cpu --json 2>&1");
  ASSERT_EQ(one.status, 0) << one.out;
  const nlohmann::json grouped = rank0_json(one.out);
  ASSERT_TRUE(grouped.is_object()) << one.out;
  EXPECT_EQ(grouped["data_parallel"]["ranks"], 1);
  EXPECT_EQ(grouped["data_parallel"]["per_rank_batch"], 64);
  const nlohmann::json batch64 = run_json("train --members 4 --epochs 12 --hidden 32 --batch 64 --device cpu --json --quiet");
  EXPECT_EQ(grouped["ensemble"]["rmse"], batch64["ensemble"]["rmse"]);
  // A global batch that does not split evenly is refused, by name.
  const Result odd = run("launch --nproc 2 -- train --members 2 --epochs 1 --batch 63 --device cpu");
  EXPECT_EQ(odd.status, 2) << odd.out;
  EXPECT_THAT(odd.out, HasSubstr("does not split into 2 equal per-rank batches"));
}

TEST_F(Cli, DataParallelResumeEqualsTheUninterruptedRun) {
  const std::string args = "--members 3 --hidden 16 --batch 64 --device cpu --quiet";
  const Result full = run_command(std::string(PACKTRAIN_BINARY) + " launch --nproc 2 -- train " + args +
                                  " --epochs 6 --json 2>/dev/null");
  ASSERT_EQ(full.status, 0) << full.out;
  ASSERT_EQ(run("launch --nproc 2 -- train " + args + " --epochs 3 --checkpoint " + path("dp.ckpt")).status, 0);
  const Result resumed = run_command(std::string(PACKTRAIN_BINARY) + " launch --nproc 2 -- resume " + path("dp.ckpt") +
                                     " --epochs 6 --quiet --json 2>/dev/null");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  const nlohmann::json a = rank0_json(full.out), b = rank0_json(resumed.out);
  ASSERT_TRUE(a.is_object() && b.is_object());
  EXPECT_EQ(b["epochs_run"], 6);
  EXPECT_EQ(a["ensemble"]["rmse"], b["ensemble"]["rmse"]);
  EXPECT_EQ(a["ensemble"]["nll"], b["ensemble"]["nll"]);
}

TEST_F(Cli, DataParallelRunKilledMidwayResumesLikeAnUninterruptedRun) {
  const std::string port = std::to_string(free_port());
  const std::string env = "env WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 PACKTRAIN_COLLECTIVE_TIMEOUT=10 MASTER_PORT=" + port;
  const std::string common = " --members 3 --hidden 8 --batch 64 --device cpu --quiet --epochs 500";
  const std::string train = std::string(PACKTRAIN_BINARY) + " --threads 1 train" + common + " --checkpoint-every 1 --checkpoint " +
                            path("dp.ckpt");
  // Rank 1 dies (SIGKILL) mid-run; rank 0 has committed a checkpoint after every epoch.
  const Result r = run_command("(" + env + " RANK=1 " + train + " >/dev/null 2>&1 & pid=$!; " +
                               wait_then_kill(path("dp.ckpt")) + " & " + env + " RANK=0 " + train +
                               "; echo \"rank0 exit $?\")");
  ASSERT_THAT(r.out, HasSubstr("rank0 exit 1")) << "the run ended before the kill: " << r.out;
  // The last checkpoint loads, and restarting from it finishes the run as if never killed.
  EXPECT_EQ(run("evaluate " + path("dp.ckpt") + " --device cpu").status, 0);
  const Result resumed = run_command(std::string(PACKTRAIN_BINARY) + " launch --nproc 2 -- --threads 1 resume " +
                                     path("dp.ckpt") + " --quiet --json 2>/dev/null");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  const Result straight = run_command(std::string(PACKTRAIN_BINARY) + " launch --nproc 2 -- --threads 1 train" + common +
                                      " --json 2>/dev/null");
  ASSERT_EQ(straight.status, 0) << straight.out;
  const nlohmann::json a = rank0_json(resumed.out), b = rank0_json(straight.out);
  ASSERT_TRUE(a.is_object() && b.is_object()) << resumed.out << straight.out;
  EXPECT_EQ(a["epochs_run"], 500);
  EXPECT_EQ(a["ensemble"]["rmse"], b["ensemble"]["rmse"]);
  EXPECT_EQ(a["ensemble"]["nll"], b["ensemble"]["nll"]);
}

TEST_F(Cli, RanksThatDivergeStopAtTheNextChecksumComparison) {
  // Two ranks with different learning rates: same gradients, different weights after
  // the first update. With --rank-check-every 5 both stop at step 5, not at the
  // epoch's end (13 steps of 64 rows).
  const std::string port = std::to_string(free_port());
  const std::string env = "env WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port;
  const std::string train = std::string(PACKTRAIN_BINARY) +
                            " train --members 2 --hidden 8 --epochs 3 --batch 64 --device cpu --quiet "
                            "--rank-check-every 5 --lr ";
  const Result r = run_command("(" + env + " RANK=1 " + train + "0.02 >/dev/null 2>&1 & " + env + " RANK=0 " + train +
                               "0.01; echo \"rank0 exit $?\"; wait)");
  EXPECT_THAT(r.out, HasSubstr("rank0 exit 1")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("parameters differ across ranks after step 5 (epoch 1): 1 rank(s) disagree with rank 0"))
      << r.out;
}

TEST_F(Cli, AKilledRankEndsTheOthersWithAnErrorNamingTheStep) {
  const std::string port = std::to_string(free_port());
  const std::string env = "env WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port;
  const std::string train = std::string(PACKTRAIN_BINARY) + " train --members 2 --hidden 8 --epochs 100000 --quiet";
  const auto start = std::chrono::steady_clock::now();
  const Result r = run_command("(" + env + " RANK=1 " + train + " >/dev/null 2>&1 & pid=$!; (sleep 3; kill -9 $pid) & " +
                               env + " RANK=0 " + train + "; echo \"rank0 exit $?\")");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(r.out, HasSubstr("rank0 exit 1")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("failed on rank 0 of 2")) << r.out;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("all-reduce at step [0-9]+ failed|checksum")) << r.out;
  EXPECT_LT(seconds, 70) << "the surviving rank must not hang";
}

TEST_F(Cli, AStuckRankEndsTheOthersAfterTheCollectiveTimeout) {
  const std::string port = std::to_string(free_port());
  const std::string env =
      "env WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 PACKTRAIN_COLLECTIVE_TIMEOUT=4 MASTER_PORT=" + port;
  const std::string train = std::string(PACKTRAIN_BINARY) + " train --members 2 --hidden 8 --epochs 100000 --quiet";
  const auto start = std::chrono::steady_clock::now();
  // Rank 1 is stopped (not dead: its sockets stay open) after 3 s.
  const Result r = run_command("(" + env + " RANK=1 " + train + " >/dev/null 2>&1 & pid=$!; (sleep 3; kill -STOP $pid) & " +
                               env + " RANK=0 " + train + "; echo \"rank0 exit $?\"; kill -9 $pid)");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(r.out, HasSubstr("rank0 exit 1")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("failed on rank 0 of 2 (timeout 4000 ms)")) << r.out;
  EXPECT_LT(seconds, 40) << "the timeout, not a hang";
  const Result bad = run_command("env PACKTRAIN_COLLECTIVE_TIMEOUT=soon RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 " +
                                 std::string(PACKTRAIN_BINARY) + " train --epochs 1");
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.out, HasSubstr("PACKTRAIN_COLLECTIVE_TIMEOUT='soon'"));
}

// The shard files a member-parallel checkpoint directory holds.
std::vector<std::string> shard_files(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".shard-") != std::string::npos) names.push_back(e.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(Cli, MemberParallelEqualsOneProcessAndItsShardsEvaluateAnywhere) {
  const std::string args = "train --members 5 --epochs 10 --hidden 32 --batch 64 --device cpu --json --quiet";
  const nlohmann::json single = run_json(args);
  const Result launched = run_command(std::string(PACKTRAIN_BINARY) + " launch --nproc 2 -- " + args +
                                      " --member-parallel --checkpoint " + path("mp.ckpt") + " 2>/dev/null");
  ASSERT_EQ(launched.status, 0) << launched.out;
  const nlohmann::json parallel = rank0_json(launched.out);
  ASSERT_TRUE(parallel.is_object()) << launched.out;
  // Members 0-2 on rank 0, 3-4 on rank 1, each initialized and trained as in one process.
  ASSERT_EQ(parallel["members"].size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_DOUBLE_EQ(parallel["members"][k]["rmse"].get<double>(), single["members"][k]["rmse"].get<double>())
        << "member " << k;
  }
  EXPECT_DOUBLE_EQ(parallel["ensemble"]["rmse"].get<double>(), single["ensemble"]["rmse"].get<double>());
  // One shard per rank (named by its epoch), then the manifest; one process
  // evaluates and predicts with them all.
  EXPECT_TRUE(fs::exists(path("mp.ckpt.e10.shard-0-of-2")));
  EXPECT_TRUE(fs::exists(path("mp.ckpt.e10.shard-1-of-2")));
  const nlohmann::json manifest = nlohmann::json::parse(read_file(path("mp.ckpt")), nullptr, false);
  EXPECT_EQ(manifest["format"], "packtrain-member-parallel-1");
  EXPECT_EQ(manifest["epoch"], 10);
  EXPECT_EQ(manifest["ranks"], 2);
  const nlohmann::json evaluated = run_json("evaluate " + path("mp.ckpt") + " --json --device cpu");
  ASSERT_TRUE(evaluated.is_object());
  EXPECT_EQ(evaluated["shards"], 2);
  EXPECT_DOUBLE_EQ(evaluated["ensemble"]["rmse"].get<double>(), single["ensemble"]["rmse"].get<double>());
  const Result predicted = run("predict " + path("mp.ckpt") + " " + concrete_csv("in.csv", 3, false) +
                               " --members --device cpu");
  ASSERT_EQ(predicted.status, 0) << predicted.out;
  EXPECT_THAT(predicted.out, HasSubstr("mean,std,member_0,member_1,member_2,member_3,member_4\n"));
  const Result alone = run("train --members 2 --epochs 1 --member-parallel --device cpu");
  EXPECT_EQ(alone.status, 2);
  EXPECT_THAT(alone.out, HasSubstr("multi-process run"));
  // The manifest resumes on another number of ranks: 3 ranks re-shard the 5 members
  // (2/2/1) from the 2 shards and continue exactly as one process would have.
  const Result three = run_command(std::string(PACKTRAIN_BINARY) + " launch --nproc 3 -- resume " + path("mp.ckpt") +
                                   " --epochs 13 --json --quiet 2>/dev/null");
  ASSERT_EQ(three.status, 0) << three.out;
  const nlohmann::json resharded = rank0_json(three.out);
  ASSERT_TRUE(resharded.is_object()) << three.out;
  const nlohmann::json longer = run_json(
      "train --members 5 --epochs 13 --hidden 32 --batch 64 --device cpu --json --quiet");
  EXPECT_EQ(resharded["epochs_run"], 13);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_DOUBLE_EQ(resharded["members"][k]["rmse"].get<double>(), longer["members"][k]["rmse"].get<double>())
        << "member " << k;
  }
  EXPECT_EQ(nlohmann::json::parse(read_file(path("mp.ckpt")), nullptr, false)["ranks"], 3);
  EXPECT_EQ(shard_files(dir_), (std::vector<std::string>{"mp.ckpt.e13.shard-0-of-3", "mp.ckpt.e13.shard-1-of-3",
                                                          "mp.ckpt.e13.shard-2-of-3"}));
  const Result unlaunched = run("resume " + path("mp.ckpt") + " --epochs 14");
  EXPECT_EQ(unlaunched.status, 2) << unlaunched.out;
  EXPECT_THAT(unlaunched.out, HasSubstr("launch --nproc 1"));
}

TEST_F(Cli, MemberParallelCheckpointHoldsTheBestWeightsTheRunReported) {
  // Early stopping restores each member's best weights after the last epoch; the
  // committed manifest must hold those (the last periodic save does not).
  const Result launched = run_command(std::string(PACKTRAIN_BINARY) +
                                      " launch --nproc 2 -- train --members 3 --hidden 16 --epochs 12 --lr 0.08 --patience 50 "
                                      "--checkpoint-every 4 --device cpu --json --quiet --member-parallel --checkpoint " +
                                      path("mp.ckpt") + " 2>/dev/null");
  ASSERT_EQ(launched.status, 0) << launched.out;
  const nlohmann::json trained = rank0_json(launched.out);
  ASSERT_TRUE(trained.is_object()) << launched.out;
  const nlohmann::json evaluated = run_json("evaluate " + path("mp.ckpt") + " --json --device cpu");
  ASSERT_TRUE(evaluated.is_object());
  EXPECT_EQ(evaluated["ensemble"]["rmse"], trained["ensemble"]["rmse"]);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(evaluated["members"][k]["rmse"], trained["members"][k]["rmse"]) << k;
}

TEST_F(Cli, MemberParallelClassificationEqualsOneProcess) {
  const std::string args = "train --data wine-quality-red --head classification --members 3 --epochs 4 --hidden 16 "
                           "--device cpu --json --quiet";
  const nlohmann::json single = run_json(args);
  const Result launched =
      run_command(std::string(PACKTRAIN_BINARY) + " launch --nproc 2 -- " + args + " --member-parallel 2>/dev/null");
  ASSERT_EQ(launched.status, 0) << launched.out;
  const nlohmann::json parallel = rank0_json(launched.out);
  ASSERT_TRUE(parallel.is_object()) << launched.out;
  ASSERT_EQ(parallel["members"].size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_DOUBLE_EQ(parallel["members"][k]["accuracy"].get<double>(), single["members"][k]["accuracy"].get<double>());
    EXPECT_DOUBLE_EQ(parallel["members"][k]["nll"].get<double>(), single["members"][k]["nll"].get<double>());
  }
  EXPECT_DOUBLE_EQ(parallel["ensemble"]["accuracy"].get<double>(), single["ensemble"]["accuracy"].get<double>());
  EXPECT_DOUBLE_EQ(parallel["ensemble"]["nll"].get<double>(), single["ensemble"]["nll"].get<double>());
  // Per-member batch orders depend on the sharding: such a run re-shards by no means.
  ASSERT_EQ(run("launch --nproc 2 -- train --members 3 --epochs 1 --hidden 8 --device cpu --quiet --order bootstrap "
                "--member-parallel --checkpoint " + path("boot.ckpt")).status, 0);
  const Result reshard = run("launch --nproc 3 -- resume " + path("boot.ckpt") + " --epochs 2");
  EXPECT_EQ(reshard.status, 2) << reshard.out;
  EXPECT_THAT(reshard.out, HasSubstr("bootstrap batch orders, which depend on how the members were sharded"));
}

TEST_F(Cli, MemberParallelRunKilledMidwayResumesFromItsLastCommitLikeAnUninterruptedRun) {
  const std::string port = std::to_string(free_port());
  const std::string env = "env WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 PACKTRAIN_COLLECTIVE_TIMEOUT=10 MASTER_PORT=" + port;
  const std::string common = " --members 3 --hidden 8 --batch 64 --device cpu --quiet";
  const std::string train = std::string(PACKTRAIN_BINARY) + " train" + common +
                            " --epochs 100000 --member-parallel --checkpoint-every 1 --checkpoint " + path("mp.ckpt");
  // Rank 1 dies (SIGKILL) while both commit a checkpoint after every epoch.
  const Result r = run_command("(" + env + " RANK=1 " + train + " >/dev/null 2>&1 & pid=$!; " +
                               wait_then_kill(path("mp.ckpt")) + " & " + env + " RANK=0 " + train +
                               "; echo \"rank0 exit $?\")");
  EXPECT_THAT(r.out, HasSubstr("rank0 exit 1")) << r.out;
  // The last committed manifest and its shards load.
  const nlohmann::json manifest = nlohmann::json::parse(read_file(path("mp.ckpt")), nullptr, false);
  ASSERT_TRUE(manifest.is_object()) << r.out;
  const int epoch = manifest["epoch"].get<int>();
  ASSERT_GE(epoch, 1);
  for (const auto& shard : manifest["shards"]) EXPECT_TRUE(fs::exists(path(shard["file"].get<std::string>())));
  EXPECT_EQ(run("evaluate " + path("mp.ckpt") + " --device cpu").status, 0);
  // Restarting from it continues the run: the same members as a run never interrupted.
  const std::string until = " --epochs " + std::to_string(epoch + 3);
  const Result resumed = run_command(std::string(PACKTRAIN_BINARY) + " launch --nproc 2 -- resume " + path("mp.ckpt") +
                                     until + " --json --quiet 2>/dev/null");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  const Result straight = run_command(std::string(PACKTRAIN_BINARY) + " launch --nproc 2 -- train" + common + until +
                                      " --member-parallel --json 2>/dev/null");
  ASSERT_EQ(straight.status, 0) << straight.out;
  const nlohmann::json a = rank0_json(resumed.out), b = rank0_json(straight.out);
  ASSERT_TRUE(a.is_object() && b.is_object()) << resumed.out << straight.out;
  EXPECT_EQ(a["epochs_run"], epoch + 3);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(a["members"][k]["rmse"], b["members"][k]["rmse"]) << "member " << k;
  EXPECT_EQ(a["ensemble"]["nll"], b["ensemble"]["nll"]);
  // The resumed run committed in place and removed every earlier generation.
  const std::string e = std::to_string(epoch + 3);
  EXPECT_EQ(shard_files(dir_), (std::vector<std::string>{"mp.ckpt.e" + e + ".shard-0-of-2", "mp.ckpt.e" + e + ".shard-1-of-2"}));
}

TEST_F(Cli, ActiveLearnWritesTheLearningCurveAsCsvAndSvg) {
  const Result r = run("active-learn --data yacht --rounds 3 --initial 20 --acquire 10 --epochs 20 --members 3 --device cpu "
                       "--csv " + path("curve.csv") + " --plot " + path("curve.svg"));
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string csv = read_file(path("curve.csv"));
  EXPECT_THAT(csv, HasSubstr("labelled"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 4) << csv;  // header + 3 rounds
  EXPECT_EQ(read_file(path("curve.svg")).rfind("<svg", 0), 0u);
}

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
      {"batch larger than the training set", good, "train --data {f} --batch 64 --test-fraction 0.2", "batch size 64"},
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
    const Result r = run(args + " --epochs 1 --checkpoint " + path("never.ckpt"));
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
      {"resume " + path("truncated.ckpt"), "truncated"},
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

}  // namespace
