// The fused CPU step (ensemble/cpu_fused_step.h) against autograd: the same losses
// and the same gradient for every parameter of every member, across activations,
// losses, depths, shared and per-member batches, both dtypes, and a pack large
// enough to be split over threads. And where it must step aside for autograd.
#include "packtrain/ensemble/cpu_fused_step.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_step.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace packtrain::ensemble {
namespace {

using packtrain::testing::all_close;

struct Case {
  Activation activation;
  LossKind loss;
  int64_t depth;
  bool per_member;
  c10::ScalarType dtype;
  int64_t members = 3, hidden = 7, batch = 6;
};

std::string case_name(const Case& c) {
  std::string loss(to_string(c.loss));
  std::replace(loss.begin(), loss.end(), '-', '_');  // gtest names: letters, digits, '_'
  return std::string(to_string(c.activation)) + "_" + loss + "_depth" + std::to_string(c.depth) +
         (c.per_member ? "_per_member" : "_shared") + (c.dtype == at::kFloat ? "_f32" : "_f64") + "_K" +
         std::to_string(c.members);
}

constexpr int64_t kIn = 5;

int64_t out_features(LossKind loss) { return loss == LossKind::kGaussianNLL ? 4 : 3; }  // 2 targets, or 3 classes

PackedMLP make_model(const Case& c) {
  return PackedMLP(PackedMLPOptions(kIn, out_features(c.loss))
                       .members(c.members)
                       .hidden(c.hidden)
                       .depth(c.depth)
                       .activation(c.activation)
                       .seed(17)
                       .dtype(c.dtype));
}

std::pair<at::Tensor, at::Tensor> make_batch(const Case& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto t = at::TensorOptions().dtype(c.dtype);
  std::vector<int64_t> lead = c.per_member ? std::vector<int64_t>{c.members, c.batch} : std::vector<int64_t>{c.batch};
  std::vector<int64_t> x_shape = lead;
  x_shape.push_back(kIn);
  const at::Tensor x = 2 * at::randn(x_shape, gen, t);
  if (c.loss == LossKind::kCrossEntropy) return {x, at::randint(0, 3, lead, gen, at::kLong)};
  std::vector<int64_t> y_shape = lead;
  y_shape.push_back(c.loss == LossKind::kGaussianNLL ? 2 : 3);
  return {x, at::randn(y_shape, gen, t)};
}

class CpuFusedStep : public ::testing::TestWithParam<Case> {};

TEST_P(CpuFusedStep, EqualsAutograd) {
  const Case c = GetParam();
  const auto [x, y] = make_batch(c);
  PackedMLP fused = make_model(c);
  PackedMLP reference = make_model(c);
  ASSERT_TRUE(cpu_fused_step_applies(fused, x, y, c.loss));

  // Stale gradients must be overwritten, not accumulated into.
  fused.parameters().flat_grad().fill_(7);
  const at::Tensor losses = cpu_fused_gradients(fused, x, y, c.loss);

  reference.parameters().zero_grad();
  const at::Tensor expected = packed_loss(c.loss, reference.forward(x), y);
  torch::autograd::backward({expected.sum()});

  const double tolerance = c.dtype == at::kFloat ? 2e-5 : 1e-11;
  EXPECT_TRUE(all_close(losses, expected.detach(), tolerance));
  for (size_t i = 0; i < fused.parameters().size(); ++i) {
    EXPECT_TRUE(all_close(fused.parameters()[i].grad(), reference.parameters()[i].grad(), tolerance))
        << fused.parameters().spec(i).name;
  }
  // The gradients are not trivially zero (a test that could not fail otherwise).
  EXPECT_GT(fused.parameters().flat_grad().abs().max().item<double>(), 1e-3);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Activation a : {Activation::kReLU, Activation::kGELU, Activation::kSiLU, Activation::kTanh})
    for (LossKind l : {LossKind::kMSE, LossKind::kGaussianNLL, LossKind::kCrossEntropy})
      out.push_back({a, l, 2, false, at::kDouble});
  for (int64_t depth : {0, 1, 3}) out.push_back({Activation::kTanh, LossKind::kMSE, depth, false, at::kDouble});
  for (LossKind l : {LossKind::kMSE, LossKind::kGaussianNLL, LossKind::kCrossEntropy})
    out.push_back({Activation::kReLU, l, 2, true, at::kDouble});
  out.push_back({Activation::kReLU, LossKind::kMSE, 1, false, at::kFloat});
  out.push_back({Activation::kSiLU, LossKind::kGaussianNLL, 2, true, at::kFloat});
  // Big enough per member that members are split over threads.
  out.push_back({Activation::kReLU, LossKind::kMSE, 2, false, at::kDouble, 9, 64, 64});
  out.push_back({Activation::kGELU, LossKind::kCrossEntropy, 1, true, at::kFloat, 9, 64, 64});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuFusedStep, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return case_name(info.param); });

