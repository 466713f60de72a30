// The cnn architecture through the registry: a spec without a sample shape, or with
// one that does not fit the rows or the pooling, is a UserError saying what to pass;
// what it cannot do yet (dropout, layer norm, other activations) is refused by name;
// its parameter count is the pack's row; per-member and shared batches agree.
// (Standalone equivalence: packed_model_contract_test.cpp; learning through the
// captured steps: runtime's ensemble_steps_test.cpp.)
#include "packtrain/ensemble/packed_cnn.h"
#include "packtrain/base/user_error.h"
#include "packtrain/ensemble/architectures.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
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
  EXPECT_THAT(make_cnn(too_small), ThrowsMessage<UserError>(HasSubstr(
                                       "has no room for 4 pooling blocks (channels [4, 4, 4, 4]): block 3 would pool "
                                       "a size-1 dimension; pass fewer channels")));

  PackSpec even = image_spec();
  even.kernel_size = 4;
  EXPECT_THAT(make_cnn(even), ThrowsMessage<UserError>(HasSubstr("kernel size must be odd and positive")));

  PackSpec zero_channels = image_spec();
  zero_channels.channels = {4, 0};
  EXPECT_THAT(make_cnn(zero_channels), ThrowsMessage<UserError>(HasSubstr("channels must be positive, got [4, 0]")));

  EXPECT_NO_THROW(make_cnn(image_spec())()) << "the spec itself is fine";
}

TEST(PackedCnn, WhatItCannotDoYetIsRefusedByName) {
  PackSpec dropout = image_spec();
  dropout.dropout = 0.1;
  EXPECT_THAT(make_cnn(dropout), ThrowsMessage<UserError>(HasSubstr("the cnn architecture has no dropout")));
  PackSpec norm = image_spec();
  norm.layer_norm = true;
  EXPECT_THAT(make_cnn(norm), ThrowsMessage<UserError>(HasSubstr("has no layer norm")));
  PackSpec gelu = image_spec();
  gelu.activation = Activation::kGELU;
  EXPECT_THAT(make_cnn(gelu), ThrowsMessage<UserError>(HasSubstr("has no activation other than relu")));
}

TEST(PackedCnn, ParametersPerMemberIsThePacksRowIn2DAnd1D) {
  const PackSpec image = image_spec();
  EXPECT_EQ(architecture("cnn").parameters_per_member(image),
            static_cast<double>(architecture("cnn").make(image)->parameters().per_member()));
  // By hand: conv 1->4 (4*9+4), conv 4->8 (8*4*9+8), 8*2*2 -> 16 (32*16+16), 16 -> 10.
  EXPECT_EQ(architecture("cnn").parameters_per_member(image), 40 + 296 + 528 + 170);
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

}  // namespace
}  // namespace packtrain::ensemble
