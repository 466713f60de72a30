// EnsembleSteps against a hand-written eager loop over the same batches: the
// captured path (CUDA) and the eager path (CPU) must both equal it over 120 steps
// with Adam's bias correction advancing, a mask change mid-run, a cosine schedule
// and U=4 unrolled replays plus single-step remainders. Re-initializing in place
// replays the same graphs and equals a fresh run.
#include "packtrain/runtime/trainers/ensemble/ensemble_steps.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_cnn.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_step.h"
#include "tests/runtime/trainers/trainer_test_data.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <memory>

namespace packtrain::runtime {
namespace {

using packtrain::testing::all_close;
using packtrain::testing::DeviceTest;

constexpr int64_t kMembers = 6;
constexpr int64_t kBatch = 32;
constexpr int64_t kRows = 10 * kBatch + 7;  // 10 steps per epoch, a partial batch dropped
// CPU: the same eager arithmetic, bit for bit (bound 0). CUDA: the graph replays
// exactly the kernels the eager loop launches (same workspaces, no atomics), so it
// should match bit for bit too; 1e-6 is a reporting margin, not a license — Adam
// divides by sqrt(v), so a kernel-selection difference would show up as ~lr (1e-2),
// as would a frozen step counter or a stale learning rate.
double tolerance(const c10::Device& d) { return d.is_cuda() ? 1e-6 : 0.0; }

std::vector<at::Tensor> make_data(int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  const at::Tensor x = at::randn({rows, 5}, gen);
  return {x, x.sum(1, true).tanh() + 0.05 * at::randn({rows, 1}, gen)};
}

ensemble::PackedMLPOptions model_options(uint64_t seed, c10::Device d, double dropout) {
  return ensemble::PackedMLPOptions(5, 2).members(kMembers).hidden(16).depth(2).seed(seed).dropout(dropout).device(d);
}

const ensemble::LrSchedule kCosine =
    ensemble::LrSchedule().kind(ensemble::LrScheduleKind::kCosine).warmup_steps(10).total_steps(120).min_factor(0.1);

// The system under test: model, optimizer and EnsembleSteps.
struct TrainingRun {
  TrainingRun(uint64_t model_seed, uint64_t order_seed, c10::Device d, graphs::BatchOrder order, int64_t unroll,
              int64_t readback_steps = 0, double dropout = 0.0)
      : model(model_options(model_seed, d, dropout)),
        optimizer(model.parameters(), ensemble::adamw_options().lr(1e-2)) {
    optimizer.set_schedule(kCosine);
    steps = std::make_unique<EnsembleSteps>(model, optimizer, make_data(kRows),
                                            EnsembleStepsOptions()
                                                .batch_size(kBatch)
                                                .order(order)
                                                .unroll(unroll)
                                                .eval_batch_size(64)
                                                .readback_steps(readback_steps)
                                                .seed(order_seed)
                                                .capture(graphs::CaptureOptions().log([](const std::string&) {})));
  }
  ensemble::PackedMLP model;
  ensemble::PackedAdam optimizer;
  std::unique_ptr<EnsembleSteps> steps;
};

// The reference: the same model, optimizer and batcher stepped by hand, eagerly.
struct Reference {
  Reference(uint64_t model_seed, uint64_t order_seed, c10::Device d, graphs::BatchOrder order, double dropout = 0.0)
      : model(model_options(model_seed, d, dropout)),
        optimizer(model.parameters(), ensemble::adamw_options().lr(1e-2)),
        batcher(make_data(kRows), d, kMembers, kBatch, order, order_seed) {
    optimizer.set_schedule(kCosine);
  }
  // Returns the epoch's mean loss per member.
  at::Tensor epoch() {
    batcher.start_epoch();
    at::Tensor sum = at::zeros({kMembers}, at::TensorOptions().dtype(at::kDouble).device(batcher.device()));
    for (int64_t i = 0; i < batcher.batches_per_epoch(); ++i) {
      const std::vector<at::Tensor> b = batcher.next_batch();
      sum.add_(ensemble::packed_train_step(model, optimizer, b[0], b[1], ensemble::LossKind::kGaussianNLL));
    }
    return (sum / static_cast<double>(batcher.batches_per_epoch())).cpu();
  }
  ensemble::PackedMLP model;
  ensemble::PackedAdam optimizer;
  graphs::DeviceBatcher batcher;
};

class EnsembleStepsTest : public DeviceTest {};

void expect_matches_reference(const c10::Device& device, graphs::BatchOrder order, double dropout = 0.0) {
  TrainingRun run(3, 4, device, order, /*unroll=*/4, /*readback_steps=*/0, dropout);
  Reference ref(3, 4, device, order, dropout);
  ASSERT_EQ(run.steps->steps_per_epoch(), 10);
  std::vector<at::Tensor> ref_losses;
  for (int epoch = 0; epoch < 6; ++epoch) {
    run.steps->run_epoch();
    ref_losses.push_back(ref.epoch());
  }
  // Freeze members 1 and 4 mid-run: the graphs read the mask from the device.
  const at::Tensor mask = at::tensor({1, 0, 1, 1, 0, 1}, at::kLong).to(device, at::kBool);
  run.optimizer.set_mask(mask);
  ref.optimizer.set_mask(mask);
  const at::Tensor frozen_before = run.model.parameters().flat().view({-1}).clone();
  for (int epoch = 0; epoch < 6; ++epoch) {
    run.steps->run_epoch();
    ref_losses.push_back(ref.epoch());
  }
  EXPECT_EQ(run.steps->steps_taken(), 120);
  EXPECT_TRUE(all_close(run.model.parameters().flat(), ref.model.parameters().flat(), tolerance(device)));
  EXPECT_TRUE(all_close(run.optimizer.exp_avg_sq(), ref.optimizer.exp_avg_sq(), tolerance(device)));
  EXPECT_TRUE(all_close(run.optimizer.step_count().cpu(),
                        at::tensor({120.0, 60.0, 120.0, 120.0, 60.0, 120.0}, at::kDouble), 0.0))
      << "bias-correction step counts advance on replay and stop for frozen members";
  // Frozen members did not move after the mask change.
  const auto blocks_now = run.model.parameters().blocks(run.model.parameters().flat());
  const auto blocks_then = run.model.parameters().blocks(frozen_before);
  for (size_t i = 0; i < blocks_now.size(); ++i) {
    EXPECT_TRUE(all_close(blocks_now[i][1], blocks_then[i][1], 0.0));
    EXPECT_TRUE(all_close(blocks_now[i][4], blocks_then[i][4], 0.0));
  }
  // One loss report per epoch, equal to the reference's epoch means.
  const std::vector<LossReport> reports = run.steps->wait_losses();
  ASSERT_EQ(reports.size(), 12u);
  for (size_t e = 0; e < reports.size(); ++e) {
    EXPECT_EQ(reports[e].first_step, static_cast<int64_t>(10 * e));
    EXPECT_EQ(reports[e].steps, 10);
    EXPECT_TRUE(all_close(reports[e].mean, ref_losses[e], device.is_cuda() ? 1e-6 : 1e-12)) << "epoch " << e;
  }
  if (device.is_cuda()) {
    EXPECT_EQ(run.steps->unrolled_step().mode(), graphs::StepMode::kGraph);
    EXPECT_EQ(run.steps->single_step().mode(), graphs::StepMode::kGraph);
    EXPECT_EQ(run.steps->unrolled_step().captures(), 1);
  }
}

TEST_P(EnsembleStepsTest, MatchesTheEagerLoopSharedOrder) {
  expect_matches_reference(device(), graphs::BatchOrder::kShared);
}

TEST_P(EnsembleStepsTest, MatchesTheEagerLoopBootstrapOrder) {
  expect_matches_reference(device(), graphs::BatchOrder::kBootstrap);
}

// Dropout's masks are drawn inside the step from a draw count on the device: the
// graph's replays (4 steps each, then single steps) must drop what the eager loop
// drops step by step — a count frozen at capture would repeat one mask and part.
// Dropout must act at all: the run differs from one without it.
TEST_P(EnsembleStepsTest, MatchesTheEagerLoopWithDropout) {
  expect_matches_reference(device(), graphs::BatchOrder::kShared, /*dropout=*/0.3);
  TrainingRun with(3, 4, device(), graphs::BatchOrder::kShared, 4, 0, 0.3);
  TrainingRun without(3, 4, device(), graphs::BatchOrder::kShared, 4);
  with.steps->run_epoch();
  without.steps->run_epoch();
  EXPECT_FALSE(all_close(with.model.parameters().flat(), without.model.parameters().flat(), 1e-4));
}

TEST_P(EnsembleStepsTest, ReinitializingInPlaceReplaysTheSameGraphsAndEqualsAFreshRun) {
  TrainingRun reused(1, 2, device(), graphs::BatchOrder::kPerMember, 3);
  for (int epoch = 0; epoch < 4; ++epoch) reused.steps->run_epoch();
  const void* params_before = reused.model.parameters().flat().data_ptr();
  reused.steps->reinitialize(/*model_seed=*/5);
  reused.steps->reseed_order(/*order_seed=*/9);
  for (int epoch = 0; epoch < 4; ++epoch) reused.steps->run_epoch();

  TrainingRun fresh(5, 9, device(), graphs::BatchOrder::kPerMember, 3);
  for (int epoch = 0; epoch < 4; ++epoch) fresh.steps->run_epoch();

  EXPECT_EQ(reused.model.parameters().flat().data_ptr(), params_before) << "nothing reallocated";
  EXPECT_TRUE(all_close(reused.model.parameters().flat(), fresh.model.parameters().flat(), tolerance(device())));
  EXPECT_TRUE(all_close(reused.optimizer.step_count(), fresh.optimizer.step_count(), 0.0));
  if (device().is_cuda()) {
    EXPECT_EQ(reused.steps->unrolled_step().captures(), 1) << "re-initialization must not re-capture";
    EXPECT_EQ(reused.steps->unrolled_step().mode(), graphs::StepMode::kGraph);
  }
}

TEST_P(EnsembleStepsTest, EvaluateEqualsAForwardOverAllRowsIncludingAPartialBatch) {
  TrainingRun run(3, 4, device(), graphs::BatchOrder::kShared, 2);
  run.steps->run_epoch();
  const std::vector<at::Tensor> data = make_data(150);  // batches of 64, 64 and 22
  const at::Tensor expected = ensemble::packed_eval_losses(run.model, data[0].to(device()), data[1].to(device()),
                                                           ensemble::LossKind::kGaussianNLL)
                                  .to(at::kDouble);
  for (int call = 0; call < 6; ++call) {  // warm-up, capture, replays
    EXPECT_TRUE(all_close(run.steps->evaluate(data[0], data[1]), expected, 1e-5)) << "call " << call;
  }
  EXPECT_TRUE(run.model.is_training()) << "evaluation restores training mode";
}

TEST_P(EnsembleStepsTest, LossesAreReadBackEveryNStepsInOrder) {
  TrainingRun run(3, 4, device(), graphs::BatchOrder::kShared, 4, /*readback_steps=*/5);
  run.steps->run_epoch();
  run.steps->run_epoch();
  std::vector<LossReport> reports = run.steps->poll_losses();
  for (LossReport& r : run.steps->wait_losses()) reports.push_back(std::move(r));
  // Readbacks happen at replay boundaries at or after every 5 steps: U=4 gives 8 (4+4), then 2+4+4...
  ASSERT_GE(reports.size(), 3u);
  int64_t covered = 0;
  for (const LossReport& r : reports) {
    EXPECT_EQ(r.first_step, covered);
    EXPECT_GE(r.steps, 5);
    EXPECT_EQ(r.mean.sizes(), (c10::IntArrayRef{kMembers}));
    EXPECT_TRUE(at::isfinite(r.mean).all().item<bool>());
    covered += r.steps;
  }
  EXPECT_LE(20 - covered, 4) << "at most one replay's steps are still unreported";
  EXPECT_TRUE(run.steps->poll_losses().empty());
}

// A pack of convolutional members (ensemble/packed_cnn.h) learns a small image task
// through the same steps (CUDA: captured and replayed, 4 steps a replay; CPU: the
// same step function eagerly): 8x8 images of a horizontal or a vertical bar
// (trainer_test_data.h). Every member's loss falls from about log 2.
TEST_P(EnsembleStepsTest, ACnnPackLearnsAnImageTaskThroughTheCapturedSteps) {
  const trainer_testing::BarImages images = trainer_testing::bar_images(256, 5);
  const at::Tensor x = images.x.to(at::kFloat), labels = images.labels;
  ensemble::PackedCNN model(ensemble::PackedCNNOptions({1, 8, 8}, 2)
                                .members(4)
                                .channels({4, 8})
                                .hidden(16)
                                .depth(1)
                                .seed(2)
                                .device(device()));
  ensemble::PackedAdam optimizer(model.parameters(), ensemble::adamw_options().lr(1e-2));
  EnsembleSteps steps(model, optimizer, {x, labels},
                      EnsembleStepsOptions()
                          .batch_size(32)
                          .loss(ensemble::LossKind::kCrossEntropy)
                          .unroll(4)
                          .capture(graphs::CaptureOptions().log([](const std::string&) {})));
  const at::Tensor before = steps.evaluate(x, labels).cpu();
  for (int epoch = 0; epoch < 10; ++epoch) steps.run_epoch();
  const at::Tensor after = steps.evaluate(x, labels).cpu();
  EXPECT_TRUE((before > 0.5).all().item<bool>()) << "near log 2 at initialization: " << before;
  EXPECT_TRUE((after < 0.15).all().item<bool>()) << "before " << before << " after " << after;
  const std::vector<LossReport> reports = steps.wait_losses();
  ASSERT_EQ(reports.size(), 10u);
  EXPECT_TRUE((reports.back().mean < reports.front().mean).all().item<bool>())
      << reports.front().mean << " " << reports.back().mean;
  EXPECT_EQ(steps.steps_taken(), 80);
  if (device().is_cuda()) {
    EXPECT_EQ(steps.unrolled_step().mode(), graphs::StepMode::kGraph);
  }
}

TEST(EnsembleStepsOptions, RefuseBadValuesByName) {
  EXPECT_THROW(EnsembleStepsOptions().unroll(0).validate(), c10::Error);
  EXPECT_THROW(EnsembleStepsOptions().batch_size(-1).validate(), c10::Error);
  EXPECT_THROW(EnsembleStepsOptions().readback_steps(-2).validate(), c10::Error);
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(EnsembleStepsTest);

}  // namespace
}  // namespace packtrain::runtime
