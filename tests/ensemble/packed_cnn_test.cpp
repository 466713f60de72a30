// The cnn architecture through the registry: a spec without a sample shape, or with
// one that does not fit the rows or the pooling, is a UserError saying what to pass;
// what it cannot do (the MLP's layer norm flag, other activations), a group count not
// dividing a block's channels, a dropout rate out of range and per-member channel
// lists that do not fit are refused by name; a narrower member's padding stays zero;
// its parameter count is the pack's row; per-member and shared batches agree;
// dropout acts in training only, and a data-parallel rank drops its rows' units.
// (Standalone equivalence: packed_model_contract_test.cpp; learning through the
// captured steps: runtime's ensemble_steps_test.cpp.)
#include "packtrain/ensemble/packed_cnn.h"
#include "packtrain/base/user_error.h"
#include "packtrain/ensemble/architectures.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_step.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace packtrain::ensemble {
namespace {

PackSpec image_spec() {
  PackSpec s;
  s.in_features = 64;
  s.out_features = 10;
  s.members = 3;
  s.hidden = 16;
  s.depth = 1;
  s.input_shape = {1, 8, 8};
  s.channels = {4, 8};
  return s;
}

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// Building a cnn pack of `spec`, as a callable for ThrowsMessage.
std::function<void()> make_cnn(const PackSpec& spec) {
  return [spec] { architecture("cnn").make(spec); };
}

TEST(PackedCnn, AMissingOrIncompatibleInputShapeIsAUserErrorSayingWhatToPass) {
  PackSpec none = image_spec();
  none.input_shape.clear();
  EXPECT_THAT(make_cnn(none), ThrowsMessage<UserError>(HasSubstr(
                                  "needs the shape of each sample, {C, H, W} (images) or {C, L} (sequences), and these "
                                  "rows of 64 features have none: pass input_shape")));
  EXPECT_THAT([&] { architecture("cnn").parameters_per_member(none); },
              ThrowsMessage<UserError>(HasSubstr("pass input_shape")))
      << "the memory estimate's count refuses it the same way";

  PackSpec wrong_size = image_spec();
  wrong_size.in_features = 65;
  EXPECT_THAT(
      make_cnn(wrong_size),
      ThrowsMessage<UserError>(HasSubstr("[1, 8, 8] holds 64 values per sample, but the rows have 65 features")));

  PackSpec rank = image_spec();
  rank.input_shape = {1, 4, 4, 4};
  EXPECT_THAT(make_cnn(rank),
              ThrowsMessage<UserError>(HasSubstr("{C, H, W} (images) or {C, L} (sequences), got [1, 4, 4, 4]")));

  PackSpec too_small = image_spec();
  too_small.channels = {4, 4, 4, 4};  // 8 -> 4 -> 2 -> 1 -> nothing to pool
  EXPECT_THAT(make_cnn(too_small),
              ThrowsMessage<UserError>(HasSubstr(
                  "has no room for 4 blocks (channels [4, 4, 4, 4], kernel 3, stride 1, padding 1): block 3 would "
                  "pool a size-1 dimension (its convolution's output); pass fewer channels, a smaller stride")));

  PackSpec strided = image_spec();
  strided.channels = {4, 4};
  strided.stride = 2;  // 8 -> conv 4 -> pool 2 -> conv 1: nothing to pool
  EXPECT_THAT(make_cnn(strided),
              ThrowsMessage<UserError>(HasSubstr("stride 2, padding 1): block 1 would pool a size-1")));
  strided.padding = 3;  // 8 -> conv 6 -> pool 3 -> conv 4 -> pool 2: room
  EXPECT_NO_THROW(make_cnn(strided)());

  PackSpec even = image_spec();
  even.kernel_size = 4;
  EXPECT_THAT(make_cnn(even), ThrowsMessage<UserError>(HasSubstr(
                                  "kernel size must be odd for \"same\" padding k/2, got 4: pass an odd kernel, or an "
                                  "explicit padding")));
  even.padding = 1;
  EXPECT_NO_THROW(make_cnn(even)()) << "an even kernel with an explicit padding";
  PackSpec bad = image_spec();
  bad.stride = 0;
  EXPECT_THAT(make_cnn(bad), ThrowsMessage<UserError>(HasSubstr("cnn stride must be at least 1, got 0")));
  bad = image_spec();
  bad.padding = -2;
  EXPECT_THAT(make_cnn(bad), ThrowsMessage<UserError>(HasSubstr("cnn padding must be >= 0 (or \"same\"), got -2")));

  PackSpec zero_channels = image_spec();
  zero_channels.channels = {4, 0};
  EXPECT_THAT(make_cnn(zero_channels), ThrowsMessage<UserError>(HasSubstr("channels must be positive, got [4, 0]")));

  EXPECT_NO_THROW(make_cnn(image_spec())()) << "the spec itself is fine";
}

TEST(PackedCnn, WhatItCannotDoIsRefusedByName) {
  PackSpec norm = image_spec();
  norm.layer_norm = true;
  EXPECT_THAT(make_cnn(norm), ThrowsMessage<UserError>(HasSubstr(
                                  "has no layer norm flag: pass norm groups instead (--norm-groups 1 normalizes")));
  PackSpec gelu = image_spec();
  gelu.activation = Activation::kGELU;
  EXPECT_THAT(make_cnn(gelu), ThrowsMessage<UserError>(HasSubstr("has no activation other than relu")));
  PackSpec groups = image_spec();  // channels {4, 8}
  groups.norm_groups = 8;
  EXPECT_THAT(make_cnn(groups), ThrowsMessage<UserError>(HasSubstr(
                                    "cnn norm groups 8 do not divide block 0's 4 channels (channels [4, 8]): pass a "
                                    "group count that divides every block's channels")));
  groups.norm_groups = -1;
  EXPECT_THAT(make_cnn(groups), ThrowsMessage<UserError>(HasSubstr("norm groups must be >= 0")));
  PackSpec rate = image_spec();
  rate.dropout = 1.0;
  EXPECT_THAT(make_cnn(rate), ThrowsMessage<UserError>(HasSubstr("cnn dropout must be in [0, 1), got 1")));
  rate.dropout = 0;
  rate.member_dropout = {0.1, 0.2};
  EXPECT_THAT(make_cnn(rate), ThrowsMessage<UserError>(HasSubstr("expected one rate per member (3), got 2")));
  // What it can do: dropout, group norm (4 divides 4 and 8), average pooling.
  PackSpec all = image_spec();
  all.dropout = 0.1;
  all.norm_groups = 4;
  all.pool = Pool::kAvg;
  EXPECT_NO_THROW(make_cnn(all)());
}

TEST(PackedCnn, PerMemberChannelListsThatDoNotFitAreRefusedByName) {
  PackSpec count = image_spec();  // 3 members, channels {4, 8}
  count.member_channels = {{4, 8}, {2, 4}};
  EXPECT_THAT(make_cnn(count), ThrowsMessage<UserError>(HasSubstr("expected one channel list per member (3), got 2")));
  PackSpec blocks = image_spec();
  blocks.member_channels = {{4, 8}, {2}, {4, 8}};
  EXPECT_THAT(make_cnn(blocks), ThrowsMessage<UserError>(HasSubstr(
                                    "cnn member 1's channels [2] do not fit the pack's [4, 8]: give one count per "
                                    "block, each from 1 to the pack's")));
  PackSpec wide = image_spec();
  wide.member_channels = {{4, 8}, {2, 4}, {5, 8}};
  EXPECT_THAT(make_cnn(wide), ThrowsMessage<UserError>(HasSubstr("cnn member 2's channels [5, 8] do not fit")));
  wide.member_channels = {{4, 8}, {0, 4}, {4, 8}};
  EXPECT_THAT(make_cnn(wide), ThrowsMessage<UserError>(HasSubstr("cnn member 1's channels [0, 4] do not fit")));
  PackSpec norm = image_spec();
  norm.norm_groups = 2;
  norm.member_channels = {{4, 8}, {2, 4}, {4, 8}};
  EXPECT_THAT(make_cnn(norm), ThrowsMessage<UserError>(HasSubstr(
                                  "cnn members of different channel counts cannot have GroupNorm (norm groups 2): a "
                                  "group would count a narrower member's padding channels")));
  norm.member_channels = {{4, 8}, {4, 8}, {4, 8}};
  EXPECT_NO_THROW(make_cnn(norm)()) << "GroupNorm with every member at the pack's channels";
  PackSpec mlp = image_spec();
  mlp.member_channels = {{4, 8}, {2, 4}, {4, 8}};
  EXPECT_THAT([&] { architecture("mlp").make(mlp); },
              ThrowsMessage<UserError>(HasSubstr("the mlp architecture has no convolution channels to differ in "
                                                 "(several --channels lists): use --architecture cnn")));
  EXPECT_NO_THROW(make_cnn(mlp)());
}

// A narrower member's padding (the channels beyond its own, the head rows that read
// them) is zero at initialization and stays exactly zero through AdamW steps with
// weight decay, while its own weights move: nothing leaks into or out of it.
TEST(PackedCnn, ANarrowerMembersPaddingStaysZeroThroughTraining) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{2, 8, 8}, std::vector<int64_t>{2, 16}}) {
    PackedCNN pack(PackedCNNOptions(shape, 3)
                       .members(2)
                       .channels({4, 6})
                       .member_channels({{2, 3}, {4, 6}})
                       .hidden(8)
                       .seed(5)
                       .dtype(at::kDouble));
    const PackedCNN own(pack.options().member_options(0));  // member 0's own parameter shapes
    const auto padding_of_member0 = [&] {
      double worst = 0;
      for (size_t i = 0; i < pack.parameters().size(); ++i) {
        const at::Tensor slot = pack.parameters()[i][0].clone();
        // Zero the member's own leading block; what is left is its padding.
        at::Tensor block = slot;
        const std::vector<int64_t>& own_shape = own.parameters().spec(i).shape;
        for (size_t d = 0; d < own_shape.size(); ++d) block = block.narrow(static_cast<int64_t>(d), 0, own_shape[d]);
        block.zero_();
        worst = std::max(worst, slot.abs().max().item<double>());
      }
      return worst;
    };
    EXPECT_EQ(padding_of_member0(), 0.0);
    const at::Tensor before = pack.parameters().member_row(0).clone();
    PackedAdam optimizer(pack.parameters(), AdamOptions().lr(1e-2).weight_decay(0.1).decoupled_weight_decay(true));
    const int64_t I = pack.options().in_features();
    for (int step = 0; step < 5; ++step) {
      const at::Tensor x = at::randn({2, 16, I}, at::TensorOptions().dtype(at::kDouble));
      const at::Tensor y = at::randn({2, 16, 3}, at::TensorOptions().dtype(at::kDouble));
      packed_train_step(pack, optimizer, x, y, LossKind::kMSE);
    }
    EXPECT_EQ(padding_of_member0(), 0.0) << "padding moved, shape " << c10::IntArrayRef(shape);
    EXPECT_GT(packtrain::testing::max_abs_diff(pack.parameters().member_row(0), before), 1e-3)
        << "the member's own weights trained";
  }
}