TEST(CpuFusedStepScope, ThreadsDoNotChangeTheResult) {
  const Case c{Activation::kReLU, LossKind::kMSE, 2, false, at::kFloat, 16, 64, 64};
  const auto [x, y] = make_batch(c);
  PackedMLP one = make_model(c), two = make_model(c);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor a = cpu_fused_gradients(one, x, y, c.loss);
  at::set_num_threads(std::max(2, threads));
  const at::Tensor b = cpu_fused_gradients(two, x, y, c.loss);
  at::set_num_threads(threads);
  // Each member is computed by one thread in one order: bit for bit the same.
  EXPECT_TRUE(packtrain::testing::all_equal(a, b));
  EXPECT_TRUE(packtrain::testing::all_equal(one.parameters().flat_grad(), two.parameters().flat_grad()));
}

TEST(CpuFusedStepScope, StepsAsideForWhatItDoesNotHandle) {
  const Case c{Activation::kReLU, LossKind::kMSE, 2, false, at::kFloat};
  const auto [x, y] = make_batch(c);
  PackedMLP plain = make_model(c);
  EXPECT_TRUE(cpu_fused_step_applies(plain, x, y, LossKind::kMSE));
  PackedMLP norm(PackedMLPOptions(kIn, 3).members(3).layer_norm(true));
  EXPECT_FALSE(cpu_fused_step_applies(norm, x, y, LossKind::kMSE)) << "layer norm";
  PackedMLP dropout(PackedMLPOptions(kIn, 3).members(3).dropout(0.1));
  EXPECT_TRUE(cpu_fused_step_applies(dropout, x, y, LossKind::kMSE)) << "dropout is handled";
  EXPECT_FALSE(cpu_fused_step_applies(plain, x.to(at::kDouble), y, LossKind::kMSE)) << "dtype mismatch";
  EXPECT_FALSE(cpu_fused_step_applies(plain, x.narrow(1, 0, 4), y, LossKind::kMSE)) << "wrong input width";
  EXPECT_FALSE(cpu_fused_step_applies(plain, x, y.narrow(0, 0, 5), LossKind::kMSE)) << "rows differ";
  EXPECT_FALSE(cpu_fused_step_applies(plain, x.t().contiguous().t(), y, LossKind::kMSE)) << "not contiguous";

  // What it rejects, the autograd step reports with its own message.
  PackedAdam optimizer(plain.parameters(), adamw_options());
  try {
    packed_train_step(plain, optimizer, x.narrow(1, 0, 4), y, LossKind::kMSE);
    ADD_FAILURE() << "a batch of the wrong width trained";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("input width"), std::string::npos)
        << e.what_without_backtrace();
  }
}

