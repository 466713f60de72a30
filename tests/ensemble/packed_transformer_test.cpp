// PackedTransformer and the multi-task step: one trunk forward gives the gradients
// of the two-model approach (two forwards through the shared trunk, summed loss);
// decoding with the KV cache equals recomputing the whole prefix; padding is never
// read; member k of a pack is the model a pack of one builds with the same seed; its
// linear layers stay views of the flat buffer through loads and reinitialization; K
// adapters on one frozen trunk are each the trunk with its adapter merged, decode
// through the cache, and train as each adapter alone would.
#include "packtrain/ensemble/packed_transformer.h"
#include "packtrain/ensemble/multitask_step.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_loss.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <utility>
#include <vector>

namespace packtrain::ensemble {
namespace {

using packtrain::testing::all_close;
using packtrain::testing::all_equal;

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

// Llama's block on `o`'s shape: RMSNorm, rotary positions, grouped-query attention,
// SwiGLU, no biases, an untied head.
PackedTransformerOptions llama_block(PackedTransformerOptions o) {
  return o.heads(4)
      .kv_heads(2)
      .rms_norm(true)
      .linear_bias(false)
      .rope_theta(100.0)
      .gated_mlp(true)
      .mlp_hidden(24)
      .tie_lm_head(false);
}

// Right-padded random rows with lengths between 3 and T.
TextBatch random_batch(int64_t B, int64_t T, uint64_t seed, c10::Device device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor tokens = at::randint(0, 259, {B, T}, gen, at::kLong);
  at::Tensor lengths = at::randint(3, T + 1, {B}, gen, at::kLong);
  for (int64_t b = 0; b < B; ++b)
    tokens[b].narrow(0, lengths[b].item<int64_t>(), T - lengths[b].item<int64_t>()).fill_(kPad);
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
  const at::Tensor cls_loss =
      packed_cross_entropy_loss(two_models.classify(two_models.trunk(cls.tokens), cls.lengths), labels);
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

// Decoding one token at a time through the KV cache gives the logits of the whole prefix.
void expect_cache_decoding_equals_full_recomputation(const PackedTransformer& model, c10::Device device,
                                                     const std::string& what) {
  const int64_t K = model.members(), n = 9;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor tokens = at::randint(0, 259, {1, n}, gen, at::kLong).to(device);
  at::NoGradGuard no_grad;
  const at::Tensor full = model.lm_logits(model.trunk(tokens));  // (K, 1, n, V)
  KvCache cache = model.make_cache(1);
  at::Tensor position = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(device));
  for (int64_t t = 0; t < n; ++t) {
    position.fill_(t);
    const at::Tensor token = tokens.narrow(1, t, 1).expand({K, 1}).contiguous();
    const at::Tensor logits = model.lm_logits(model.decode_step(token, position, cache).unsqueeze(2));  // (K,1,1,V)
    EXPECT_TRUE(all_close(logits.squeeze(2), full.narrow(2, t, 1).squeeze(2), 1e-10)) << what << " position " << t;
  }
}

TEST_P(PackedTransformerTest, KvCacheDecodingEqualsFullRecomputation) {
  expect_cache_decoding_equals_full_recomputation(PackedTransformer(small(device())), device(), "gpt2");
  // Llama's: rotary angles at the step's position, the cache holding the key/value heads.
  expect_cache_decoding_equals_full_recomputation(PackedTransformer(llama_block(small(device()))), device(), "llama");
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

// Every linear layer computes with the parameters' own leaf tensors (so gradients
// land in the flat gradient buffer), which lie inside the flat buffer.
void expect_layers_are_views_of_the_flat_buffer(const PackedTransformer& model, const std::string& when) {
  const PackedParameters& p = model.parameters();
  const auto inside = [](const at::Tensor& t, const at::Tensor& flat) {
    const char* begin = static_cast<const char*>(flat.data_ptr());
    const char* end = begin + flat.numel() * flat.element_size();
    const char* first = static_cast<const char*>(t.data_ptr());
    return first >= begin && first + t.numel() * t.element_size() <= end;
  };
  std::vector<std::pair<std::string, PackedLinear>> layers;
  for (int64_t l = model.stage().first_layer; l < model.stage().end_layer; ++l) {
    const std::string b = "block" + std::to_string(l);
    const PackedTransformer::Block& block = model.block(l);
    layers.insert(layers.end(), {{b + ".attn.qkv", block.qkv},
                                 {b + ".attn.out", block.attn_out},
                                 {b + ".mlp.fc", block.mlp_fc},
                                 {b + ".mlp.proj", block.mlp_proj}});
    EXPECT_TRUE(block.ln1_weight.is_same(p.at(b + ".ln1.weight"))) << when << " " << b;
    EXPECT_TRUE(block.ln2_bias.is_same(p.at(b + ".ln2.bias"))) << when << " " << b;
  }
  if (model.last_stage()) {
    layers.emplace_back("cls", model.classifier());
    if (!model.options().tie_lm_head()) layers.emplace_back("lm", model.lm_head());
  }
  ASSERT_FALSE(layers.empty());
  for (const auto& [name, layer] : layers) {
    EXPECT_EQ(layer.pack_of_one(), PackOfOne::kPlainGemm) << when << " " << name;
    EXPECT_TRUE(layer.weight().is_same(p.at(name + ".weight"))) << when << " " << name;
    EXPECT_TRUE(layer.bias().is_same(p.at(name + ".bias"))) << when << " " << name;
    EXPECT_TRUE(inside(layer.weight(), p.flat())) << when << " " << name;
    EXPECT_TRUE(inside(layer.bias(), p.flat())) << when << " " << name;
  }
}

// What is written into the flat buffer in place — through parameters(), a
// checkpoint load (a copy into flat()), reinitialize, member rows — is what the
// layers compute with; gradients land in flat_grad().
TEST_P(PackedTransformerTest, LinearLayersStayViewsOfTheFlatBufferThroughLoadsAndReinitialization) {
  for (const int64_t K : {int64_t{1}, int64_t{2}}) {
    const std::string k = "K=" + std::to_string(K);
    const PackedTransformerOptions options = small(device(), K).tie_lm_head(false);
    PackedTransformer model(options), other(PackedTransformerOptions(options).seed(99));
    expect_layers_are_views_of_the_flat_buffer(model, k + " fresh");
    const TextBatch batch = random_batch(3, 9, 13, device());
    const auto outputs = [&](const PackedTransformer& m) {
      const at::Tensor hidden = m.trunk(batch.tokens);
      return std::make_pair(m.classify(hidden, batch.lengths), m.lm_logits(hidden));
    };
    {
      at::NoGradGuard no_grad;
      model.parameters().at("block1.mlp.proj.weight").fill_(0.25);
      const at::Tensor& proj = model.block(1).mlp_proj.weight();
      EXPECT_TRUE(all_equal(proj, at::full_like(proj, 0.25))) << k << ": a write through parameters()";

      model.parameters().flat().copy_(other.parameters().flat());  // what a checkpoint load does
      const auto [cls, lm] = outputs(model);
      const auto [other_cls, other_lm] = outputs(other);
      EXPECT_TRUE(all_close(cls, other_cls, 1e-12)) << k << ": after a load";
      EXPECT_TRUE(all_close(lm, other_lm, 1e-12)) << k << ": after a load";
      expect_layers_are_views_of_the_flat_buffer(model, k + " loaded");

      model.reinitialize(options.seed());
      const PackedTransformer fresh(options);
      const auto [reinit_cls, reinit_lm] = outputs(model);
      const auto [fresh_cls, fresh_lm] = outputs(fresh);
      EXPECT_TRUE(all_close(reinit_cls, fresh_cls, 1e-12)) << k << ": after reinitialize";
      EXPECT_TRUE(all_close(reinit_lm, fresh_lm, 1e-12)) << k << ": after reinitialize";
      EXPECT_FALSE(at::allclose(reinit_lm, other_lm)) << k << ": another seed, other logits";

      model.parameters().write_member_rows(other.parameters().member_row(K - 1).unsqueeze(0), {0});
      EXPECT_TRUE(all_equal(model.block(0).qkv.weight()[0], other.block(0).qkv.weight()[K - 1])) << k;
      expect_layers_are_views_of_the_flat_buffer(model, k + " member rows written");
    }
    model.parameters().zero_grad();
    const auto [cls, lm] = outputs(model);
    torch::autograd::backward({cls.square().sum() + lm.square().sum()});
    const at::Tensor& grad = model.block(0).qkv.weight().grad();
    ASSERT_TRUE(grad.defined()) << k;
    EXPECT_GT(grad.abs().max().item<double>(), 0.0) << k;
    const char* flat_grad = static_cast<const char*>(model.parameters().flat_grad().data_ptr());
    const char* first = static_cast<const char*>(grad.data_ptr());
    EXPECT_TRUE(first >= flat_grad &&
                first + grad.numel() * grad.element_size() <=
                    flat_grad + model.parameters().flat_grad().numel() * model.parameters().flat_grad().element_size())
        << k << ": the qkv weight's gradient lies in flat_grad()";
  }
}

TEST_P(PackedTransformerTest, AStageHoldsTheLayersOfItsBlocksOnly) {
  const PackedTransformerOptions options = small(device()).layers(3).tie_lm_head(false);
  const PackedTransformer first(options, {0, 1}), last(options, {1, 3});
  expect_layers_are_views_of_the_flat_buffer(first, "first stage");
  expect_layers_are_views_of_the_flat_buffer(last, "last stage");
  EXPECT_THROW(first.block(1), c10::Error);
  EXPECT_THROW(first.classifier(), c10::Error);
  EXPECT_THROW(last.block(0), c10::Error);
  EXPECT_THROW(PackedTransformer(small(device())).lm_head(), c10::Error) << "a tied LM head has no weights";
}

// K adapters on one frozen trunk (lora_rank > 0), on GPT-2's block and on Llama's.
std::vector<std::pair<std::string, PackedTransformerOptions>> adapter_shapes(c10::Device device, int64_t members) {
  const PackedTransformerOptions gpt2 = small(device, members).lora_rank(3).lora_alpha(6.0);
  return {{"gpt2", gpt2}, {"llama", llama_block(gpt2)}};
}

// Moves every adapter off its start (B starts at zero: the members would be the trunk).
void perturb_adapters(PackedTransformer& model, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  const at::Tensor& flat = model.parameters().flat();
  flat.add_(at::randn({flat.numel()}, gen, at::kDouble).to(flat.device(), flat.scalar_type()) * 0.05);
}

// A plain pack of one holding `adapted`'s member k merged (member_tensors).
PackedTransformer merged_member(const PackedTransformer& adapted, int64_t k) {
  PackedTransformer plain(PackedTransformerOptions(adapted.options()).members(1).lora_rank(0));
  at::NoGradGuard no_grad;
  for (const auto& [name, value] : adapted.member_tensors(k)) plain.parameters().at(name)[0].copy_(value);
  return plain;
}

TEST_P(PackedTransformerTest, AdapterMembersAreTheTrunkWithTheirAdaptersMerged) {
  for (const auto& [what, options] : adapter_shapes(device(), 3)) {
    PackedTransformer pack(options);
    EXPECT_EQ(pack.trunk_parameters().members(), 1) << what;
    EXPECT_LT(pack.parameters().per_member() * 5, pack.trunk_parameters().per_member()) << what;
    at::NoGradGuard no_grad;
    const TextBatch batch = random_batch(3, 9, 11, device());
    // At the start (B = 0) every member is the trunk, its own classifier aside.
    const at::Tensor start = pack.lm_logits(pack.trunk(batch.tokens));  // (3, B, T, V)
    EXPECT_TRUE(all_close(start[2], start[0], 1e-12)) << what;
    perturb_adapters(pack, 12);
    const at::Tensor hidden = pack.trunk(batch.tokens);
    const at::Tensor logits = pack.lm_logits(hidden), classes = pack.classify(hidden, batch.lengths);
    EXPECT_FALSE(at::allclose(logits[2], logits[0])) << what << ": members must differ";
    for (int64_t k = 0; k < 3; ++k) {
      const PackedTransformer plain = merged_member(pack, k);
      const at::Tensor h = plain.trunk(batch.tokens);
      EXPECT_TRUE(all_close(plain.lm_logits(h)[0], logits[k], 1e-10)) << what << " member " << k;
      EXPECT_TRUE(all_close(plain.classify(h, batch.lengths)[0], classes[k], 1e-10)) << what << " member " << k;
    }
  }
}

TEST_P(PackedTransformerTest, AdapterKvCacheDecodingEqualsFullRecomputation) {
  for (const auto& [what, options] : adapter_shapes(device(), 2)) {
    PackedTransformer model(options);
    perturb_adapters(model, 13);
    expect_cache_decoding_equals_full_recomputation(model, device(), what);
  }
}

// The pack's point: member k trains exactly as one adapter trained alone on the same
// trunk (a pack of one with first_member k), while the trunk stays frozen.
TEST_P(PackedTransformerTest, AnAdapterPackTrainsEachMemberAsItsAdapterAlone) {
  for (const auto& [what, options] : adapter_shapes(device(), 3)) {
    PackedTransformer pack(options);
    const at::Tensor trunk_before = pack.trunk_parameters().flat().clone();
    PackedAdam optimizer(pack.parameters(), adamw_options().lr(1e-2));
    const at::Tensor labels = at::tensor({0, 2, 1, 1}, at::kLong).to(device());
    std::vector<TextBatch> batches;
    for (uint64_t s = 0; s < 4; ++s) batches.push_back(random_batch(4, 10, 20 + s, device()));
    for (const TextBatch& b : batches) multitask_train_step(pack, optimizer, b, labels, b, {});
    EXPECT_TRUE(all_equal(pack.trunk_parameters().flat(), trunk_before)) << what << ": the trunk is frozen";
    for (int64_t k = 0; k < 3; ++k) {
      PackedTransformer alone(PackedTransformerOptions(options).members(1).first_member(k));
      EXPECT_TRUE(all_equal(alone.trunk_parameters().flat(), trunk_before)) << what << ": one trunk for every seed";
      PackedAdam own(alone.parameters(), adamw_options().lr(1e-2));
      for (const TextBatch& b : batches) multitask_train_step(alone, own, b, labels, b, {});
      EXPECT_TRUE(all_close(alone.parameters().member_row(0), pack.parameters().member_row(k), 1e-10))
          << what << " member " << k;
    }
    EXPECT_FALSE(at::allclose(pack.parameters().member_row(0), pack.parameters().member_row(1)));
  }
}

TEST_P(PackedTransformerTest, AdaptersNeedTheWholeModel) {
  EXPECT_THROW(PackedTransformer(small(device()).layers(2).lora_rank(2), {0, 1}), c10::Error);
  EXPECT_THROW(PackedTransformer(small(device()).lora_rank(-1)), c10::Error);
  EXPECT_THROW(PackedTransformer(small(device()).lora_rank(2).lora_alpha(0)), c10::Error);
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
