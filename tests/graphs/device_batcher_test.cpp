// DeviceBatcher: each epoch's order is a permutation (or a bootstrap resample)
// drawn on the device, batches are gathered by the device counter exactly as host
// indexing of that order would, and reseeding repeats the sequence.
#include "packtrain/graphs/device_batcher.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace {

using namespace packtrain::graphs;
using packtrain::testing::all_equal;
using packtrain::testing::DeviceTest;

class DeviceBatcherTest : public DeviceTest {
 protected:
  // x row r = [r, r + 0.5], y row r = r: a gathered batch names its rows.
  std::vector<at::Tensor> data(int64_t rows) const {
    const at::Tensor r = at::arange(rows, at::kFloat);
    return {at::stack({r, r + 0.5}, 1), r.unsqueeze(1).to(at::kLong)};
  }
};

TEST_P(DeviceBatcherTest, SharedOrderVisitsEveryRowOnceAndGathersBatchesByTheCounter) {
  DeviceBatcher b(data(50), device(), /*members=*/4, /*batch=*/8, BatchOrder::kShared, 3);
  EXPECT_EQ(b.batches_per_epoch(), 6) << "the last partial batch is dropped";
  b.start_epoch();
  const at::Tensor order = b.epoch_order().cpu().clone();
  ASSERT_EQ(order.sizes(), (c10::IntArrayRef{50}));
  EXPECT_TRUE(all_equal(std::get<0>(order.sort()), at::arange(50, at::kLong))) << "a permutation";
  EXPECT_FALSE(order.equal(at::arange(50, at::kLong))) << "shuffled";
  for (int64_t i = 0; i < b.batches_per_epoch(); ++i) {
    const std::vector<at::Tensor> batch = b.next_batch();
    const at::Tensor rows = order.narrow(0, i * 8, 8);
    EXPECT_TRUE(all_equal(batch[1].cpu().squeeze(1), rows)) << "batch " << i;
    EXPECT_TRUE(all_equal(batch[0].cpu().select(1, 0), rows.to(at::kFloat)));
    EXPECT_EQ(batch[0].device(), device());
  }
  EXPECT_EQ(b.counter().item<int64_t>(), 6);
  // An overrun wraps around within the epoch instead of reading out of range.
  EXPECT_TRUE(all_equal(b.next_batch()[1].cpu().squeeze(1), order.narrow(0, 0, 8)));
  b.start_epoch();
  EXPECT_EQ(b.counter().item<int64_t>(), 0);
  EXPECT_FALSE(b.epoch_order().cpu().equal(order)) << "a new order each epoch";
}

TEST_P(DeviceBatcherTest, PerMemberOrdersArePermutationsThatDifferBetweenMembers) {
  DeviceBatcher b(data(40), device(), 3, 10, BatchOrder::kPerMember, 5);
  b.start_epoch();
  const at::Tensor order = b.epoch_order().cpu().clone();
  ASSERT_EQ(order.sizes(), (c10::IntArrayRef{3, 40}));
  for (int64_t k = 0; k < 3; ++k) {
    EXPECT_TRUE(all_equal(std::get<0>(order[k].sort()), at::arange(40, at::kLong))) << "member " << k;
  }
  EXPECT_FALSE(order[0].equal(order[1]));
  const std::vector<at::Tensor> batch = b.next_batch();
  ASSERT_EQ(batch[0].sizes(), (c10::IntArrayRef{3, 10, 2}));
  ASSERT_EQ(batch[1].sizes(), (c10::IntArrayRef{3, 10, 1}));
  EXPECT_TRUE(all_equal(batch[1].cpu().squeeze(2), order.narrow(1, 0, 10)));
}

TEST_P(DeviceBatcherTest, BootstrapDrawsRowsWithReplacementInRange) {
  DeviceBatcher b(data(200), device(), 8, 50, BatchOrder::kBootstrap, 7);
  b.start_epoch();
  const at::Tensor order = b.epoch_order().cpu().clone();
  ASSERT_EQ(order.sizes(), (c10::IntArrayRef{8, 200}));
  EXPECT_GE(order.min().item<int64_t>(), 0);
  EXPECT_LT(order.max().item<int64_t>(), 200);
  // With replacement: some rows repeat (P(no repeat in 200 draws) is ~1e-86).
  EXPECT_LT(std::get<0>(at::_unique2(order[0], true, false, false)).size(0), 200);
}

TEST_P(DeviceBatcherTest, ReseedingRepeatsTheOrders) {
  DeviceBatcher a(data(30), device(), 2, 5, BatchOrder::kPerMember, 11);
  DeviceBatcher b(data(30), device(), 2, 5, BatchOrder::kPerMember, 99);
  a.start_epoch();
  const at::Tensor first = a.epoch_order().clone();
  a.start_epoch();
  b.reseed(11);
  b.start_epoch();
  EXPECT_TRUE(all_equal(b.epoch_order(), first));
}