// Dropout: from the same seed and draw count the fused step drops the units
// autograd's forward drops (one rate, per-member rates, float32 and float64), so it
// writes the same gradients; and those differ from a step without dropout (the masks
// act). The masks follow from the pack's seed: the same seed, the same masks.
TEST(CpuFusedStepDropout, DropsTheUnitsAutogradDropsAndWritesItsGradients) {
  struct DropoutCase {
    Case c;
    double rate;
    std::vector<double> member_rates;
  };
  const std::vector<DropoutCase> cases = {
      {{Activation::kTanh, LossKind::kGaussianNLL, 2, false, at::kDouble}, 0.3, {}},
      {{Activation::kReLU, LossKind::kMSE, 3, true, at::kDouble, 4}, 0.0, {0.0, 0.2, 0.5, 0.8}},
      {{Activation::kGELU, LossKind::kCrossEntropy, 2, false, at::kFloat, 9, 64, 64},
       0.0,
       {0.1, 0.0, 0.3, 0.1, 0.5, 0.0, 0.2, 0.4, 0.6}},
  };
  for (const DropoutCase& d : cases) {
    const std::string name = case_name(d.c);
    const auto [x, y] = make_batch(d.c);
    const auto options = [&] {
      return PackedMLPOptions(kIn, out_features(d.c.loss))
          .members(d.c.members)
          .hidden(d.c.hidden)
          .depth(d.c.depth)
          .activation(d.c.activation)
          .seed(17)
          .dtype(d.c.dtype)
          .dropout(d.rate)
          .member_dropout(d.member_rates);
    };
    PackedMLP fused(options()), reference(options());
    PackedMLP plain = make_model(d.c);
    ASSERT_TRUE(cpu_fused_step_applies(fused, x, y, d.c.loss)) << name;

    fused.seed_dropout(123);
    reference.seed_dropout(123);
    at::manual_seed(1);  // the process's generator plays no part: moved between the two
    const at::Tensor losses = cpu_fused_gradients(fused, x, y, d.c.loss);
    at::manual_seed(2);
    reference.parameters().zero_grad();
    const at::Tensor expected = packed_loss(d.c.loss, reference.forward(x), y);
    torch::autograd::backward({expected.sum()});
    // Both draw counts moved on by the same draws.
    const at::Tensor probe = at::empty({d.c.members, 3, 5}, x.options());
    EXPECT_TRUE(packtrain::testing::all_equal(fused.dropout_noise(probe), reference.dropout_noise(probe))) << name;

    const double tolerance = d.c.dtype == at::kFloat ? 2e-5 : 1e-11;
    EXPECT_TRUE(all_close(losses, expected.detach(), tolerance)) << name;
    for (size_t i = 0; i < fused.parameters().size(); ++i) {
      EXPECT_TRUE(all_close(fused.parameters()[i].grad(), reference.parameters()[i].grad(), tolerance))
          << name << " " << fused.parameters().spec(i).name;
    }
    cpu_fused_gradients(plain, x, y, d.c.loss);
    at::Tensor gap = at::zeros({d.c.members}, at::kDouble);  // per member, largest over its parameters
    for (size_t i = 0; i < fused.parameters().size(); ++i) {
      const at::Tensor diff = fused.parameters()[i].grad() - plain.parameters()[i].grad();
      gap = at::maximum(gap, diff.reshape({d.c.members, -1}).abs().amax(1).to(at::kDouble));
    }
    for (int64_t k = 0; k < d.c.members; ++k) {
      const double rate = d.member_rates.empty() ? d.rate : d.member_rates[static_cast<size_t>(k)];
      if (rate == 0.0) {  // a member at rate 0 trains exactly as without dropout
        EXPECT_LT(gap[k].item<double>(), tolerance) << name << " member " << k;
      } else {
        EXPECT_GT(gap[k].item<double>(), 1e-3) << name << " member " << k << " at rate " << rate;
      }
    }
    // Evaluation mode draws nothing and drops nothing.
    fused.train(false);
    fused.seed_dropout(5);
    cpu_fused_gradients(fused, x, y, d.c.loss);
    const at::Tensor after_eval = fused.dropout_noise(probe);
    fused.seed_dropout(5);
    EXPECT_TRUE(packtrain::testing::all_equal(after_eval, fused.dropout_noise(probe))) << name;
    EXPECT_TRUE(all_close(fused.parameters().flat_grad(), plain.parameters().flat_grad(), tolerance)) << name;
  }
}

// Half-precision CPU packs take autograd's path; their forward draws masks too.
TEST(CpuFusedStepDropout, HalfPrecisionPacksDropUnitsToo) {
  for (const c10::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    PackedMLP half(PackedMLPOptions(kIn, 3).members(2).hidden(64).dropout(0.5).dtype(dtype));
    const at::Tensor noise = half.dropout_noise(at::empty({2, 8, 64}, at::TensorOptions().dtype(dtype)));
    const double dropped = noise.eq(0).to(at::kFloat).mean().item<double>();
    EXPECT_GT(dropped, 0.3) << dtype;
    EXPECT_LT(dropped, 0.7) << dtype;
    EXPECT_EQ(noise.max().item<double>(), 2.0) << dtype;  // kept units scaled by 1 / 0.5
    EXPECT_TRUE(half.forward(at::randn({4, kIn}).to(dtype)).isfinite().all().item<bool>()) << dtype;
  }
}

// bf16-mixed: the fused step's rounding (float32 GEMMs of bfloat16-rounded operands,
// results rounded where autocast's are bfloat16 tensors) against autograd through
// the same pack's forward under LibTorch's autocast (PackedModel::forward opens it),
// which runs bfloat16 kernels. The two sum each product in different orders, so a
// sum near a rounding boundary can round to the neighbouring bfloat16 (8-bit
// mantissa: a step of 2^-8 relative) and carry that on through the backward: the
// tolerance is 4 such steps of each tensor's largest value. The float32 step's
// gradients must differ by more than the fused step's do (the rounding acts: a test
// that could not fail without it would prove nothing).
double bf16_tolerance(const at::Tensor& expected) {
  return 4 * std::ldexp(1.0, -8) * expected.abs().max().item<double>();
}

