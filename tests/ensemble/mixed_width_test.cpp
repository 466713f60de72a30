// Packs of members of different widths (PackedMLPOptions::member_hidden, packed_mlp.h):
// a narrower member's padding is zero at initialization, gets no gradient through
// autograd or the fused CPU step, and stays zero through AdamW with weight decay;
// pack() and unpack() move a member of its own width in and out; the options refuse
// what cannot work. (Member k equals the standalone network of its own width,
// forward and training: the contract test's mlp_mixed_widths row.)
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/pack.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_step.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

namespace packtrain::ensemble {
namespace {

using ::testing::HasSubstr;

PackedMLPOptions widths(std::vector<int64_t> member_hidden, c10::ScalarType dtype = at::kFloat) {
  const auto widest = *std::max_element(member_hidden.begin(), member_hidden.end());
  return PackedMLPOptions(6, 2)
      .members(static_cast<int64_t>(member_hidden.size()))
      .hidden(widest)
      .member_hidden(std::move(member_hidden))
      .depth(2)
      .seed(3)
      .dtype(dtype);
}

// Where member k's padding is: the zeros of a freshly initialized row (every drawn
// value is non-zero).
at::Tensor padding_of(const PackedMLPOptions& options, int64_t k) {
  return PackedMLP(options).parameters().member_row(k) == 0;
}

// Member k's gradients as one row, in member_row's order.
at::Tensor grad_row(const PackedParameters& params, int64_t k) {
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& block : params.blocks(params.flat_grad())) pieces.push_back(block[k]);
  return at::cat(pieces);
}

TEST(MixedWidths, PaddingIsExactlyTheUnitsBeyondEachMembersWidth) {
  const PackedMLPOptions options = widths({3, 10, 7});
  // Parameters of a 6 -> w -> w -> 2 network: 6w + w, w*w + w, 2w + 2.
  const auto own = [](int64_t w) { return 6 * w + w + w * w + w + 2 * w + 2; };
  const int64_t slot = own(10);
  for (int64_t k = 0; k < 3; ++k) {
    const int64_t w = options.member_hidden()[static_cast<size_t>(k)];
    EXPECT_EQ(padding_of(options, k).sum().item<int64_t>(), slot - own(w)) << "member " << k;
  }
}

TEST(MixedWidths, PaddingStaysZeroThroughFusedAndAutogradSteps) {
  for (const c10::ScalarType dtype : {at::kFloat, at::kDouble}) {
    const PackedMLPOptions options = widths({4, 16, 9}, dtype);
    PackedMLP pack(options);
    PackedAdam optimizer(pack.parameters(), AdamOptions().lr(1e-2).weight_decay(0.1).decoupled_weight_decay(true));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    const auto f = at::TensorOptions().dtype(dtype);
    const at::Tensor before = pack.parameters().flat().clone();
    for (int step = 0; step < 10; ++step) {
      const at::Tensor x = at::randn({3, 32, 6}, gen, f), y = at::randn({3, 32, 2}, gen, f);
      packed_train_step(pack, optimizer, x, y, LossKind::kMSE);  // the fused CPU step
    }
    // Autograd's gradient (the path a GPU pack takes) is zero on the padding too.
    pack.parameters().zero_grad();
    at::mse_loss(pack.forward(at::randn({32, 6}, gen, f)), at::randn({3, 32, 2}, gen, f)).backward();
    for (int64_t k = 0; k < 3; ++k) {
      const at::Tensor padding = padding_of(options, k);
      const at::Tensor row = pack.parameters().member_row(k);
      EXPECT_EQ(row.masked_select(padding).abs().sum().item<double>(), 0.0) << "member " << k << " " << dtype;
      EXPECT_EQ(grad_row(pack.parameters(), k).masked_select(padding).abs().sum().item<double>(), 0.0)
          << "member " << k << " " << dtype;
    }
    EXPECT_FALSE(torch::equal(before, pack.parameters().flat())) << "training moved nothing";
  }
}

TEST(MixedWidths, UnpackGivesEachMemberItsOwnWidthAndPackTakesItBack) {
  const PackedMLPOptions options = widths({3, 8, 5});
  const PackedMLP original(options);
  std::vector<torch::nn::Sequential> members;
  for (int64_t k = 0; k < 3; ++k) {
    members.push_back(unpack(original, k));
    const auto* first = members.back()->ptr(0)->as<torch::nn::Linear>();
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(first->weight.size(0), options.member_hidden()[static_cast<size_t>(k)]) << "member " << k;
  }
  const PackedMLP repacked = pack(members, options);
  EXPECT_TRUE(torch::equal(repacked.parameters().flat(), original.parameters().flat()));
  // A model of another width than its slot's is refused, naming the parameter.
  std::swap(members[0], members[1]);
  EXPECT_THAT([&] { pack(members, options); },
              ::testing::ThrowsMessage<c10::Error>(HasSubstr("pack: model 0 parameter 'linear0.weight'")));
}

TEST(MixedWidths, OptionsRefuseWhatCannotWork) {
  EXPECT_THAT(
      [] {
        PackedMLP(widths({3, 8}).layer_norm(true));
      },
      ::testing::ThrowsMessage<c10::Error>(HasSubstr("layer norm with members of different widths")));
  EXPECT_THAT(
      [] {
        PackedMLP(widths({3, 8}).hidden(6));
      },
      ::testing::ThrowsMessage<c10::Error>(HasSubstr("per-member width must be in [1, hidden=6], got 8")));
  EXPECT_THAT(
      [] {
        PackedMLP(widths({3, 8}).members(3));
      },
      ::testing::ThrowsMessage<c10::Error>(HasSubstr("expected one width per member (3), got 2")));
}

}  // namespace
}  // namespace packtrain::ensemble
