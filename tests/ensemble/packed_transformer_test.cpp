// PackedTransformer and the multi-task step: one trunk forward gives the gradients
// of the two-model approach (two forwards through the shared trunk, summed loss);
// decoding with the KV cache equals recomputing the whole prefix; padding is never
// read; member k of a pack is the model a pack of one builds with the same seed.
#include "packtrain/ensemble/multitask_step.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/ensemble/packed_transformer.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

namespace packtrain::ensemble {
namespace {

using packtrain::testing::all_close;

constexpr int64_t kPad = 256;

PackedTransformerOptions small(c10::Device device, int64_t members = 2) {
  return PackedTransformerOptions()
      .members(members)
      .width(16)
      .layers(2)
      .heads(2)
      .max_length(12)
      .classes(3)
      .seed(5)
      .dtype(at::kDouble)
      .device(device);
}

// Right-padded random rows with lengths between 3 and T.
TextBatch random_batch(int64_t B, int64_t T, uint64_t seed, c10::Device device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor tokens = at::randint(0, 259, {B, T}, gen, at::kLong);
  at::Tensor lengths = at::randint(3, T + 1, {B}, gen, at::kLong);
  for (int64_t b = 0; b < B; ++b) tokens[b].narrow(0, lengths[b].item<int64_t>(), T - lengths[b].item<int64_t>()).fill_(kPad);
  return {tokens.to(device), lengths.to(device)};
}

class PackedTransformerTest : public packtrain::testing::DeviceTest {};

std::vector<at::Tensor> gradients(const PackedTransformer& model) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : model.parameters().tensors()) out.push_back(p.grad().clone());
  return out;
}

void expect_one_forward_equals_two(c10::Device device, bool same_texts) {
  PackedTransformer shared(small(device)), two_models(small(device));
  const TextBatch cls = random_batch(4, 10, 1, device);
  const TextBatch lm = same_texts ? cls : random_batch(4, 10, 2, device);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor labels = at::randint(0, 3, {4}, gen, at::kLong).to(device);
  const TaskWeights w{0.7, 1.3};

  shared.parameters().zero_grad();
  const MultiTaskLosses a = multitask_losses(shared, cls, labels, lm);
  torch::autograd::backward({(a.classification * w.classification + a.language_model * w.language_model).sum()});

  // The two-model approach: each head's model runs its own forward through the
  // (same) trunk weights; the summed loss is backpropagated.
  two_models.parameters().zero_grad();
  const at::Tensor cls_loss = packed_cross_entropy_loss(two_models.classify(two_models.trunk(cls.tokens), cls.lengths), labels);
  const at::Tensor lm_loss = packed_lm_loss(two_models.lm_logits(two_models.trunk(lm.tokens)), lm);
  torch::autograd::backward({(cls_loss * w.classification + lm_loss * w.language_model).sum()});

  EXPECT_TRUE(all_close(a.classification, cls_loss, 1e-12));
  EXPECT_TRUE(all_close(a.language_model, lm_loss, 1e-12));
  const auto ga = gradients(shared), gb = gradients(two_models);
  for (size_t i = 0; i < ga.size(); ++i) {
    EXPECT_TRUE(all_close(ga[i], gb[i], 1e-10)) << shared.parameters().spec(i).name;
  }
  EXPECT_GT(shared.parameters().flat_grad().abs().max().item<double>(), 1e-6);
}

TEST_P(PackedTransformerTest, OneTrunkForwardGivesTheTwoModelGradients_SameTexts) {
  expect_one_forward_equals_two(device(), true);
}

TEST_P(PackedTransformerTest, OneTrunkForwardGivesTheTwoModelGradients_DifferentTexts) {
  expect_one_forward_equals_two(device(), false);
}

TEST_P(PackedTransformerTest, KvCacheDecodingEqualsFullRecomputation) {
  PackedTransformer model(small(device()));
  const int64_t K = model.members(), n = 9;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor tokens = at::randint(0, 259, {1, n}, gen, at::kLong).to(device());
  at::NoGradGuard no_grad;
  const at::Tensor full = model.lm_logits(model.trunk(tokens));  // (K, 1, n, V)
  KvCache cache = model.make_cache(1);
  at::Tensor position = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(device()));
  for (int64_t t = 0; t < n; ++t) {
    position.fill_(t);
    const at::Tensor token = tokens.narrow(1, t, 1).expand({K, 1}).contiguous();
    const at::Tensor logits = model.lm_logits(model.decode_step(token, position, cache).unsqueeze(2));  // (K,1,1,V)
    EXPECT_TRUE(all_close(logits.squeeze(2), full.narrow(2, t, 1).squeeze(2), 1e-10)) << "position " << t;
  }
}