TEST(CpuFusedStepBf16Mixed, EqualsAutogradUnderAutocast) {
  std::vector<std::pair<Case, double>> cases;  // (case, dropout)
  for (Activation a : {Activation::kReLU, Activation::kGELU, Activation::kSiLU, Activation::kTanh})
    for (LossKind l : {LossKind::kMSE, LossKind::kGaussianNLL, LossKind::kCrossEntropy})
      cases.push_back({{a, l, 2, false, at::kFloat, 3, 24, 16}, 0.0});
  cases.push_back({{Activation::kReLU, LossKind::kMSE, 0, false, at::kFloat, 3, 24, 16}, 0.0});
  cases.push_back({{Activation::kReLU, LossKind::kGaussianNLL, 3, true, at::kFloat, 3, 24, 16}, 0.0});
  cases.push_back({{Activation::kGELU, LossKind::kMSE, 2, false, at::kFloat, 3, 24, 16}, 0.3});
  cases.push_back({{Activation::kReLU, LossKind::kCrossEntropy, 2, true, at::kFloat, 9, 64, 64}, 0.2});
  for (const auto& [c, dropout] : cases) {
    const std::string name = case_name(c) + (dropout > 0 ? "_dropout" : "");
    const auto [x, y] = make_batch(c);
    const auto make = [&, &c = c, dropout = dropout](Precision precision) {
      PackedMLP model(PackedMLPOptions(kIn, out_features(c.loss))
                          .members(c.members)
                          .hidden(c.hidden)
                          .depth(c.depth)
                          .activation(c.activation)
                          .dropout(dropout)
                          .seed(17));
      model.set_precision(precision);
      model.train(true);
      return model;
    };
    PackedMLP fused = make(Precision::kBF16Mixed), reference = make(Precision::kBF16Mixed),
              fp32 = make(Precision::kFP32);
    ASSERT_TRUE(cpu_fused_step_applies(fused, x, y, c.loss)) << name;
    const at::Tensor losses = cpu_fused_gradients(fused, x, y, c.loss);
    cpu_fused_gradients(fp32, x, y, c.loss);
    reference.parameters().zero_grad();
    const at::Tensor expected = packed_loss(c.loss, reference.forward(x), y);
    EXPECT_EQ(reference.forward(x).scalar_type(), at::kFloat) << name << ": forward returns float32";
    torch::autograd::backward({expected.sum()});
    EXPECT_TRUE(all_close(losses, expected.detach(), bf16_tolerance(expected))) << name;
    double fp32_gap = 0, worst_seen = 0;
    for (size_t i = 0; i < fused.parameters().size(); ++i) {
      const at::Tensor want = reference.parameters()[i].grad();
      EXPECT_TRUE(all_close(fused.parameters()[i].grad(), want, bf16_tolerance(want)))
          << name << " " << fused.parameters().spec(i).name;
      fp32_gap = std::max(fp32_gap, packtrain::testing::max_abs_diff(fp32.parameters()[i].grad(), want) /
                                        std::max(bf16_tolerance(want), 1e-30));
      worst_seen = std::max(worst_seen, packtrain::testing::max_abs_diff(fused.parameters()[i].grad(), want) /
                                            std::max(bf16_tolerance(want), 1e-30));
    }
    // Measured on an AMD EPYC with AVX-512 BF16 (2026-12-07): the fused step equal to
    // autograd's bit for bit in every case, float32 0.24-27 tolerances away.
    EXPECT_GT(fp32_gap, std::max(0.05, 2 * worst_seen)) << name << ": float32's gradients are as close";
  }
}

TEST(CpuFusedStepScope, RejectsOutOfRangeClasses) {
  const Case c{Activation::kReLU, LossKind::kCrossEntropy, 1, false, at::kFloat};
  auto [x, y] = make_batch(c);
  PackedMLP model = make_model(c);
  y[2] = 3;  // 3 classes: 0, 1, 2
  try {
    cpu_fused_gradients(model, x, y, c.loss);
    ADD_FAILURE() << "an out-of-range class trained";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("out of range for 3 classes"), std::string::npos)
        << e.what_without_backtrace();
  }
}

}  // namespace
}  // namespace packtrain::ensemble
