// The memory estimate (runtime/trainers/memory_estimate.h): parameter counts equal
// real packs', the state it counts equals what a real trainer holds, it grows
// linearly with members, the default runs fit with room to spare, absurd sizes
// stay finite and are refused naming the estimate and what is available.
#include "packtrain/runtime/trainers/memory_estimate.h"
#include "packtrain/ensemble/optimizers/packed_optimizer.h"
#include "packtrain/ensemble/packed_transformer.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"
#include "packtrain/runtime/trainers/uncertainty/active_learning.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

namespace packtrain::runtime {
namespace {

using ::testing::HasSubstr;

constexpr double kMiB = 1024.0 * 1024.0;

void ignore_log(const std::string&) {}

// A trainer prepared on `rows` random rows of 3 features (and as many validation
// rows); classification targets take 3 values.
std::unique_ptr<EnsembleTrainer> prepared(const EnsembleTrainerOptions& options, int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor x = at::randn({2 * rows, 3}, gen, f64);
  const at::Tensor y = options.head() == Head::kClassification ? at::randint(3, {2 * rows, 1}, gen, f64)
                                                               : at::randn({2 * rows, 1}, gen, f64);
  auto trainer = std::make_unique<EnsembleTrainer>(EnsembleTrainerOptions(options).log(ignore_log));
  trainer->prepare(x.narrow(0, 0, rows), y.narrow(0, 0, rows), x.narrow(0, rows, rows), y.narrow(0, rows, rows));
  return trainer;
}

double part(const MemoryEstimate& e, const std::string& prefix) {
  double sum = 0;
  for (const MemoryPart& p : e.parts) {
    if (p.what.rfind(prefix, 0) == 0) sum += p.bytes;
  }
  return sum;
}

// The bundled concrete data's default split: 8 features, 834 / 93 / 103 rows.
EnsembleRunSizes concrete_sizes() {
  return {.features = 8, .classes = 0, .rows = 834, .validation_rows = 93, .predict_rows = 103, .checkpoints = true};
}

TEST(MemoryEstimate, ParameterCountsEqualRealPacks) {
  for (const auto& options :
       {EnsembleTrainerOptions().members(3).hidden(7).depth(2), EnsembleTrainerOptions().members(2).hidden(5).depth(0),
        EnsembleTrainerOptions().members(4).hidden(6).depth(3).layer_norm(true),
        EnsembleTrainerOptions().members(2).hidden(4).depth(1).head(Head::kClassification),
        EnsembleTrainerOptions().members(2).hidden(4).depth(1).head(Head::kMean)}) {
    const auto trainer = prepared(EnsembleTrainerOptions(options).batch_size(8), 24);
    const int64_t outputs = options.head() == Head::kClassification ? 3 : options.head() == Head::kGaussian ? 2 : 1;
    EXPECT_EQ(static_cast<double>(trainer->model().parameters().flat().numel()),
              static_cast<double>(options.members()) * ensemble_parameters_per_member(options, 3, outputs))
        << "depth " << options.depth() << ", head " << to_string(options.head());
  }
  for (const bool tied : {true, false}) {
    MultiTaskTrainerOptions options;
    options.model().members(2).width(16).layers(2).heads(2).max_length(24).tie_lm_head(tied);
    const ensemble::PackedTransformer model(options.model());
    EXPECT_EQ(static_cast<double>(model.parameters().flat().numel()), 2 * transformer_parameters_per_member(options))
        << (tied ? "tied" : "untied") << " LM head";
  }
  // Llama's block (RMSNorm, rotary positions, grouped-query attention, SwiGLU, no
  // biases), and K adapters on it: the trunk's count once, the adapters' per member.
  for (const int64_t rank : {0, 3}) {
    MultiTaskTrainerOptions options;
    options.model().members(2).width(16).layers(2).heads(4).kv_heads(2).max_length(24).rms_norm(true).linear_bias(
        false);
    options.model().rope_theta(100.0).gated_mlp(true).mlp_hidden(24).tie_lm_head(false).lora_rank(rank);
    const ensemble::PackedTransformer model(options.model());
    EXPECT_EQ(static_cast<double>(model.parameters().flat().numel()), 2 * trained_parameters_per_member(options))
        << "rank " << rank;
    EXPECT_EQ(static_cast<double>(model.trunk_parameters().per_member()) + (rank > 0 ? 16 * 2 + 2 : 0),
              transformer_parameters_per_member(options))
        << "rank " << rank << ": a full copy (the classifier lives with the adapters)";
  }
}

// Against a measured allocation: the weights, gradients and optimizer state a real
// trainer holds (its flat buffers and every optimizer state tensor) equal the part
// of the estimate that counts them, within 2% (the per-member scalars).
TEST(MemoryEstimate, StateEqualsWhatARealTrainerHolds) {
  for (const OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSGD}) {
    const EnsembleTrainerOptions options =
        EnsembleTrainerOptions().members(6).hidden(32).depth(2).batch_size(8).optimizer(kind);
    const auto trainer = prepared(options, 24);
    double held = static_cast<double>(trainer->model().parameters().flat().nbytes() +
                                      trainer->model().parameters().flat_grad().nbytes());
    for (const auto& [name, tensor] : trainer->optimizer().state()) held += static_cast<double>(tensor.nbytes());
    const EnsembleRunSizes sizes{.features = 3, .rows = 24, .validation_rows = 24, .predict_rows = 24};
    const double estimated = part(estimate_ensemble_run(options, sizes), "weights, gradients and");
    EXPECT_NEAR(estimated / held, 1.0, 0.02) << to_string(kind) << ": estimated " << estimated << ", held " << held;
  }
}

TEST(MemoryEstimate, GrowsLinearlyWithMembers) {
  // Layer norm: the packed (not the per-thread fused) CPU step, whose activations
  // scale with the members too.
  const auto total = [](int64_t members) {
    const MemoryEstimate e =
        estimate_ensemble_run(EnsembleTrainerOptions().members(members).layer_norm(true), concrete_sizes());
    return e.bytes(MemoryPlace::kHost);
  };
  const double t8 = total(8), t16 = total(16), t32 = total(32);
  EXPECT_GT(t16, t8);
  EXPECT_NEAR(t32 - t16, 2 * (t16 - t8), 1e-9 * t32) << "affine in the members: " << t8 << ", " << t16 << ", " << t32;
  const auto state = [](int64_t members) {
    return part(estimate_ensemble_run(EnsembleTrainerOptions().members(members), concrete_sizes()), "weights");
  };
  EXPECT_DOUBLE_EQ(state(32), 2 * state(16));
}

TEST(MemoryEstimate, DefaultRunsFitWithRoomToSpare) {
  const MemoryEstimate train = estimate_ensemble_run(EnsembleTrainerOptions(), concrete_sizes());
  EXPECT_LT(train.bytes(MemoryPlace::kHost), 64 * kMiB) << format_bytes(train.bytes(MemoryPlace::kHost));
  // active-learn's defaults on yacht: 6 features, 277 pool rows, 31 test rows.
  const MemoryEstimate active = estimate_active_learning(
      EnsembleTrainerOptions().members(5).epochs(100).batch_size(16).order(graphs::BatchOrder::kPerMember),
      ActiveLearningOptions(), {.features = 6, .rows = 277, .predict_rows = 31});
  EXPECT_LT(active.bytes(MemoryPlace::kHost), 64 * kMiB) << format_bytes(active.bytes(MemoryPlace::kHost));
  // multitask train's defaults on the bundled CoLA training set (8551 sentences).
  const MemoryEstimate multitask = estimate_multitask_run(MultiTaskTrainerOptions(), 8551, true);
  EXPECT_LT(multitask.bytes(MemoryPlace::kHost), 1024 * kMiB) << format_bytes(multitask.bytes(MemoryPlace::kHost));
  for (const MemoryEstimate* e : {&train, &active, &multitask}) EXPECT_NO_THROW(check_memory(*e, ""));
}

TEST(MemoryEstimate, RefusesWhatDoesNotFitNamingTheEstimateAndWhatIsAvailable) {
  const MemoryEstimate e =
      estimate_ensemble_run(EnsembleTrainerOptions().hidden(100000000).patience(0), concrete_sizes());
  // The default patience (auto: 50 with the validation rows concrete_sizes has) keeps
  // each member's best weights too: one more copy of the weights.
  const MemoryEstimate stops = estimate_ensemble_run(EnsembleTrainerOptions().hidden(100000000), concrete_sizes());
  EXPECT_GT(stops.bytes(MemoryPlace::kHost), e.bytes(MemoryPlace::kHost));
  const AvailableMemory gib{.device = 1024 * kMiB, .host = 1024 * kMiB};
  try {
    check_memory(e, gib, "lower --hidden");
    FAIL() << "not refused: " << format_bytes(e.bytes(MemoryPlace::kHost));
  } catch (const DataError& error) {
    const std::string message = error.what();
    EXPECT_THAT(message, HasSubstr("this run needs about 9.4 EiB (16 members, hidden 100000000, depth 2, batch 64: "));
    EXPECT_THAT(message, HasSubstr("of weights, gradients and adamw state"));
    EXPECT_THAT(message, HasSubstr("but 1.0 GiB are available on cpu; lower --hidden"));
  }
  EXPECT_NO_THROW(check_memory(e, {.device = 1e30, .host = 1e30}, ""));
}

TEST(MemoryEstimate, DeviceAndHostAreCheckedApartOnAGpu) {
  // No GPU needed: the estimate and the check take the device and the budget given.
  const EnsembleTrainerOptions options =
      EnsembleTrainerOptions().members(64).hidden(4096).device(c10::Device("cuda:0"));
  const MemoryEstimate e = estimate_ensemble_run(options, concrete_sizes());
  EXPECT_GT(e.bytes(MemoryPlace::kDevice), 0);
  EXPECT_GT(e.bytes(MemoryPlace::kHost), 0);
  try {
    check_memory(e, {.device = 1024 * kMiB, .host = 1e30}, "");
    FAIL() << "not refused";
  } catch (const DataError& error) {
    EXPECT_THAT(error.what(), HasSubstr("of device memory"));
    EXPECT_THAT(error.what(), HasSubstr("available on cuda:0"));
  }
  try {
    check_memory(e, {.device = 1e30, .host = 1024 * kMiB}, "");
    FAIL() << "not refused";
  } catch (const DataError& error) {
    EXPECT_THAT(error.what(), HasSubstr("of host memory"));
    EXPECT_THAT(error.what(), HasSubstr("available on the host"));
  }
}

TEST(MemoryEstimate, AbsurdSizesStayFiniteAndAreRefused) {
  const int64_t huge = std::numeric_limits<int64_t>::max();
  const EnsembleTrainerOptions options =
      EnsembleTrainerOptions().members(huge).hidden(huge).depth(huge).batch_size(huge);
  const MemoryEstimate e = estimate_ensemble_run(
      options, {.features = huge, .rows = huge, .validation_rows = huge, .predict_rows = huge, .checkpoints = true});
  const double total = e.bytes(MemoryPlace::kHost);
  EXPECT_TRUE(std::isfinite(total)) << total;
  EXPECT_GT(total, 1e60);
  EXPECT_THROW(check_memory(e, {.device = 1e18, .host = 1e18}, ""), DataError);
  EXPECT_EQ(format_bytes(2.5e75), "2.5e+75 B");
  MultiTaskTrainerOptions multitask;
  multitask.model().members(huge).width(huge).layers(huge).max_length(huge);
  EXPECT_TRUE(std::isfinite(estimate_multitask_run(multitask, huge, true).bytes(MemoryPlace::kHost)));
}

TEST(MemoryEstimate, FormatsBytesInBinaryUnits) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(21.4 * 1024 * kMiB), "21.4 GiB");
  EXPECT_EQ(format_bytes(3.1 * 1024 * 1024 * kMiB), "3.1 TiB");
}

TEST(MemoryEstimate, AvailableMemoryIsReadFromTheMachine) {
  const AvailableMemory cpu = available_memory(c10::Device(c10::kCPU));
  EXPECT_GT(cpu.host, 0);
  EXPECT_EQ(cpu.device, cpu.host);
}

TEST(MemoryEstimate, FreeDeviceMemoryIsReadOnAGpu) {
  const c10::Device cuda("cuda:0");
  if (const std::string why = testing::device_unavailable_reason(cuda); !why.empty()) GTEST_SKIP() << why;
  const AvailableMemory gpu = available_memory(cuda);
  EXPECT_GT(gpu.device, 0);
  EXPECT_GT(gpu.host, 0);
}

}  // namespace
}  // namespace packtrain::runtime