TEST(PackedCnn, ParametersPerMemberIsThePacksRowIn2DAnd1D) {
  const PackSpec image = image_spec();
  EXPECT_EQ(architecture("cnn").parameters_per_member(image),
            static_cast<double>(architecture("cnn").make(image)->parameters().per_member()));
  // By hand: conv 1->4 (4*9+4), conv 4->8 (8*4*9+8), 8*2*2 -> 16 (32*16+16), 16 -> 10.
  EXPECT_EQ(architecture("cnn").parameters_per_member(image), 40 + 296 + 528 + 170);
  PackSpec normalized = image;
  normalized.norm_groups = 2;  // a weight and a bias per channel: 2 * (4 + 8)
  EXPECT_EQ(architecture("cnn").parameters_per_member(normalized), 40 + 296 + 528 + 170 + 24);
  EXPECT_EQ(architecture("cnn").parameters_per_member(normalized),
            static_cast<double>(architecture("cnn").make(normalized)->parameters().per_member()));
  PackSpec sequence = image_spec();
  sequence.input_shape = {1, 40};
  sequence.in_features = 40;
  sequence.kernel_size = 5;
  sequence.depth = 0;
  EXPECT_EQ(architecture("cnn").parameters_per_member(sequence),
            static_cast<double>(architecture("cnn").make(sequence)->parameters().per_member()));
}

