// EnsembleTrainer end to end on small data: early stopping per member, or per
// ensemble (a sweep's configurations), with best weights restored, a diverging member frozen while the others train,
// resume from a checkpoint equal to an uninterrupted run, classification, bad checkpoints.
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/uci_dataset.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_steps.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_validation.h"
#include "packtrain/runtime/trainers/ensemble/hyperparameter_sweep.h"
#include "tests/runtime/trainers/trainer_test_data.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using packtrain::testing::all_close;
using packtrain::testing::DeviceTest;
using trainer_testing::Data;
using trainer_testing::ignore_log;
using trainer_testing::make_data;
using trainer_testing::small_options;

// CPU runs the same arithmetic in the same order: resumed == uninterrupted exactly.
double tolerance(const c10::Device& d) { return d.is_cuda() ? 1e-6 : 0.0; }

fs::path temp_file(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("packtrain_trainer_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

class EnsembleTrainerTest : public DeviceTest {};

// A trainer of `options` prepared on d (with its validation rows) and trained for
// `epochs` epochs, as a run stopped there.
std::unique_ptr<EnsembleTrainer> trained_for(const EnsembleTrainerOptions& options, const Data& d, int64_t epochs) {
  auto trainer = std::make_unique<EnsembleTrainer>(options);
  trainer->prepare(d.x, d.y, d.val_x, d.val_y);
  trainer->train([epochs](const EpochReport& r) { return r.epoch < epochs; });
  return trainer;
}

TEST_P(EnsembleTrainerTest, TrainsAndReportsMetricsInOriginalUnits) {
  const Data d = make_data(200, 50);
  EnsembleTrainer trainer(small_options(device()).epochs(40));
  std::vector<double> losses;
  trainer.fit(d.x, d.y, {}, {}, [&](const EpochReport& r) {
    losses.push_back(r.train_loss);
    EXPECT_EQ(r.steps, 200 / 16);
    EXPECT_TRUE(std::isnan(r.val_loss)) << "no validation data";
    return true;
  });
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_LT(losses.back(), losses.front() - 0.5) << "the Gaussian NLL falls";
  const EnsembleMetrics m = trainer.evaluate(d.val_x, d.val_y);
  const double target_std = d.val_y.std().item<double>();
  EXPECT_LT(m.ensemble.rmse, 0.6 * target_std) << "better than predicting the mean";
  const EnsemblePrediction p = trainer.predict(d.val_x);
  EXPECT_NEAR(p.mean.mean().item<double>(), d.val_y.mean().item<double>(), 0.5) << "original units, not standardized";
  EXPECT_TRUE(all_close(p.spread, p.member_mean.std(0, false), 1e-12));
  EXPECT_TRUE((p.variance >= p.spread.square() - 1e-9).all().item<bool>()) << "mixture variance includes the spread";
}

TEST_P(EnsembleTrainerTest, PreparedAgainOnSameShapedDataKeepsItsStepsAndEqualsAFreshTrainer) {
  const Data first = make_data(160, 40);
  Data second = make_data(160, 40);
  second.x = second.x * 3 - 2;  // other rows and other standardization, the same shapes
  second.y = second.y.flip(0);
  EnsembleTrainer trainer(small_options(device()));
  trainer.fit(first.x, first.y, first.val_x, first.val_y);
  EnsembleSteps* const steps = &trainer.steps();
  const void* const weights = trainer.model().parameters().flat().data_ptr();
  const int64_t captured = steps->unrolled_step().captures() + steps->single_step().captures();
  trainer.fit(second.x, second.y, second.val_x, second.val_y);
  EXPECT_EQ(&trainer.steps(), steps) << "the steps were rebuilt";
  EXPECT_EQ(trainer.model().parameters().flat().data_ptr(), weights) << "the pack was rebuilt";
  EXPECT_EQ(steps->unrolled_step().captures() + steps->single_step().captures(), captured) << "re-captured";
  if (device().is_cuda()) {
    EXPECT_GT(captured, 0) << "a GPU captures the step once";
  }

  EnsembleTrainer fresh(small_options(device()));
  fresh.fit(second.x, second.y, second.val_x, second.val_y);
  EXPECT_TRUE(all_close(trainer.predict(first.x).mean, fresh.predict(first.x).mean, tolerance(device())));
  EXPECT_EQ(trainer.val_loss_history(), fresh.val_loss_history());
  // Other shapes: new steps, still equal to a fresh trainer.
  trainer.fit(second.x.narrow(0, 0, 100), second.y.narrow(0, 0, 100));
  EnsembleTrainer other(small_options(device()));
  other.fit(second.x.narrow(0, 0, 100), second.y.narrow(0, 0, 100));
  EXPECT_TRUE(all_close(trainer.predict(first.x).mean, other.predict(first.x).mean, tolerance(device())));
}

TEST_P(EnsembleTrainerTest, EarlyStoppingStopsMembersOneByOneAndRestoresTheirBestWeights) {
  const Data d = make_data(96, 40);
  // A high learning rate makes the validation loss noisy, so members stop at different epochs.
  EnsembleTrainer trainer(small_options(device()).members(6).epochs(150).lr(3e-2).patience(4));
  std::vector<EpochReport> reports;
  trainer.fit(d.x, d.y, d.val_x, d.val_y, [&](const EpochReport& r) {
    reports.push_back(r);
    return true;
  });
  int stopped = 0;
  std::set<int64_t> ends;
  for (const MemberState& s : trainer.member_states()) {
    if (s.status != MemberStatus::kStopped) continue;
    ++stopped;
    ends.insert(s.ended_epoch);
    EXPECT_EQ(s.ended_epoch - s.best_epoch, 4) << "stops after `patience` epochs without improvement";
  }
  ASSERT_GE(stopped, 2) << "members stopped early";
  EXPECT_GE(ends.size(), 2u) << "each member stops on its own";
  EXPECT_LT(reports.size(), 150u) << "the run ends when no member trains";
  EXPECT_EQ(reports.back().active, 0);
  // Restored best weights: each member's validation loss now equals its best.
  const at::Tensor val = trainer.steps()
                             .evaluate(trainer.x_scale().transform(d.val_x).to(at::kFloat),
                                       trainer.y_scale().transform(d.val_y).to(at::kFloat))
                             .cpu();
  for (int64_t k = 0; k < 6; ++k) {
    EXPECT_NEAR(val[k].item<double>(), trainer.member_states()[k].best_loss, 1e-5) << "member " << k;
  }
}

TEST_P(EnsembleTrainerTest, ADivergingMemberIsFrozenAndTheOthersKeepTraining) {
  const Data d = make_data(128, 40);
  EnsembleTrainer trainer(small_options(device()).epochs(20));
  trainer.prepare(d.x, d.y, d.val_x, d.val_y);
  at::Tensor lr = trainer.optimizer().lr().cpu().clone();
  lr[2] = 1e12;  // member 2 blows up
  trainer.optimizer().set_lr(lr);
  std::vector<std::string> events;
  trainer.train([&](const EpochReport& r) {
    events.insert(events.end(), r.events.begin(), r.events.end());
    return true;
  });
  const auto& states = trainer.member_states();
  EXPECT_EQ(states[2].status, MemberStatus::kDiverged);
  ASSERT_FALSE(events.empty());
  EXPECT_NE(events.front().find("member 2 diverged"), std::string::npos) << events.front();
  for (int64_t k : {0, 1, 3}) EXPECT_EQ(states[k].status, MemberStatus::kTraining) << "member " << k;
  const EnsemblePrediction p = trainer.predict(d.val_x);
  EXPECT_TRUE(at::isfinite(p.mean).all().item<bool>()) << "the ensemble stays finite";
  EXPECT_LT(trainer.evaluate(d.val_x, d.val_y).ensemble.rmse, d.val_y.std().item<double>());
  if (!states[2].usable) {
    EXPECT_EQ(p.included, (std::vector<int64_t>{0, 1, 3}));
  } else {
    EXPECT_TRUE(at::isfinite(p.member_mean[2]).all().item<bool>()) << "restored to its best weights";
  }
}

TEST_P(EnsembleTrainerTest, ResumeFromACheckpointEqualsAnUninterruptedRun) {
  const Data d = make_data(150, 30);
  const auto options = small_options(device())
                           .order(graphs::BatchOrder::kBootstrap)
                           .patience(50)
                           .schedule(ensemble::LrScheduleKind::kCosine)
                           .warmup_steps(5);
  EnsembleTrainer whole(options);
  whole.fit(d.x, d.y, d.val_x, d.val_y);

  const fs::path path = temp_file("resume.ckpt");
  {
    EnsembleTrainer first(options);
    first.prepare(d.x, d.y, d.val_x, d.val_y);
    EXPECT_FALSE(first.train([](const EpochReport& r) { return r.epoch < 5; })) << "stopped by the callback";
    EXPECT_EQ(first.epoch(), 5);
    first.save(path, "{\"note\": 1}");
  }
  const auto checkpoint = EnsembleTrainer::read_checkpoint(path);
  EXPECT_EQ(EnsembleTrainer::checkpoint_extra(*checkpoint), "{\"note\": 1}");
  EnsembleTrainer resumed(EnsembleTrainer::checkpoint_options(*checkpoint).device(device()).log(&ignore_log));
  resumed.prepare(d.x, d.y, d.val_x, d.val_y);
  resumed.restore(*checkpoint);
  EXPECT_EQ(resumed.epoch(), 5);
  EXPECT_TRUE(resumed.train());
  EXPECT_EQ(resumed.epoch(), whole.epoch());
  EXPECT_TRUE(all_close(resumed.model().parameters().flat().cpu(), whole.model().parameters().flat().cpu(),
                        tolerance(device())));
  EXPECT_EQ(resumed.train_loss_history().size(), whole.train_loss_history().size());
  EXPECT_TRUE(
      all_close(at::tensor(resumed.val_loss_history()), at::tensor(whole.val_loss_history()), tolerance(device())));
  fs::remove(path);
}

// `options` trained for `epochs` epochs, saved, and resumed from that checkpoint to
// the end equals `whole`, the same run uninterrupted. Returns the checkpoint's options.
EnsembleTrainerOptions resumed_equals_whole(EnsembleTrainer& whole, const EnsembleTrainerOptions& options,
                                            const Data& d, int64_t epochs, const c10::Device& device) {
  const fs::path path = temp_file(options.architecture() + ".ckpt");
  trained_for(options, d, epochs)->save(path);
  const auto checkpoint = EnsembleTrainer::read_checkpoint(path);
  const EnsembleTrainerOptions saved = EnsembleTrainer::checkpoint_options(*checkpoint);
  EnsembleTrainer resumed(EnsembleTrainerOptions(saved).device(device).log(&ignore_log));
  resumed.prepare(d.x, d.y, d.val_x, d.val_y);
  resumed.restore(*checkpoint);
  EXPECT_TRUE(resumed.train());
  EXPECT_TRUE(
      all_close(resumed.model().parameters().flat().cpu(), whole.model().parameters().flat().cpu(), tolerance(device)));
  fs::remove(path);
  return saved;
}

// A second architecture through the seam (ensemble/architectures.h): the trainer,
// its checkpoints and resume take it by name, like the MLP.
TEST_P(EnsembleTrainerTest, AResidualMlpPackTrainsAndResumesExactlyAndRefusesWhatItLacks) {
  const Data d = make_data(150, 30);
  const auto options = small_options(device()).architecture("residual-mlp").depth(2).epochs(10);
  EnsembleTrainer whole(options);
  whole.fit(d.x, d.y, d.val_x, d.val_y);
  EXPECT_EQ(whole.model().kind(), "residual-mlp");
  ASSERT_EQ(whole.train_loss_history().size(), 10u);
  EXPECT_LT(whole.train_loss_history().back(), whole.train_loss_history().front());
  EXPECT_EQ(resumed_equals_whole(whole, options, d, 4, device()).architecture(), "residual-mlp");
  // What the residual blocks have no place for is refused when the pack is built.
  EXPECT_THROW(
      {
        EnsembleTrainer t(EnsembleTrainerOptions(options).dropout(0.1));
        t.prepare(d.x, d.y);
      },
      UserError);
  EXPECT_THROW(EnsembleTrainer(EnsembleTrainerOptions(options).architecture("no-such-architecture")), UserError);
}

// Convolutional members (ensemble/packed_cnn.h) through the trainer: the rows' sample
// shape given before prepare, a classification of bar images that learns, and a
// checkpoint that keeps the shape and the channels and resumes exactly; rows without
// a shape are refused naming what to pass.
TEST_P(EnsembleTrainerTest, ACnnPackTrainsOnShapedRowsAndResumesExactly) {
  const trainer_testing::BarImages train = trainer_testing::bar_images(160, 7),
                                   val = trainer_testing::bar_images(40, 8);
  Data d{train.x, train.labels.to(at::kDouble).unsqueeze(1), val.x, val.labels.to(at::kDouble).unsqueeze(1)};
  const auto options = small_options(device())
                           .architecture("cnn")
                           .head(Head::kClassification)
                           .channels({4, 8})
                           .input_shape({1, 8, 8})
                           .epochs(8);
  EnsembleTrainer whole(options);
  whole.fit(d.x, d.y, d.val_x, d.val_y);
  EXPECT_EQ(whole.model().kind(), "cnn");
  ASSERT_EQ(whole.train_loss_history().size(), 8u);
  EXPECT_LT(whole.train_loss_history().back(), 0.5 * whole.train_loss_history().front());
  EXPECT_GT(whole.evaluate(d.val_x, d.val_y).ensemble.accuracy, 0.9);
  const EnsembleTrainerOptions saved = resumed_equals_whole(whole, options, d, 3, device());
  EXPECT_EQ(saved.input_shape(), (std::vector<int64_t>{1, 8, 8}));
  EXPECT_EQ(saved.channels(), (std::vector<int64_t>{4, 8}));
  // The shape as a data set gives it (set_input_shape), or none: refused at prepare.
  EnsembleTrainer shaped(EnsembleTrainerOptions(options).input_shape({}));
  shaped.set_input_shape({1, 8, 8});
  EXPECT_NO_THROW(shaped.prepare(d.x, d.y));
  EnsembleTrainer unshaped(EnsembleTrainerOptions(options).input_shape({}));
  try {
    unshaped.prepare(d.x, d.y);
    ADD_FAILURE() << "rows without a sample shape were accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("pass input_shape"), std::string::npos) << e.what();
  }
}

TEST_P(EnsembleTrainerTest, ACheckpointForAnotherModelShapeOrOtherDataIsRefused) {
  const Data d = make_data(64, 0);
  const fs::path path = temp_file("shape.ckpt");
  EnsembleTrainer trainer(small_options(device()).epochs(2));
  trainer.fit(d.x, d.y);
  trainer.save(path);
  const auto checkpoint = EnsembleTrainer::read_checkpoint(path);
  EnsembleTrainer other(EnsembleTrainer::checkpoint_options(*checkpoint).device(device()));
  other.prepare(d.x.narrow(1, 0, 2), d.y);  // 2 features instead of 3
  EXPECT_THROW(other.restore(*checkpoint), DataError);
  EnsembleTrainer changed(EnsembleTrainer::checkpoint_options(*checkpoint).device(device()));
  changed.prepare(d.x * 2, d.y);
  try {
    changed.restore(*checkpoint);
    ADD_FAILURE() << "restored onto other training data";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("training data differ"), std::string::npos) << e.what();
  }
  EnsembleTrainer model_only(EnsembleTrainer::checkpoint_options(*checkpoint).device(device()));
  model_only.restore(*checkpoint);
  EXPECT_TRUE(all_close(model_only.predict(d.x).mean, trainer.predict(d.x).mean, 1e-6))
      << "predictions survive the file";
  EXPECT_THROW(model_only.predict(d.x.narrow(1, 0, 2)), DataError) << "wrong feature count";
  fs::remove(path);
}

// A checkpoint holds no device-specific state: one written on the CPU predicts and
// resumes on this test's device, and one written here does on the CPU (on a GPU
// machine the CUDA instance is CPU->CUDA and CUDA->CPU).
TEST_P(EnsembleTrainerTest, ACheckpointResumesAndPredictsOnTheOtherDevice) {
  const Data d = make_data(150, 30);
  const c10::Device cpu(c10::kCPU);
  for (const auto& [from, to] : {std::pair{cpu, device()}, std::pair{device(), cpu}}) {
    SCOPED_TRACE(from.str() + " -> " + to.str());
    const auto options = small_options(from).order(graphs::BatchOrder::kPerMember).patience(50);
    const fs::path path = temp_file("moved.ckpt");
    const std::unique_ptr<EnsembleTrainer> trained = trained_for(options, d, 5);
    EnsembleTrainer& first = *trained;
    first.save(path);
    const auto checkpoint = EnsembleTrainer::read_checkpoint(path);

    EnsembleTrainer model_only(EnsembleTrainer::checkpoint_options(*checkpoint).device(to).log(&ignore_log));
    model_only.restore(*checkpoint);
    // Same weights, another device's kernels: float32 rounding only.
    EXPECT_TRUE(all_close(model_only.predict(d.val_x).mean.cpu(), first.predict(d.val_x).mean.cpu(), 1e-4));

    EnsembleTrainer resumed(EnsembleTrainer::checkpoint_options(*checkpoint).device(to).log(&ignore_log));
    resumed.prepare(d.x, d.y, d.val_x, d.val_y);
    resumed.restore(*checkpoint);
    EXPECT_EQ(resumed.steps().batcher().order_state().epochs_drawn, 5);
    EXPECT_EQ(resumed.steps().batcher().device().type(), to.type());
    EXPECT_TRUE(resumed.train());
    EXPECT_EQ(resumed.epoch(), options.epochs());
    EXPECT_EQ(resumed.steps().batcher().order_state().epochs_drawn, options.epochs());
    ASSERT_EQ(resumed.val_loss_history().size(), static_cast<size_t>(options.epochs()));
    EXPECT_LT(resumed.val_loss_history().back(), resumed.val_loss_history()[4]) << "kept learning after the move";
    fs::remove(path);
  }
}

// Checkpoints from before device-neutral orders hold the order generator's raw
// state ("order_rng"); they still resume (orders re-drawn from the run's seed at
// the epoch reached, and the log says so). One with no order state is refused.
TEST_P(EnsembleTrainerTest, AnEarlierCheckpointWithARawGeneratorStateStillResumes) {
  const Data d = make_data(150, 30);
  const auto options = small_options(device()).epochs(8).patience(50);
  const fs::path path = temp_file("earlier.ckpt");
  {
    EnsembleTrainer first(options);
    first.prepare(d.x, d.y, d.val_x, d.val_y);
    first.train([](const EpochReport& r) { return r.epoch < 3; });
    first.save(path);
  }
  auto payload = load_checkpoint(path).toGenericDict();
  (void)payload.erase("order_seed");
  (void)payload.erase("order_epochs");
  payload.insert("order_rng", at::make_generator<at::CPUGeneratorImpl>(1).get_state());
  save_checkpoint(path, payload);

  std::vector<std::string> logged;
  EnsembleTrainer resumed(EnsembleTrainer::checkpoint_options(*EnsembleTrainer::read_checkpoint(path))
                              .device(device())
                              .log([&](const std::string& m) { logged.push_back(m); }));
  resumed.prepare(d.x, d.y, d.val_x, d.val_y);
  resumed.restore(*EnsembleTrainer::read_checkpoint(path));
  EXPECT_EQ(resumed.steps().batcher().order_state().epochs_drawn, 3);
  bool told = false;
  for (const std::string& m : logged) told = told || m.find("earlier packtrain") != std::string::npos;
  EXPECT_TRUE(told) << "the resume says its batch orders differ from the original run's";
  EXPECT_TRUE(resumed.train());
  EXPECT_EQ(resumed.epoch(), 8);

  (void)payload.erase("order_rng");
  save_checkpoint(path, payload);
  EnsembleTrainer refused(options);
  refused.prepare(d.x, d.y, d.val_x, d.val_y);
  try {
    refused.restore(*EnsembleTrainer::read_checkpoint(path));
    ADD_FAILURE() << "restored without any batch-order state";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("batch-order state"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

TEST_P(EnsembleTrainerTest, ClassifiesWineQualityBetterThanTheMajorityClass) {
  const char* dir = std::getenv("PACKTRAIN_DATA_DIR");
  ASSERT_NE(dir, nullptr);
  const RegressionData wine = load_uci(fs::path(dir) / "wine-quality-red");
  const SplitIndices split = load_uci_split(fs::path(dir) / "wine-quality-red", 0, wine.features.size(0));
  const auto rows = [](const at::Tensor& t, const std::vector<int64_t>& i) { return t.index_select(0, at::tensor(i)); };
  EnsembleTrainer trainer(
      small_options(device()).head(Head::kClassification).members(4).hidden(32).epochs(30).batch_size(64).lr(3e-3));
  trainer.fit(rows(wine.features, split.train), rows(wine.targets, split.train));
  EXPECT_EQ(trainer.classes().size(), 6u) << "quality 3..8";
  const at::Tensor test_y = rows(wine.targets, split.test);
  const EnsembleMetrics m = trainer.evaluate(rows(wine.features, split.test), test_y);
  const at::Tensor counts = std::get<2>(at::_unique2(test_y.reshape({-1}), true, false, true));
  const double majority = counts.max().item<double>() / static_cast<double>(test_y.size(0));
  EXPECT_GT(m.ensemble.accuracy, majority + 0.03) << "majority-class accuracy " << majority;
  EXPECT_LT(m.ensemble.nll, std::log(6.0)) << "better than uniform probabilities";
  const EnsemblePrediction p = trainer.predict(rows(wine.features, split.test));
  EXPECT_TRUE(all_close(p.probabilities.sum(1), at::ones({test_y.size(0)}, at::kDouble), 1e-9));
  EXPECT_THROW(trainer.evaluate(rows(wine.features, split.test), test_y + 100), DataError) << "unknown labels";
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(EnsembleTrainerTest);

// A sweep of 2 learning rates x 2 weight decays x 2 seeds in one pack of 8: each
// configuration's members train exactly as a pack of 2 with that configuration's
// scalar options would (members initialized from their global index: first_member).
TEST_P(EnsembleTrainerTest, ASweepInOnePackTrainsEachConfigurationAsItsOwnRun) {
  const Data d = make_data(160, 40);
  const EnsembleTrainerOptions base = small_options(device()).members(2).epochs(6);
  const SweepGrid grid{{1e-2, 3e-3}, {0.0, 1e-2}, 2, {}, {}, {}};
  EnsembleTrainer sweep(sweep_options(base, grid));
  ASSERT_EQ(sweep.options().members(), 8);
  sweep.fit(d.x, d.y, d.val_x, d.val_y);
  const std::vector<SweepConfiguration> configurations = sweep_configurations(sweep.options());
  ASSERT_EQ(configurations.size(), 4u);
  // As trained (each run's recalibration is fitted to its own members: variance_calibration_test.cpp).
  const EnsemblePrediction all = sweep.predict_uncalibrated(d.val_x);
  for (const SweepConfiguration& c : configurations) {
    EXPECT_EQ(c.members, 2);
    EnsembleTrainer alone(
        EnsembleTrainerOptions(base).lr(c.lr).weight_decay(c.weight_decay).first_member(c.first_member));
    alone.fit(d.x, d.y, d.val_x, d.val_y);
    EXPECT_TRUE(all_close(all.member_mean.narrow(0, c.first_member, 2), alone.predict_uncalibrated(d.val_x).member_mean,
                          device().is_cuda() ? 1e-5 : 1e-9))
        << "lr " << c.lr << ", weight decay " << c.weight_decay;
  }
  // Scored per configuration; the best by validation loss kept, the rest deselected.
  const std::vector<ConfigurationReport> reports = report_configurations(sweep, d.val_x, d.val_y, d.x, d.y);
  ASSERT_EQ(reports.size(), 4u);
  const size_t best = best_configuration(reports);
  for (const ConfigurationReport& r : reports) {
    EXPECT_TRUE(std::isfinite(r.val_loss));
    EXPECT_LE(reports[best].val_loss, r.val_loss);
    EXPECT_TRUE(std::isfinite(r.test.ensemble.rmse));
  }
  const SweepConfiguration& kept = reports[best].configuration;
  sweep.keep_members(kept.first_member, kept.members);
  const EnsemblePrediction after = sweep.predict_uncalibrated(d.val_x);
  EXPECT_EQ(after.included, (std::vector<int64_t>{kept.first_member, kept.first_member + 1}));
  EXPECT_TRUE(all_close(after.mean, member_range(all, kept.first_member, 2, Head::kGaussian).mean, 1e-12));
  EXPECT_EQ(sweep.member_states()[(kept.first_member + 2) % 8].status, MemberStatus::kDeselected);
  // The options carry the sweep through a checkpoint's JSON.
  EXPECT_EQ(sweep_configurations(options_from_json(to_json(sweep.options()))).size(), 4u);
  EXPECT_THROW(sweep_options(base, SweepGrid{{1e-2, 1e-2}, {0.0}, 2, {}, {}, {}}), UserError);
  EXPECT_THROW(EnsembleTrainer(EnsembleTrainerOptions(base).member_lr({1e-2})), UserError);  // 1 value, 2 members
}

// A dropout sweep in one pack: each configuration trains as its own run with that
// rate would, and the rates travel with the options through a checkpoint's JSON.
TEST_P(EnsembleTrainerTest, ADropoutSweepInOnePackGivesEachConfigurationItsRate) {
  const Data d = make_data(160, 40);
  const EnsembleTrainerOptions base = small_options(device()).members(2).epochs(6);
  EnsembleTrainer sweep(sweep_options(base, SweepGrid{{1e-2}, {1e-4}, 2, {0.0, 0.3}, {}, {}}));
  ASSERT_EQ(sweep.options().member_dropout(), (std::vector<double>{0.0, 0.0, 0.3, 0.3}));
  sweep.fit(d.x, d.y, d.val_x, d.val_y);
  const std::vector<SweepConfiguration> configurations = sweep_configurations(sweep.options());
  ASSERT_EQ(configurations.size(), 2u);
  EXPECT_EQ(configurations[1].dropout, 0.3);
  EXPECT_EQ(configurations[1].first_member, 2);
  const EnsemblePrediction all = sweep.predict_uncalibrated(d.val_x);  // as trained
  for (const SweepConfiguration& c : configurations) {
    const EnsembleTrainerOptions own =
        EnsembleTrainerOptions(base).lr(1e-2).weight_decay(1e-4).first_member(c.first_member);
    const auto gap_to = [&](const EnsembleTrainerOptions& o) {
      EnsembleTrainer alone(o);
      alone.fit(d.x, d.y, d.val_x, d.val_y);
      return (all.member_mean.narrow(0, c.first_member, 2) - alone.predict_uncalibrated(d.val_x).member_mean)
          .abs()
          .max()
          .item<double>();
    };
    const double gap = gap_to(EnsembleTrainerOptions(own).dropout(c.dropout));
    // Every configuration is its own run: member m's masks are a function of the
    // seed, the draw, m's index in the ensemble and the row, whatever pack it trains
    // in. On CPU bit for bit (the same fused step); on a GPU up to float32 rounding
    // (GEMMs over another K).
    if (device().is_cpu()) {
      EXPECT_EQ(gap, 0.0) << "dropout " << c.dropout;
    } else {
      EXPECT_LT(gap, 1e-4) << "dropout " << c.dropout;
    }
    if (c.dropout > 0.0) {
      EXPECT_GT(gap_to(own), 1e-2) << "dropout " << c.dropout << " acts";
    }
    EXPECT_TRUE(all.member_mean.narrow(0, c.first_member, 2).isfinite().all().item<bool>());
  }
  EXPECT_EQ(options_from_json(to_json(sweep.options())).member_dropout(), sweep.options().member_dropout());
  // One rate is no sweep axis: the model's own dropout, no per-member rates.
  EXPECT_TRUE(sweep_options(base, SweepGrid{{1e-2, 3e-3}, {1e-4}, 2, {0.1}, {}, {}}).member_dropout().empty());
  EXPECT_THROW(sweep_options(base, SweepGrid{{1e-2}, {1e-4}, 2, {0.1, 0.1}, {}, {}}), UserError);
}

// A sweep over widths in one pack (members padded to the widest, packed_mlp.h): each
// width's members train as a run of that width alone would, dropout included (its
// masks do not depend on the pack's width), and the widths travel with the options.
TEST_P(EnsembleTrainerTest, AWidthSweepInOnePackTrainsEachWidthAsItsOwnRun) {
  const Data d = make_data(160, 40);
  const EnsembleTrainerOptions base = small_options(device()).members(2).epochs(6).dropout(0.2);
  EnsembleTrainer sweep(sweep_options(base, SweepGrid{{1e-2}, {1e-4}, 2, {}, {5, 16}, {}}));
  EXPECT_EQ(sweep.options().hidden(), 16);
  ASSERT_EQ(sweep.options().member_hidden(), (std::vector<int64_t>{5, 5, 16, 16}));
  sweep.fit(d.x, d.y, d.val_x, d.val_y);
  const std::vector<SweepConfiguration> configurations = sweep_configurations(sweep.options());
  ASSERT_EQ(configurations.size(), 2u);
  EXPECT_EQ(configurations[0].hidden, 5);
  EXPECT_EQ(configurations[1].first_member, 2);
  const EnsemblePrediction all = sweep.predict_uncalibrated(d.val_x);
  for (const SweepConfiguration& c : configurations) {
    EnsembleTrainer alone(
        EnsembleTrainerOptions(base).hidden(c.hidden).lr(1e-2).weight_decay(1e-4).first_member(c.first_member));
    alone.fit(d.x, d.y, d.val_x, d.val_y);
    // Zero padding adds exact zeros to each sum, but a GEMM over a longer reduction
    // may group the sum differently: float32 rounding, not a different network.
    const double gap = (all.member_mean.narrow(0, c.first_member, 2) - alone.predict_uncalibrated(d.val_x).member_mean)
                           .abs()
                           .max()
                           .item<double>();
    EXPECT_LT(gap, 1e-4) << "hidden " << c.hidden;
  }
  // The two widths train different networks (a pack that ignored the widths would not).
  EXPECT_GT((all.member_mean[0] - all.member_mean[2]).abs().max().item<double>(), 1e-3);
  EXPECT_EQ(options_from_json(to_json(sweep.options())).member_hidden(), sweep.options().member_hidden());
  EXPECT_TRUE(sweep_options(base, SweepGrid{{1e-2}, {1e-4}, 2, {}, {16}, {}}).member_hidden().empty());
  EXPECT_THROW(sweep_options(base, SweepGrid{{1e-2}, {1e-4}, 2, {}, {8, 8}, {}}), UserError);
  EXPECT_THROW(EnsembleTrainer(EnsembleTrainerOptions(base).member_hidden({4, 4}).layer_norm(true)), UserError);
}

// A sweep over cnn channel lists in one pack (members padded to the widest channels
// of each block, packed_cnn.h): each list's members train as a run of those channels
// alone would, and the lists travel with the options.
TEST_P(EnsembleTrainerTest, AChannelSweepInOnePackTrainsEachListAsItsOwnRun) {
  const trainer_testing::BarImages train = trainer_testing::bar_images(160, 7),
                                   val = trainer_testing::bar_images(40, 8);
  const Data d{train.x, train.labels.to(at::kDouble).unsqueeze(1), val.x, val.labels.to(at::kDouble).unsqueeze(1)};
  const EnsembleTrainerOptions base = small_options(device())
                                          .architecture("cnn")
                                          .head(Head::kClassification)
                                          .input_shape({1, 8, 8})
                                          .members(2)
                                          .epochs(6);
  EnsembleTrainer sweep(sweep_options(base, SweepGrid{{1e-2}, {1e-4}, 2, {}, {}, {{2, 4}, {4, 3}}}));
  EXPECT_EQ(sweep.options().channels(), (std::vector<int64_t>{4, 4})) << "the widest of each block";
  ASSERT_EQ(sweep.options().member_channels(), (std::vector<int64_t>{2, 4, 2, 4, 4, 3, 4, 3}));
  sweep.fit(d.x, d.y, d.val_x, d.val_y);
  const std::vector<SweepConfiguration> configurations = sweep_configurations(sweep.options());
  ASSERT_EQ(configurations.size(), 2u);
  EXPECT_EQ(configurations[0].channels, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(configurations[1].channels, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(configurations[1].first_member, 2);
  const EnsemblePrediction all = sweep.predict_uncalibrated(d.val_x);
  for (const SweepConfiguration& c : configurations) {
    EnsembleTrainer alone(
        EnsembleTrainerOptions(base).channels(c.channels).lr(1e-2).weight_decay(1e-4).first_member(c.first_member));
    alone.fit(d.x, d.y, d.val_x, d.val_y);
    // Zero channels add exact zeros to each sum, but a convolution over more channels
    // may group the sum differently: float32 rounding, not a different network.
    const double gap = (all.member_probabilities.narrow(0, c.first_member, 2) -
                        alone.predict_uncalibrated(d.val_x).member_probabilities)
                           .abs()
                           .max()
                           .item<double>();
    EXPECT_LT(gap, 1e-4) << "channels " << c10::IntArrayRef(c.channels);
  }
  EXPECT_GT((all.member_probabilities[0] - all.member_probabilities[2]).abs().max().item<double>(), 1e-3);
  EXPECT_EQ(options_from_json(to_json(sweep.options())).member_channels(), sweep.options().member_channels());
  // One list is no sweep axis; a repeated list, lists of other depths, or a count
  // wider than the pack are refused.
  EXPECT_TRUE(sweep_options(base, SweepGrid{{1e-2}, {1e-4}, 2, {}, {}, {{2, 4}}}).member_channels().empty());
  EXPECT_THROW(sweep_options(base, SweepGrid{{1e-2}, {1e-4}, 2, {}, {}, {{2, 4}, {2, 4}}}), UserError);
  EXPECT_THROW(sweep_options(base, SweepGrid{{1e-2}, {1e-4}, 2, {}, {}, {{2, 4}, {4}}}), UserError);
  EXPECT_THROW(EnsembleTrainerOptions(base).channels({4, 4}).member_channels({2, 4, 5, 4}).validate(), UserError);
  EXPECT_THROW(EnsembleTrainerOptions(base).channels({4, 4}).member_channels({2, 4, 4}).validate(), UserError);
}

// Dropout's masks follow from the run's seed, not from the process: two runs with
// one seed train the same weights (bit for bit on CPU; on a GPU the captured
// replays draw them too), another seed other weights; a run resumed from a
// checkpoint between epochs drops what the uninterrupted run drops.
TEST_P(EnsembleTrainerTest, DropoutMasksFollowFromTheSeed) {
  const Data d = make_data(160, 40);
  const EnsembleTrainerOptions base = small_options(device()).members(3).epochs(4).dropout(0.2).patience(0);
  const auto same = [&](const at::Tensor& x, const at::Tensor& y) {
    return device().is_cpu() ? packtrain::testing::all_equal(x, y) : all_close(x, y, tolerance(device()));
  };
  const auto train = [&](const EnsembleTrainerOptions& o) {
    EnsembleTrainer t(o);
    at::manual_seed(static_cast<uint64_t>(std::rand()));  // the process's generator plays no part
    t.fit(d.x, d.y, d.val_x, d.val_y);
    return t.model().parameters().flat().clone();
  };
  const at::Tensor a = train(base), b = train(base), other = train(EnsembleTrainerOptions(base).seed(base.seed() + 1));
  EXPECT_TRUE(same(a, b));
  EXPECT_FALSE(at::allclose(a, other));
  // Per-member rates (a sweep) likewise.
  const EnsembleTrainerOptions sweep = sweep_options(base, SweepGrid{{1e-2}, {1e-4}, 2, {0.1, 0.4}, {}, {}});
  EXPECT_TRUE(same(train(sweep), train(sweep)));

  const fs::path path = temp_file("dropout-resume.ckpt");
  {
    EnsembleTrainer first(base);
    first.prepare(d.x, d.y, d.val_x, d.val_y);
    first.train([](const EpochReport& r) { return r.epoch < 2; });
    first.save(path, "{}");
  }
  const auto checkpoint = EnsembleTrainer::read_checkpoint(path);
  EnsembleTrainer resumed(EnsembleTrainer::checkpoint_options(*checkpoint).log(&ignore_log));
  resumed.prepare(d.x, d.y, d.val_x, d.val_y);
  resumed.restore(*checkpoint);
  at::manual_seed(99);
  EXPECT_TRUE(resumed.train());
  EXPECT_TRUE(same(resumed.model().parameters().flat(), a));
  fs::remove(path);
}

TEST_P(EnsembleTrainerTest, EnsembleEarlyStoppingStopsEachConfigurationTogetherAtItsBestEpoch) {
  const Data d = make_data(96, 40);
  const EnsembleTrainerOptions base =
      small_options(device()).members(3).epochs(150).patience(4).early_stopping(EarlyStopping::kEnsemble);
  const EnsembleTrainerOptions options = sweep_options(base, SweepGrid{{3e-2, 1e-2}, {1e-4}, 3, {}, {}, {}});
  const std::vector<SweepConfiguration> ensembles = sweep_configurations(options);  // members 0-2 and 3-5
  ASSERT_EQ(ensembles.size(), 2u);
  ASSERT_EQ(ensembles[1].first_member, 3);
  ASSERT_EQ(ensembles[1].members, 3);
  EnsembleTrainer trainer(options);
  std::vector<EpochReport> reports;
  trainer.fit(d.x, d.y, d.val_x, d.val_y, [&](const EpochReport& r) {
    reports.push_back(r);
    return true;
  });
  const std::vector<MemberState>& m = trainer.member_states();
  int stopped_groups = 0;
  for (int64_t first : {0, 3}) {
    for (int64_t k = first + 1; k < first + 3; ++k) {
      EXPECT_EQ(m[k].status, m[first].status) << "member " << k << " decides with its ensemble";
      EXPECT_EQ(m[k].best_epoch, m[first].best_epoch);
      EXPECT_EQ(m[k].ended_epoch, m[first].ended_epoch);
      EXPECT_EQ(m[k].best_loss, m[first].best_loss);
    }
    if (m[first].status != MemberStatus::kStopped) continue;
    ++stopped_groups;
    EXPECT_EQ(m[first].ended_epoch - m[first].best_epoch, 4) << "stops after `patience` epochs without improvement";
  }
  ASSERT_GE(stopped_groups, 1) << "an ensemble stopped early";
  // Restored: each ensemble's validation loss (the mixture's NLL, standardized
  // units) is its best, and equals the calibration's mixture NLL of the same
  // members, which is in original units (a density scaled by 1/std of y).
  const EnsemblePrediction p = trainer.predict_uncalibrated(d.val_x);  // the members as trained
  const double log_std = std::log(trainer.y_scale().std.item<double>());
  const at::Tensor raw = trainer.model().forward(trainer.x_scale().transform(d.val_x).to(at::kFloat).to(device()));
  const at::Tensor val_y = trainer.y_scale().transform(d.val_y).to(at::kFloat);
  for (int64_t first : {0, 3}) {
    const double loss =
        ensemble_validation_loss(raw, val_y, Head::kGaussian, options.min_variance(), {first, first + 1, first + 2});
    EXPECT_NEAR(loss, m[first].best_loss, 1e-5) << "ensemble at " << first;
    const EnsembleMetrics metrics =
        ensemble_metrics(member_range(p, first, 3, Head::kGaussian), d.val_y, Head::kGaussian);
    EXPECT_NEAR(loss + log_std, metrics.regression.mixture_nll, 1e-5) << "ensemble at " << first;
  }
  // The first ensemble's weights are those of a run that trained it to its best epoch.
  EnsembleTrainer to_best(EnsembleTrainerOptions(options).epochs(m[0].best_epoch).patience(0));
  to_best.fit(d.x, d.y, d.val_x, d.val_y);
  EXPECT_TRUE(all_close(p.member_mean.narrow(0, 0, 3),
                        to_best.predict_uncalibrated(d.val_x).member_mean.narrow(0, 0, 3),
                        device().is_cuda() ? 1e-5 : 1e-9));
}

TEST(EnsembleValidationTest, TheLossOfEachHeadIsTheMixtureScoreThatItsMetricsReport) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const int64_t K = 4, N = 50;
  const std::vector<int64_t> some{0, 2, 3};
  // Gaussian: in standardized units the calibration's mixture NLL is the same number.
  const at::Tensor raw = at::randn({K, N, 2}, gen, f64);
  const at::Tensor y = at::randn({N, 1}, gen, f64);
  const auto g = ensemble::gaussian_head(raw, 1e-6);
  EnsemblePrediction members;
  members.included = some;
  members.member_mean = g.mean.squeeze(2);
  members.member_variance = g.variance.squeeze(2);
  const EnsemblePrediction gaussian = combine_members(members, Head::kGaussian);
  EXPECT_NEAR(ensemble_validation_loss(raw, y, Head::kGaussian, 1e-6, some),
              ensemble_metrics(gaussian, y, Head::kGaussian).regression.mixture_nll, 1e-12);
  // Mean head: the MSE of the mixture mean, the square of its RMSE.
  EnsemblePrediction means;
  means.included = some;
  means.member_mean = raw.select(2, 0);
  const double rmse = ensemble_metrics(combine_members(means, Head::kMean), y, Head::kMean).ensemble.rmse;
  EXPECT_NEAR(ensemble_validation_loss(raw.narrow(2, 0, 1), y, Head::kMean, 1e-6, some), rmse * rmse, 1e-12);
  // Classification: the NLL of the mean class probabilities.
  const at::Tensor logits = at::randn({K, N, 3}, gen, f64) * 2;
  const at::Tensor labels = at::randint(3, {N}, gen, at::TensorOptions().dtype(at::kLong));
  EnsemblePrediction probabilities;
  probabilities.included = some;
  probabilities.member_probabilities = logits.softmax(-1);
  const std::vector<double> classes{0, 1, 2};
  const EnsembleMetrics c = ensemble_metrics(combine_members(probabilities, Head::kClassification, classes),
                                             labels.to(at::kDouble), Head::kClassification, classes);
  EXPECT_NEAR(ensemble_validation_loss(logits, labels, Head::kClassification, 1e-6, some), c.classification.nll, 1e-12);
  EXPECT_THROW(ensemble_validation_loss(raw, y, Head::kGaussian, 1e-6, {}), c10::Error);
}

TEST(EnsembleTrainerOptionsTest, JsonRoundTripAndUnknownKeys) {
  const auto o = EnsembleTrainerOptions()
                     .members(7)
                     .head(Head::kMean)
                     .optimizer(OptimizerKind::kSGD)
                     .patience(3)
                     .order(graphs::BatchOrder::kPerMember)
                     .schedule(ensemble::LrScheduleKind::kCosine)
                     .seed(11)
                     .early_stopping(EarlyStopping::kEnsemble);
  const std::string json = to_json(o);
  EXPECT_EQ(to_json(options_from_json(json)), json);
  // A checkpoint from before --early-stopping (format version 1, no format_version
  // key): each member's own loss, as then.
  std::string before = json;
  for (const std::string& key : {std::string("\"early_stopping\":\"ensemble\","),
                                 "\"format_version\":" + std::to_string(kTrainerOptionsFormat) + ","}) {
    ASSERT_NE(before.find(key), std::string::npos) << key << " in " << before;
    before.erase(before.find(key), key.size());
  }
  EXPECT_EQ(options_from_json(before).early_stopping(), EarlyStopping::kMember);
  std::string bad = json;
  bad.insert(1, "\"bogus\": 1, ");
  EXPECT_THROW(options_from_json(bad), UserError);
  EXPECT_THROW(EnsembleTrainer(EnsembleTrainerOptions().members(0)), UserError);
}

}  // namespace
}  // namespace packtrain::runtime
