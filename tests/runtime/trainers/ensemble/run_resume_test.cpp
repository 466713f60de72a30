// The library's resume (runtime/trainers/ensemble/run_resume.h, multitask_resume.h): a run
// stopped at a checkpoint and resumed continues exactly as the uninterrupted run
// (bit for bit on the CPU, as `packtrain resume` is tested), and a checkpoint whose
// data changed since is refused with a UserError.
#include "packtrain/runtime/trainers/ensemble/run_resume.h"
#include "packtrain/base/user_error.h"
#include "packtrain/runtime/data/fingerprint.h"
#include "packtrain/runtime/data/labelled_texts.h"
#include "packtrain/runtime/data/run_data.h"
#include "packtrain/runtime/trainers/multitask/multitask_resume.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using packtrain::testing::ScopedTempDir;

void ignore_log(const std::string&) {}

// A small table file: y = x0 - 2 x1 plus a wiggle, 120 rows.
void write_table(const fs::path& path, double bump = 0.0) {
  std::ofstream out(path);
  out << "x0,x1,y\n";
  for (int i = 0; i < 120; ++i) {
    const double a = (i % 17) / 17.0, b = (i % 11) / 11.0;
    out << a << "," << b << "," << a - 2 * b + 0.1 * ((i * 7) % 5) + (i == 3 ? bump : 0.0) << "\n";
  }
}

EnsembleTrainerOptions small(int64_t epochs) {
  return EnsembleTrainerOptions().members(4).hidden(8).epochs(epochs).batch_size(16).log(&ignore_log);
}

// Trains `options` on the run's data and writes a checkpoint describing them, as
// `packtrain train --checkpoint` does.
std::unique_ptr<EnsembleTrainer> train_and_save(const DataArgs& args, const EnsembleTrainerOptions& options,
                                                const fs::path& checkpoint) {
  const SplitData data = load_split_data(args);
  auto trainer = std::make_unique<EnsembleTrainer>(options);
  const Dataset train = data.train(), val = data.validation();
  trainer->prepare(train.features, train.targets, val.features, val.targets);
  trainer->train();
  const RunDescription run{args, data.all.feature_names, data.all.target_name, fingerprint_hex(data.fingerprint)};
  trainer->save(checkpoint, to_json(run));
  return trainer;
}

TEST(RunResume, ContinuesExactlyAsTheUninterruptedRun) {
  ScopedTempDir dir("packtrain-run-resume");
  DataArgs args;  // the bundled concrete set, split 0, 10% validation
  const auto straight = train_and_save(args, small(6), dir.path() / "straight.ckpt");
  train_and_save(args, small(3), dir.path() / "half.ckpt");

  ResumedRun run = resume(open_resume((dir.path() / "half.ckpt").string()), {.epochs = 6, .log = &ignore_log});
  EXPECT_EQ(run.trainer->epoch(), 3);
  EXPECT_EQ(run.trainer->options().epochs(), 6);
  EXPECT_EQ(run.data.fingerprint, load_split_data(args).fingerprint) << "the run's own data reloaded";
  run.trainer->train();
  EXPECT_EQ(run.trainer->epoch(), 6);
  const at::Tensor x = run.data.test().features;
  EXPECT_TRUE(at::equal(run.trainer->predict(x).mean, straight->predict(x).mean)) << "bit for bit on the CPU";
  EXPECT_TRUE(at::equal(run.trainer->model().parameters().flat(), straight->model().parameters().flat()));
}

TEST(RunResume, ResumeWithDataEqualsTheUninterruptedRunAndRefusesOtherRows) {
  ScopedTempDir dir("packtrain-run-resume");
  DataArgs args;
  args.data = "python";  // rows given in memory, as the Python package's fit() saves them
  const SplitData data = load_split_data(DataArgs{});
  const Dataset train = data.train(), val = data.validation();
  EnsembleTrainer straight(small(4)), first(small(2));
  straight.fit(train.features, train.targets, val.features, val.targets);
  first.fit(train.features, train.targets, val.features, val.targets);
  first.save(dir.path() / "py.ckpt", to_json(RunDescription{args, data.all.feature_names, "y", ""}));

  const ResumeSource source = open_resume((dir.path() / "py.ckpt").string());
  EXPECT_FALSE(describes_its_data(source.run));
  EXPECT_THROW(resume(source, {.epochs = 4, .log = &ignore_log}), UserError) << "no data to reload";
  auto resumed = resume_with_data(source, {.epochs = 4, .log = &ignore_log}, train.features, train.targets,
                                  val.features, val.targets);
  resumed->train();
  EXPECT_TRUE(at::equal(resumed->model().parameters().flat(), straight.model().parameters().flat()));
  const at::Tensor other = train.targets + 1.0;
  EXPECT_THROW(
      resume_with_data(source, {.epochs = 4, .log = &ignore_log}, train.features, other, val.features, val.targets),
      UserError);
}

