// The implementations of the packed Adam update — the vectorized CPU pass, the
// fused CUDA kernels and the ATen tensor-op path — agree, and all leave a frozen
// member untouched even when its gradient is NaN.
#include "packtrain/ensemble/optimizers/adam_update.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

namespace packtrain::ensemble::detail {
namespace {

using packtrain::testing::all_close;
using packtrain::testing::all_equal;

struct Block {
  at::Tensor p, g, m, v;
  Block clone() const { return {p.clone(), g.clone(), m.clone(), v.clone()}; }
};

void check_agreement(c10::ScalarType dtype, bool decoupled, double tolerance) {
  constexpr int64_t K = 5, n = 37;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto opts = at::TensorOptions().dtype(dtype);
  Block start{at::randn({K, n}, gen, opts), at::randn({K, n}, gen, opts), at::randn({K, n}, gen, opts) * 0.1,
              at::rand({K, n}, gen, opts) * 0.01};
  start.g[3].fill_(NAN);  // member 3 diverged and is frozen

  AdamCoefficients c;
  c.active = at::tensor({1.0, 1.0, 1.0, 0.0, 1.0}, at::kDouble);
  const at::Tensor lr = at::tensor({1e-3, 2e-3, 3e-3, 4e-3, 5e-3}, at::kDouble);
  const at::Tensor steps = at::tensor({1.0, 2.0, 7.0, 3.0, 50.0}, at::kDouble);
  c.neg_step_size = -(lr / (1 - at::pow(0.9, steps))) * c.active;
  c.sqrt_bias_correction2 = (1 - at::pow(0.999, steps)).sqrt();
  if (decoupled) {
    c.decay_factor = 1 - lr * 0.01 * c.active;
  } else {
    c.l2 = at::full({K}, 0.01, at::kDouble);
  }

  Block fused = start.clone(), ops = start.clone();
  adam_update_cpu(fused.p, fused.g, fused.m, fused.v, c, 0.9, 0.999, 1e-8);
  adam_update_tensor_ops(ops.p, ops.g, ops.m, ops.v, c, 0.9, 0.999, 1e-8);
  for (int64_t k : {0, 1, 2, 4}) {
    EXPECT_TRUE(all_close(fused.p[k], ops.p[k], tolerance)) << "weights of member " << k;
    EXPECT_TRUE(all_close(fused.m[k], ops.m[k], tolerance)) << "exp_avg of member " << k;
    EXPECT_TRUE(all_close(fused.v[k], ops.v[k], tolerance)) << "exp_avg_sq of member " << k;
    EXPECT_FALSE(at::equal(fused.p[k], start.p[k])) << "member " << k << " did not move";
  }
  for (const Block* b : {&fused, &ops}) {
    EXPECT_TRUE(all_equal(b->p[3], start.p[3]));
    EXPECT_TRUE(all_equal(b->m[3], start.m[3]));
    EXPECT_TRUE(all_equal(b->v[3], start.v[3]));
  }
}

TEST(AdamUpdate, CpuPassMatchesTensorOps_AdamW_Float64) { check_agreement(at::kDouble, true, 1e-15); }
TEST(AdamUpdate, CpuPassMatchesTensorOps_AdamL2_Float64) { check_agreement(at::kDouble, false, 1e-15); }
TEST(AdamUpdate, CpuPassMatchesTensorOps_AdamW_Float32) { check_agreement(at::kFloat, true, 1e-6); }

// PackedAdam::step on the device under test (CPU: host coefficients + the CPU pass;
// CUDA: the coefficient and update kernels) against the tensor-op formulas on CPU,
// over steps with a warm-up schedule, per-member rates, a frozen member with NaN
// gradients, AdamW and Adam's L2.
class PackedAdamStep : public packtrain::testing::DeviceTest {};

void expect_step_matches_reference(c10::Device device, bool decoupled) {
  constexpr int64_t K = 5;
  const PackedMLPOptions options = PackedMLPOptions(3, 2).members(K).hidden(9).depth(1).dtype(at::kDouble);
  PackedMLP model(PackedMLPOptions(options).device(device));
  PackedMLP reference(options);
  const AdamOptions adam = AdamOptions().lr(1e-2).weight_decay(0.05).decoupled_weight_decay(decoupled);
  PackedAdam optimizer(model.parameters(), adam);
  const at::Tensor lr = at::tensor({1e-2, 2e-2, 3e-2, 4e-2, 5e-2}, at::kDouble);
  optimizer.set_lr(lr);
  optimizer.set_schedule(LrSchedule().kind(LrScheduleKind::kLinearWarmup).warmup_steps(3));
  const at::Tensor mask = at::ones({K}, at::kBool);
  mask[3] = false;
  optimizer.set_mask(mask);

  at::Tensor p = reference.parameters().flat().view({-1}).clone();
  at::Tensor m = at::zeros_like(p), v = at::zeros_like(p), step = at::zeros({K}, at::kDouble);
  const auto blocks = [&](const at::Tensor& flat) { return reference.parameters().blocks(flat); };
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int t = 0; t < 4; ++t) {
    at::Tensor g = at::randn(p.sizes(), gen, at::kDouble);
    for (const at::Tensor& block : blocks(g)) block[3].fill_(NAN);  // the frozen member's gradient
    model.parameters().flat_grad().copy_(g);
    optimizer.step();

    // Reference: the tensor-op formulas of torch::optim, on CPU.
    const at::Tensor active = mask.to(at::kDouble);
    const at::Tensor rate = lr * optimizer.schedule().factor(step);
    step.add_(active);
    const at::Tensor steps = step.clamp_min(1);
    AdamCoefficients c;
    c.active = active;
    c.neg_step_size = -(rate / (1 - at::pow(0.9, steps))) * active;
    c.sqrt_bias_correction2 = (1 - at::pow(0.999, steps)).sqrt();
    if (decoupled)
      c.decay_factor = 1 - rate * 0.05 * active;
    else
      c.l2 = at::full({K}, 0.05, at::kDouble);
    const auto pb = blocks(p), gb = blocks(g), mb = blocks(m), vb = blocks(v);
    for (size_t i = 0; i < pb.size(); ++i) adam_update_tensor_ops(pb[i], gb[i], mb[i], vb[i], c, 0.9, 0.999, 1e-8);
  }
  EXPECT_TRUE(all_close(model.parameters().flat().cpu(), p, 1e-12));
  EXPECT_TRUE(all_close(optimizer.exp_avg().cpu(), m, 1e-12));
  EXPECT_TRUE(all_close(optimizer.exp_avg_sq().cpu(), v, 1e-12));
  EXPECT_TRUE(all_equal(optimizer.step_count().cpu(), step));
  // The frozen member did not move.
  const auto rows = [&](const at::Tensor& flat) { return reference.parameters().blocks(flat)[0][3]; };
  EXPECT_TRUE(all_equal(rows(model.parameters().flat().cpu()), rows(reference.parameters().flat())));
}

TEST_P(PackedAdamStep, MatchesTheTensorOpReference_AdamW) { expect_step_matches_reference(device(), true); }
TEST_P(PackedAdamStep, MatchesTheTensorOpReference_AdamL2) { expect_step_matches_reference(device(), false); }

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(PackedAdamStep);

}  // namespace
}  // namespace packtrain::ensemble::detail