TEST_P(PackedTransformerTest, PaddingIsNeverRead) {
  PackedTransformer model(small(device()));
  const TextBatch batch = random_batch(3, 10, 6, device());
  TextBatch other{batch.tokens.clone(), batch.lengths};
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t len = batch.lengths[b].item<int64_t>();
    other.tokens[b].narrow(0, len, 10 - len).fill_(7);  // different junk after the real tokens
  }
  at::NoGradGuard no_grad;
  const at::Tensor labels = at::zeros({3}, at::TensorOptions().dtype(at::kLong).device(device()));
  const MultiTaskLosses a = multitask_losses(model, batch, labels, batch);
  const MultiTaskLosses b = multitask_losses(model, other, labels, other);
  EXPECT_TRUE(all_close(a.classification, b.classification, 1e-12));
  EXPECT_TRUE(all_close(a.language_model, b.language_model, 1e-12));
}

TEST_P(PackedTransformerTest, MemberZeroOfAPackIsThePackOfOne) {
  PackedTransformer pack(small(device(), 3)), one(small(device(), 1));
  const TextBatch batch = random_batch(2, 8, 8, device());
  at::NoGradGuard no_grad;
  const at::Tensor a = pack.lm_logits(pack.trunk(batch.tokens));
  const at::Tensor b = one.lm_logits(one.trunk(batch.tokens));
  EXPECT_TRUE(all_close(a[0], b[0], 1e-12));
  EXPECT_FALSE(at::allclose(a[1], a[0])) << "members must differ";
}

TEST_P(PackedTransformerTest, TrainingStepsLowerBothLosses) {
  PackedTransformer model(small(device()));
  PackedAdam optimizer(model.parameters(), adamw_options().lr(3e-3));
  const TextBatch batch = random_batch(4, 10, 9, device());
  const at::Tensor labels = at::tensor({0, 1, 2, 1}, at::kLong).to(device());
  MultiTaskLosses first, last;
  for (int step = 0; step < 30; ++step) {
    last = multitask_train_step(model, optimizer, batch, labels, batch, {});
    if (step == 0) first = last;
  }
  EXPECT_TRUE((last.classification < first.classification).all().item<bool>());
  EXPECT_TRUE((last.language_model < first.language_model).all().item<bool>());
}

// More than 65,535 (member, row) pairs in one attention call: CUDA's grid limit on
// its y and z dimensions is where a fused attention kernel would break. The whole
// batch must give what its two halves give, forward and backward.
TEST_P(PackedTransformerTest, AttentionOverMoreThan65535MemberRowsEqualsItsHalves) {
  const int64_t K = 64, B = 1100, T = 4;  // K * B = 70,400
  PackedTransformer model(PackedTransformerOptions()
                              .members(K)
                              .width(8)
                              .layers(1)
                              .heads(1)
                              .max_length(T)
                              .classes(2)
                              .seed(11)
                              .dtype(at::kFloat)
                              .device(device()));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
  const at::Tensor tokens = at::randint(0, 259, {B, T}, gen, at::kLong).to(device());
  model.parameters().zero_grad();
  const at::Tensor whole = model.trunk(tokens);  // (K, B, T, d)
  torch::autograd::backward({whole.square().sum()});
  const at::Tensor whole_grad = model.parameters().flat_grad().clone();
  model.parameters().zero_grad();
  std::vector<at::Tensor> halves;
  for (const at::Tensor& rows : tokens.split(B / 2)) {
    halves.push_back(model.trunk(rows));
    torch::autograd::backward({halves.back().square().sum()});
  }
  EXPECT_TRUE(all_close(whole.detach(), at::cat(halves, 1).detach(), 1e-5));
  const double scale = whole_grad.abs().max().item<double>();
  ASSERT_GT(scale, 0);
  EXPECT_TRUE(all_close(whole_grad / scale, model.parameters().flat_grad() / scale, 1e-4));
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(PackedTransformerTest);

TEST(PackedTransformerOptionsTest, RejectsBadShapes) {
  EXPECT_THROW(PackedTransformer(PackedTransformerOptions().width(10).heads(3)), c10::Error);
  EXPECT_THROW(PackedTransformer(PackedTransformerOptions().classes(1)), c10::Error);
  PackedTransformer model(PackedTransformerOptions().max_length(8).width(8).heads(2).layers(1));
  EXPECT_THROW(model.trunk(at::zeros({1, 9}, at::kLong)), c10::Error);  // longer than the positions
}

}  // namespace
}  // namespace packtrain::ensemble
