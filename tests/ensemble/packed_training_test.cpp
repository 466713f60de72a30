// Equivalence: a pack of K members trained with packed optimizers through
// packed_train_step (on CPU its fused member-wise step, except with layer norm)
// equals K standalone torch::nn::Sequential models trained with torch::optim on the
// same batches.
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/optimizers/sgd.h"
#include "packtrain/ensemble/pack.h"
#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_step.h"
#include "tests/support/test_support.h"

#include <torch/torch.h>

#include <functional>
#include <iostream>
#include <memory>

namespace packtrain::ensemble {
namespace {

using packtrain::testing::all_close;
using packtrain::testing::all_equal;
using packtrain::testing::DeviceTest;

constexpr int64_t kMembers = 8;
constexpr int64_t kSteps = 50;
constexpr int64_t kBatch = 16;
constexpr int64_t kIn = 5;
constexpr int64_t kOut = 2;

// float64: both sides do the same arithmetic in a different order (one baddbmm
// against K GEMMs, tensor- against scalar-valued coefficients), so they differ by
// a few ulp per operation, ~1e-15 after 50 steps; 1e-9 is the bound.
constexpr double kFloat64Tolerance = 1e-9;
// float32: the same reordering costs ~1e-7 relative per operation. Adam divides
// by sqrt(v) + eps, which amplifies a gradient's relative error on weights whose
// gradient is near zero; over 50 steps at lr 1e-2 the measured worst case is
// ~1e-6 (CPU), so 1e-4 leaves margin without hiding a wrong update (a missed
// bias correction or weight decay moves weights by ~1e-3 in these runs).
constexpr double kFloat32Tolerance = 1e-4;

struct Scenario {
  std::string optimizer;  // "adamw", "adam", "sgd_nesterov", "sgd_momentum"
  c10::ScalarType dtype = at::kDouble;
  bool per_member_batches = false;
  bool layer_norm = false;
  Activation activation = Activation::kTanh;
  LrSchedule schedule{};  // the packed side computes it on the device; torch gets lr set per step
};

PackedMLPOptions scenario_options(const Scenario& s, c10::Device device) {
  return PackedMLPOptions(kIn, kOut)
      .members(kMembers)
      .hidden(12)
      .depth(2)
      .activation(s.activation)
      .layer_norm(s.layer_norm)
      .seed(1234)
      .dtype(s.dtype)
      .device(device);
}

// Per-member learning rates differ, so a pack that used one member's rate fails.
double member_lr(const Scenario& s, int64_t k) {
  const double base = s.optimizer.starts_with("sgd") ? 0.05 : 1e-2;
  return base * (1.0 + 0.1 * static_cast<double>(k));
}

std::unique_ptr<PackedOptimizer> make_packed_optimizer(const Scenario& s, PackedParameters& params) {
  std::unique_ptr<PackedOptimizer> opt;
  if (s.optimizer == "adamw") {
    opt = std::make_unique<PackedAdam>(params, adamw_options().weight_decay(0.05));
  } else if (s.optimizer == "adam") {
    opt = std::make_unique<PackedAdam>(params, AdamOptions().weight_decay(0.01));
  } else if (s.optimizer == "sgd_nesterov") {
    opt = std::make_unique<PackedSGD>(params, SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3));
  } else {
    opt = std::make_unique<PackedSGD>(params, SGDOptions(0.05).momentum(0.8).dampening(0.1));
  }
  std::vector<double> lrs;
  for (int64_t k = 0; k < kMembers; ++k) lrs.push_back(member_lr(s, k));
  opt->set_lr(torch::tensor(lrs, torch::kDouble));
  opt->set_schedule(s.schedule);
  return opt;
}

std::unique_ptr<torch::optim::Optimizer> make_torch_optimizer(const Scenario& s, torch::nn::Sequential& model,
                                                              int64_t k) {
  const double lr = member_lr(s, k);
  if (s.optimizer == "adamw") {
    return std::make_unique<torch::optim::AdamW>(model->parameters(),
                                                 torch::optim::AdamWOptions(lr).weight_decay(0.05));
  }
  if (s.optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(lr).weight_decay(0.01));
  }
  if (s.optimizer == "sgd_nesterov") {
    return std::make_unique<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9).nesterov(true).weight_decay(1e-3));
  }
  return std::make_unique<torch::optim::SGD>(model->parameters(),
                                             torch::optim::SGDOptions(lr).momentum(0.8).dampening(0.1));
}