TEST(PackedCnn, APerMemberBatchOfCopiesEqualsTheSharedBatch) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{2, 6, 5}, std::vector<int64_t>{3, 9}}) {
    PackedCNN pack(PackedCNNOptions(shape, 4).members(3).channels({4, 5}).hidden(8).seed(3).dtype(at::kDouble));
    const int64_t I = pack.options().in_features();
    const at::Tensor x = at::randn({7, I}, at::TensorOptions().dtype(at::kDouble));
    const at::Tensor shared = pack.forward(x);
    ASSERT_EQ(shared.sizes(), (std::vector<int64_t>{3, 7, 4}));
    EXPECT_TRUE(packtrain::testing::all_close(pack.forward(x.expand({3, 7, I})), shared, 1e-12));
    // Each member sees only its own rows: changing member 1's batch leaves the others.
    at::Tensor per_member = x.expand({3, 7, I}).clone();
    per_member[1].mul_(2);
    const at::Tensor out = pack.forward(per_member);
    EXPECT_TRUE(packtrain::testing::all_close(out[0], shared[0], 1e-12));
    EXPECT_TRUE(packtrain::testing::all_close(out[2], shared[2], 1e-12));
    EXPECT_GT(packtrain::testing::max_abs_diff(out[1], shared[1]), 1e-6);
  }
}