TEST_P(DeviceBatcherTest, RejectsBadShapesAndSizes) {
  const auto opts = at::TensorOptions();
  EXPECT_THROW(DeviceBatcher({at::zeros({10, 2}), at::zeros({9, 1})}, device(), 2, 4, BatchOrder::kShared, 0),
               c10::Error);
  try {
    DeviceBatcher({at::zeros({10, 2}, opts)}, device(), 2, 11, BatchOrder::kShared, 0);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch size 11 is larger than the data set (10 rows)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_batch_order("random"), c10::Error);
  EXPECT_EQ(parse_batch_order("bootstrap"), BatchOrder::kBootstrap);
}

TEST_P(DeviceBatcherTest, ActiveRowsPerMemberRestrictEachMembersEpochToItsOwnRows) {
  DeviceBatcher b(data(40), device(), 2, 4, BatchOrder::kPerMember, 9);
  const at::Tensor rows = at::tensor({0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15}, at::kLong).view({2, 8});
  b.set_active_rows(rows);
  EXPECT_EQ(b.batches_per_epoch(), 2) << "8 active rows in batches of 4";
  for (int epoch = 0; epoch < 3; ++epoch) {
    b.start_epoch();
    at::Tensor seen = at::cat({b.next_batch()[1], b.next_batch()[1]}, 1).cpu().squeeze(2);  // (2, 8)
    for (int64_t k = 0; k < 2; ++k) {
      EXPECT_TRUE(all_equal(std::get<0>(seen[k].sort()), rows[k])) << "member " << k << " sees exactly its rows";
    }
    // The counter wraps at the active epoch's 2 batches, not the full data's 10.
    EXPECT_TRUE(all_equal(b.next_batch()[1].cpu().squeeze(2), seen.narrow(1, 0, 4)));
  }
  b.clear_active_rows();
  EXPECT_EQ(b.batches_per_epoch(), 10);
  EXPECT_THROW(b.set_active_rows(at::arange(3, at::kLong)), c10::Error) << "fewer rows than a batch";
  EXPECT_THROW(b.set_active_rows(at::tensor({0, 1, 2, 40}, at::kLong)), c10::Error) << "out of range";
  DeviceBatcher shared(data(40), device(), 2, 4, BatchOrder::kShared, 9);
  EXPECT_THROW(shared.set_active_rows(rows), c10::Error) << "per-member rows with a shared order";
  shared.set_active_rows(at::arange(20, 28, at::kLong));
  shared.start_epoch();
  const at::Tensor batch = at::cat({shared.next_batch()[1], shared.next_batch()[1]}).cpu().squeeze(1);
  EXPECT_TRUE(all_equal(std::get<0>(batch.sort()), at::arange(20, 28, at::kLong)));
}

TEST_P(DeviceBatcherTest, RestoredOrderStateRepeatsTheNextOrders) {
  DeviceBatcher b(data(30), device(), 3, 5, BatchOrder::kBootstrap, 4);
  b.start_epoch();
  const OrderState state = b.order_state();
  EXPECT_EQ(state.seed, 4u);
  EXPECT_EQ(state.epochs_drawn, 1);
  b.start_epoch();
  const at::Tensor next = b.epoch_order().cpu().clone();
  DeviceBatcher other(data(30), device(), 3, 5, BatchOrder::kBootstrap, 99);
  other.restore_order_state(state);
  other.start_epoch();
  EXPECT_TRUE(all_equal(other.epoch_order().cpu(), next));
  // Every epoch draws a different order (the per-epoch seeds differ).
  other.start_epoch();
  EXPECT_FALSE(all_equal(other.epoch_order().cpu(), next));
}

// The state is two integers whatever the device: one taken on the CPU restores on
// this test's device and draws there what that device's batcher would draw.
TEST_P(DeviceBatcherTest, OrderStateIsDeviceNeutral) {
  DeviceBatcher cpu(data(30), c10::Device(c10::kCPU), 3, 5, BatchOrder::kPerMember, 4);
  cpu.start_epoch();
  cpu.start_epoch();
  DeviceBatcher here(data(30), device(), 3, 5, BatchOrder::kPerMember, 4);
  here.start_epoch();
  here.start_epoch();
  here.start_epoch();
  const at::Tensor third = here.epoch_order().cpu().clone();
  DeviceBatcher resumed(data(30), device(), 3, 5, BatchOrder::kPerMember, 77);
  resumed.restore_order_state(cpu.order_state());
  resumed.start_epoch();
  EXPECT_TRUE(all_equal(resumed.epoch_order().cpu(), third));
  EXPECT_THROW(resumed.restore_order_state({4, -1}), c10::Error);
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(DeviceBatcherTest);

}  // namespace