// Trains the pack and K standalone models on the same seeded batches and returns
// the largest parameter difference over all members after kSteps steps.
double train_both_and_compare(const Scenario& s, c10::Device device) {
  const PackedMLPOptions options = scenario_options(s, device);
  PackedMLP packed(options);
  std::vector<torch::nn::Sequential> standalone;
  for (int64_t k = 0; k < kMembers; ++k) standalone.push_back(make_standalone_mlp(options, k));
  auto packed_opt = make_packed_optimizer(s, packed.parameters());
  std::vector<std::unique_ptr<torch::optim::Optimizer>> torch_opts;
  for (int64_t k = 0; k < kMembers; ++k) torch_opts.push_back(make_torch_optimizer(s, standalone[k], k));

  auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
  const auto t = torch::TensorOptions().dtype(s.dtype);
  for (int64_t step = 0; step < kSteps; ++step) {
    const std::vector<int64_t> x_shape =
        s.per_member_batches ? std::vector<int64_t>{kMembers, kBatch, kIn} : std::vector<int64_t>{kBatch, kIn};
    const std::vector<int64_t> y_shape =
        s.per_member_batches ? std::vector<int64_t>{kMembers, kBatch, kOut} : std::vector<int64_t>{kBatch, kOut};
    const at::Tensor x = at::randn(x_shape, gen, t).to(device);
    const at::Tensor y = at::randn(y_shape, gen, t).to(device);

    packed_train_step(packed, *packed_opt, x, y, LossKind::kMSE);

    for (int64_t k = 0; k < kMembers; ++k) {
      torch_opts[k]->param_groups()[0].options().set_lr(member_lr(s, k) * s.schedule.factor(step));
      torch_opts[k]->zero_grad();
      const at::Tensor xk = s.per_member_batches ? x[k] : x;
      const at::Tensor yk = s.per_member_batches ? y[k] : y;
      torch::mse_loss(standalone[k]->forward(xk), yk).backward();
      torch_opts[k]->step();
    }
  }
  double worst = 0;
  for (int64_t k = 0; k < kMembers; ++k) {
    const torch::nn::Sequential unpacked = unpack(packed, k);
    const auto a = unpacked->parameters();
    const auto b = standalone[k]->parameters();
    EXPECT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, packtrain::testing::max_abs_diff(a[i], b[i]));
      // A pack that stopped training would also "match" an untrained model: make
      // sure the standalone models really moved away from their initialization.
    }
    const auto initial = make_standalone_mlp(scenario_options(s, device), k)->parameters();
    EXPECT_GT(packtrain::testing::max_abs_diff(b[0], initial[0]), 1e-3) << "member " << k << " did not train";
  }
  std::cout << "  max |packed - standalone| over all parameters after " << kSteps << " steps: " << worst << "\n";
  return worst;
}

class PackedTraining : public DeviceTest {};

TEST_P(PackedTraining, MatchesStandalone_AdamW_Float64) {
  EXPECT_LE(train_both_and_compare({.optimizer = "adamw"}, device()), kFloat64Tolerance);
}

TEST_P(PackedTraining, MatchesStandalone_Adam_Float64) {
  EXPECT_LE(train_both_and_compare({.optimizer = "adam"}, device()), kFloat64Tolerance);
}

TEST_P(PackedTraining, MatchesStandalone_SGDNesterov_Float64) {
  EXPECT_LE(train_both_and_compare({.optimizer = "sgd_nesterov"}, device()), kFloat64Tolerance);
}

TEST_P(PackedTraining, MatchesStandalone_SGDMomentumDampening_Float64) {
  EXPECT_LE(train_both_and_compare({.optimizer = "sgd_momentum"}, device()), kFloat64Tolerance);
}

TEST_P(PackedTraining, MatchesStandalone_AdamW_PerMemberBatches_Float64) {
  EXPECT_LE(train_both_and_compare({.optimizer = "adamw", .per_member_batches = true}, device()), kFloat64Tolerance);
}

TEST_P(PackedTraining, MatchesStandalone_AdamW_LayerNormGELU_Float64) {
  EXPECT_LE(
      train_both_and_compare({.optimizer = "adamw", .layer_norm = true, .activation = Activation::kGELU}, device()),
      kFloat64Tolerance);
}

TEST_P(PackedTraining, MatchesStandalone_AdamW_Float32) {
  EXPECT_LE(train_both_and_compare({.optimizer = "adamw", .dtype = at::kFloat}, device()), kFloat32Tolerance);
}

TEST_P(PackedTraining, MatchesStandalone_SGDNesterov_Float32) {
  EXPECT_LE(train_both_and_compare({.optimizer = "sgd_nesterov", .dtype = at::kFloat}, device()), kFloat32Tolerance);
}