// Dropout acts in training only: in evaluation a pack with dropout computes what one
// without does; in training each member at a rate above 0 differs, one at rate 0 does
// not. Data parallel: a rank told its rows of a global batch (dropout_rows) drops
// what one process does on those rows.
TEST(PackedCnn, DropoutActsInTrainingAndARankDropsItsRowsUnits) {
  const auto options = [] {
    return PackedCNNOptions({1, 6, 6}, 3).members(3).channels({4}).hidden(32).depth(2).seed(5).dtype(at::kDouble);
  };
  PackedCNN plain(options()), dropping(options().member_dropout({0.0, 0.3, 0.6}));
  const at::Tensor x = at::randn({8, 36}, at::TensorOptions().dtype(at::kDouble));
  plain.train(false);
  dropping.train(false);
  EXPECT_TRUE(packtrain::testing::all_equal(dropping.forward(x), plain.forward(x)));
  dropping.train(true);
  const at::Tensor trained = dropping.forward(x), reference = plain.forward(x);
  EXPECT_TRUE(packtrain::testing::all_equal(trained[0], reference[0])) << "rate 0 drops nothing";
  EXPECT_GT(packtrain::testing::max_abs_diff(trained[1], reference[1]), 1e-6);
  EXPECT_GT(packtrain::testing::max_abs_diff(trained[2], reference[2]), 1e-6);

  PackedCNN whole(options().dropout(0.5)), rank(options().dropout(0.5));
  whole.seed_dropout(9);
  rank.seed_dropout(9);
  rank.dropout_rows(3, 8);
  const at::Tensor all_rows = whole.forward(x);
  EXPECT_TRUE(packtrain::testing::all_close(rank.forward(x.slice(0, 3, 7)), all_rows.slice(1, 3, 7), 1e-12));
  rank.seed_dropout(9);
  rank.dropout_rows(0, 0);  // its rows as a batch of their own: other masks
  EXPECT_GT(packtrain::testing::max_abs_diff(rank.forward(x.slice(0, 3, 7)), all_rows.slice(1, 3, 7)), 1e-6);
}

}  // namespace
}  // namespace packtrain::ensemble

namespace packtrain::ensemble {
namespace {

class PackedCnnOnDevice : public packtrain::testing::DeviceTest {};

// A float32 pack computes in float32 even where the user let PyTorch use TF32 for
// convolutions and matmuls (a GPU's default for cuDNN convolutions): its output is
// within float32 rounding of the same pack in float64, where TF32's 10-bit mantissa
// would be off by about 1e-3. (On a CPU the flags do nothing and this holds anyway.)
TEST_P(PackedCnnOnDevice, ConvolutionsStayFloat32WhenTheUserAllowsTf32) {
  at::Context& context = at::globalContext();
  const at::Float32Precision conv = context.float32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV);
  const at::Float32Precision matmul = context.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL);
  context.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV, at::Float32Precision::TF32);
  context.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL, at::Float32Precision::TF32);
  const auto options = [&](at::ScalarType dtype, c10::Device device) {
    return PackedCNNOptions({1, 8, 8}, 10).members(4).channels({32, 64}).hidden(64).seed(5).dtype(dtype).device(device);
  };
  const PackedCNN single(options(at::kFloat, device()));
  PackedCNN exact(options(at::kDouble, c10::Device(c10::kCPU)));
  {
    at::NoGradGuard no_grad;
    exact.parameters().flat().copy_(single.parameters().flat().cpu());
  }
  const at::Tensor x = at::randn({256, 64}, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor reference = exact.forward(x);
  const at::Tensor out = single.forward(x.to(device(), at::kFloat)).cpu().to(at::kDouble);
  const double scale = reference.abs().max().item<double>();
  EXPECT_LT(packtrain::testing::max_abs_diff(out, reference) / scale, 1e-5)
      << "the float32 pack's convolutions ran at lower precision than float32";
  EXPECT_EQ(context.float32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV), at::Float32Precision::TF32)
      << "the user's setting was not restored";
  context.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV, conv);
  context.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL, matmul);
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(PackedCnnOnDevice);

}  // namespace
}  // namespace packtrain::ensemble