TEST(RunResume, RefusesChangedDataAndEpochsNotAhead) {
  ScopedTempDir dir("packtrain-run-resume");
  DataArgs args;
  args.data = (dir.path() / "table.csv").string();
  write_table(args.data);
  train_and_save(args, small(3), dir.path() / "run.ckpt");
  const ResumeSource source = open_resume((dir.path() / "run.ckpt").string());
  try {
    resume(source, {.epochs = 3, .log = &ignore_log});
    ADD_FAILURE() << "resuming to the checkpoint's own epoch trains nothing";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("is at epoch 3; give --epochs above it"), std::string::npos) << e.what();
  }
  write_table(args.data, /*bump=*/0.5);  // one target changed
  try {
    resume(source, {.epochs = 6, .log = &ignore_log});
    ADD_FAILURE() << "a checkpoint whose data changed resumed";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("resume continues a run on its own data only"), std::string::npos) << e.what();
  }
  EXPECT_THROW(open_resume((dir.path() / "missing.ckpt").string()), UserError);
}

// Multi-task: the run's files written as `multitask train` writes them; resumed
// through the library it ends where the uninterrupted run ends.
MultiTaskTrainerOptions tiny() {
  return MultiTaskTrainerOptions()
      .model(ensemble::PackedTransformerOptions().width(16).layers(1).heads(2).max_length(32).classes(2))
      .batch_size(8)
      .buckets({16, 32})
      .seed(5)
      .log(&ignore_log);
}

void write_texts(const fs::path& path, int rows, int salt) {
  std::ofstream out(path);
  for (int i = 0; i < rows; ++i)
    out << (i % 2) << "\t" << (i % 2 ? "yes the cat " : "no a dog ") << (i * salt) % 13 << "\n";
}

TEST(MultiTaskResume, ContinuesAsTheUninterruptedRunAndRefusesChangedFiles) {
  ScopedTempDir dir("packtrain-multitask-resume");
  MultiTaskRunFiles files{dir.path() / "train.tsv", dir.path() / "dev.tsv", 2, "", "", {}};
  write_texts(files.train, 40, 3);
  write_texts(files.dev, 16, 5);
  const LabelledTexts train = read_labelled_tsv(files.train, 2), dev = read_labelled_tsv(files.dev, 2);
  files.train_fingerprint = fingerprint_hex(fingerprint(train));
  files.dev_fingerprint = fingerprint_hex(fingerprint(dev));
  MultiTaskTrainer straight(tiny()), first(tiny());
  straight.set_training_data(train);
  first.set_training_data(train);
  for (int e = 0; e < 2; ++e) straight.train_epoch();
  first.train_epoch();
  const fs::path checkpoint = dir.path() / "mt.ckpt";
  first.save(checkpoint, files.to_json());

  ResumedMultiTask run = resume_multitask(MultiTaskCheckpoint::read(checkpoint), {.log = &ignore_log});
  EXPECT_EQ(run.trainer->epochs_done(), 1);
  EXPECT_EQ(run.files.epochs, 2) << "the run's own epoch count";
  EXPECT_EQ(run.dev.size(), dev.size());
  run.trainer->train_epoch();
  EXPECT_TRUE(at::equal(run.trainer->model().parameters().flat(), straight.model().parameters().flat()));

  write_texts(files.dev, 16, 7);  // the dev file edited since
  EXPECT_THROW(resume_multitask(MultiTaskCheckpoint::read(checkpoint), {.log = &ignore_log}), UserError);
  EXPECT_THROW(resume_multitask(MultiTaskCheckpoint::read(checkpoint), {.epochs = 1, .log = &ignore_log}), UserError);
}

}  // namespace
}  // namespace packtrain::runtime