TEST_P(PackedTraining, MatchesStandalone_AdamW_CosineSchedule_Float64) {
  const LrSchedule cosine = LrSchedule().kind(LrScheduleKind::kCosine).warmup_steps(5).total_steps(40).min_factor(0.1);
  EXPECT_LE(train_both_and_compare({.optimizer = "adamw", .schedule = cosine}, device()), kFloat64Tolerance);
}

TEST_P(PackedTraining, MatchesStandalone_SGDNesterov_WarmupSchedule_Float64) {
  const LrSchedule warmup = LrSchedule().kind(LrScheduleKind::kLinearWarmup).warmup_steps(10);
  EXPECT_LE(train_both_and_compare({.optimizer = "sgd_nesterov", .schedule = warmup}, device()), kFloat64Tolerance);
}

// The steps' backward (one concatenation into the flat gradient buffer) gives what
// zero_grad() + backward() gives, whatever the buffer held before, and leaves
// every parameter's .grad() a view of the buffer.
TEST_P(PackedTraining, BackwardIntoFlatGradEqualsZeroGradAndBackward) {
  const PackedMLPOptions options = scenario_options({}, device());
  PackedMLP packed(options);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto t = torch::TensorOptions().dtype(at::kDouble);
  const at::Tensor x = at::randn({kBatch, kIn}, gen, t).to(device()),
                   y = at::randn({kBatch, kOut}, gen, t).to(device());
  packed.parameters().zero_grad();
  torch::autograd::backward({packed_mse_loss(packed.forward(x), y).sum()});
  const at::Tensor expected = packed.parameters().flat_grad().clone();
  packed.parameters().flat_grad().fill_(123.0);  // stale values must not survive
  backward_into_flat_grad(packed.parameters(), packed_mse_loss(packed.forward(x), y).sum());
  EXPECT_TRUE(all_equal(packed.parameters().flat_grad(), expected));
  const at::Tensor& first = packed.parameters().tensors().front();
  EXPECT_EQ(first.grad().data_ptr(), packed.parameters().flat_grad().data_ptr()) << "grad views the flat buffer";
}

// Half-precision packs on every device (a GPU's half-precision kernels, the CPU's
// autograd path): bfloat16 trains with Adam — finite losses that fall for every
// member — and float16 is refused by Adam with the reason (its moments underflow);
// dropout's masks on the device equal the CPU's bit for bit in both.
TEST_P(PackedTraining, HalfPrecisionPacksTrainAndDrawTheCpusMasks) {
  {
    PackedMLP fp16(PackedMLPOptions(kIn, kOut).members(2).dtype(at::kHalf).device(device()));
    try {
      PackedAdam refused(fp16.parameters(), adamw_options());
      ADD_FAILURE() << "Adam accepted float16 parameters";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find("underflow"), std::string::npos)
          << e.what_without_backtrace();
    }
  }
  for (const c10::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    if (dtype == at::kBFloat16) {
      PackedMLP pack(PackedMLPOptions(kIn, kOut).members(kMembers).hidden(32).seed(7).dtype(dtype).device(device()));
      PackedAdam optimizer(pack.parameters(), adamw_options().lr(1e-2));
      auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
      const at::Tensor x = at::randn({64, kIn}, gen).to(dtype).to(device());
      const at::Tensor y = (x.narrow(1, 0, kOut) * 2).contiguous();
      at::Tensor first, last;
      for (int step = 0; step < 40; ++step) {
        last = packed_train_step(pack, optimizer, x, y, LossKind::kMSE).to(at::kFloat).cpu();
        if (step == 0) first = last;
      }
      EXPECT_TRUE(last.isfinite().all().item<bool>()) << dtype << ": " << last;
      EXPECT_TRUE((last < first * 0.7).all().item<bool>()) << dtype << ": first " << first << " last " << last;
    }

    PackedMLP on_device(PackedMLPOptions(kIn, kOut).members(3).hidden(64).dropout(0.3).dtype(dtype).device(device()));
    PackedMLP on_cpu(PackedMLPOptions(kIn, kOut).members(3).hidden(64).dropout(0.3).dtype(dtype));
    on_device.seed_dropout(21);
    on_cpu.seed_dropout(21);
    const auto shape = at::TensorOptions().dtype(dtype);
    EXPECT_TRUE(all_equal(on_device.dropout_noise(at::empty({3, 8, 64}, shape.device(device()))).cpu(),
                          on_cpu.dropout_noise(at::empty({3, 8, 64}, shape))))
        << dtype;
  }
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(PackedTraining);

}  // namespace
}  // namespace packtrain::ensemble
