// The two implementations of the packed Adam block update — the vectorized CPU
// pass and the ATen tensor-op path that CUDA uses — agree, and both leave a frozen
// member untouched even when its gradient is NaN.
#include "ensemble/optimizers/adam_update.h"
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

}  // namespace
}  // namespace packtrain::ensemble::detail
