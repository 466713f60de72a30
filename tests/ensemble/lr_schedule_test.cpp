// Learning-rate schedules: the device computation equals the host formula at every
// step, the optimizer applies it per member from each member's own step count, and
// bad settings are refused by name.
#include "packtrain/ensemble/optimizers/lr_schedule.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

namespace packtrain::ensemble {
namespace {

using packtrain::testing::all_close;
using packtrain::testing::DeviceTest;

class LrScheduleTest : public DeviceTest {};

TEST_P(LrScheduleTest, DeviceFactorEqualsTheHostFormulaAtEveryStep) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device());
  const at::Tensor t = at::arange(-1, 130, f64);
  for (const LrSchedule& s :
       {LrSchedule(), LrSchedule().kind(LrScheduleKind::kLinearWarmup).warmup_steps(7),
        LrSchedule().kind(LrScheduleKind::kCosine).warmup_steps(10).total_steps(100).min_factor(0.1),
        LrSchedule().kind(LrScheduleKind::kCosine).total_steps(50)}) {
    std::vector<double> host;
    for (int64_t i = -1; i < 130; ++i) host.push_back(s.factor(i));
    EXPECT_TRUE(all_close(s.factor(t).cpu(), at::tensor(host, at::kDouble), 1e-15)) << to_string(s.kind());
  }
}

TEST(LrSchedule, HostFormulaHasTheDocumentedShape) {
  const LrSchedule warm = LrSchedule().kind(LrScheduleKind::kLinearWarmup).warmup_steps(4);
  EXPECT_DOUBLE_EQ(warm.factor(0), 0.25);
  EXPECT_DOUBLE_EQ(warm.factor(3), 1.0);
  EXPECT_DOUBLE_EQ(warm.factor(1000), 1.0);
  const LrSchedule cos = LrSchedule().kind(LrScheduleKind::kCosine).warmup_steps(10).total_steps(110).min_factor(0.2);
  EXPECT_DOUBLE_EQ(cos.factor(4), 0.5);
  EXPECT_DOUBLE_EQ(cos.factor(10), 1.0);
  EXPECT_NEAR(cos.factor(60), 0.2 + 0.8 * 0.5, 1e-15);  // halfway down
  EXPECT_DOUBLE_EQ(cos.factor(110), 0.2);
  EXPECT_DOUBLE_EQ(cos.factor(5000), 0.2);
  EXPECT_DOUBLE_EQ(LrSchedule().factor(77), 1.0);
}

TEST(LrSchedule, RefusesBadSettingsByName) {
  EXPECT_THROW(LrSchedule().kind(LrScheduleKind::kLinearWarmup).validate(), c10::Error);
  EXPECT_THROW(LrSchedule().kind(LrScheduleKind::kCosine).warmup_steps(10).total_steps(10).validate(), c10::Error);
  EXPECT_THROW(LrSchedule().kind(LrScheduleKind::kCosine).total_steps(10).min_factor(2).validate(), c10::Error);
  try {
    parse_lr_schedule("step");
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected constant, warmup or cosine"), std::string::npos);
  }
  EXPECT_EQ(parse_lr_schedule("cosine"), LrScheduleKind::kCosine);
}

TEST_P(LrScheduleTest, EachMemberFollowsTheScheduleFromItsOwnStepCount) {
  PackedMLP model(PackedMLPOptions(3, 1).members(3).hidden(4).depth(1).device(device()));
  PackedAdam opt(model.parameters(), AdamOptions().lr(0.1));
  opt.set_schedule(LrSchedule().kind(LrScheduleKind::kLinearWarmup).warmup_steps(4));
  const auto bools = at::TensorOptions().dtype(at::kBool).device(device());
  model.parameters().flat_grad().fill_(0.01);
  opt.step();  // every member: update 0, factor 1/4
  EXPECT_TRUE(all_close(opt.current_lr().cpu(), at::full({3}, 0.025, at::kDouble), 1e-15));
  opt.set_mask(at::tensor({1, 0, 1}, at::kLong).to(bools));
  opt.step();  // members 0 and 2: update 1, factor 2/4; member 1 frozen
  opt.set_mask(at::ones({3}, bools));
  opt.step();  // members 0 and 2: update 2 (3/4); member 1: update 1 (2/4)
  EXPECT_TRUE(all_close(opt.current_lr().cpu(), at::tensor({0.075, 0.05, 0.075}, at::kDouble), 1e-15));
  opt.reset_state(at::tensor({1, 0, 0}, at::kLong).to(bools));
  opt.step();  // member 0 restarts its schedule: update 0 (1/4)
  EXPECT_TRUE(all_close(opt.current_lr().cpu(), at::tensor({0.025, 0.075, 0.1}, at::kDouble), 1e-15));
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(LrScheduleTest);

}  // namespace
}  // namespace packtrain::ensemble
