// Initialization, pack/unpack, masks, in-place re-initialization and the errors
// bad input gets.
#include "packtrain/ensemble/member_seed.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/optimizers/sgd.h"
#include "packtrain/ensemble/pack.h"
#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "tests/support/test_support.h"

#include <gmock/gmock.h>
#include <torch/torch.h>

namespace packtrain::ensemble {
namespace {

using packtrain::testing::all_close;
using packtrain::testing::all_equal;
using packtrain::testing::DeviceTest;
using ::testing::HasSubstr;

PackedMLPOptions small(c10::Device device, int64_t members = 8) {
  return PackedMLPOptions(6, 3).members(members).hidden(10).depth(2).seed(42).device(device);
}

void expect_params_equal(const torch::nn::Sequential& a, const torch::nn::Sequential& b) {
  const auto pa = a->parameters(), pb = b->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(all_equal(pa[i], pb[i])) << "parameter " << i;
}

class PackedModel : public DeviceTest {};

TEST_P(PackedModel, MemberEqualsStandaloneBitwise) {
  for (bool layer_norm : {false, true}) {
    const auto options = small(device()).layer_norm(layer_norm).activation(Activation::kSiLU);
    PackedMLP packed(options);
    for (int64_t k = 0; k < packed.members(); ++k)
      expect_params_equal(unpack(packed, k), make_standalone_mlp(options, k));
  }
}

TEST_P(PackedModel, MembersDoNotDependOnK) {
  PackedMLP three(small(device(), 3));
  PackedMLP eight(small(device(), 8));
  for (int64_t k = 0; k < 3; ++k)
    EXPECT_TRUE(all_equal(three.parameters().member_row(k), eight.parameters().member_row(k)));
  EXPECT_FALSE(at::equal(eight.parameters().member_row(0).cpu(), eight.parameters().member_row(1).cpu()))
      << "members share their initialization";
}

TEST_P(PackedModel, ForwardMatchesStandalone_SharedAndPerMemberBatches) {
  const auto options = small(device()).dtype(at::kDouble).layer_norm(true).activation(Activation::kGELU);
  PackedMLP packed(options);
  const at::Tensor shared = at::randn({7, 6}, at::TensorOptions().dtype(at::kDouble).device(device()));
  const at::Tensor per_member = at::randn({8, 7, 6}, at::TensorOptions().dtype(at::kDouble).device(device()));
  const at::Tensor out_shared = packed.forward(shared);
  const at::Tensor out_per = packed.forward(per_member);
  ASSERT_EQ(out_shared.sizes(), (c10::IntArrayRef{8, 7, 3}));
  for (int64_t k = 0; k < 8; ++k) {
    auto model = make_standalone_mlp(options, k);
    EXPECT_TRUE(all_close(out_shared[k], model->forward(shared), 1e-12));
    EXPECT_TRUE(all_close(out_per[k], model->forward(per_member[k]), 1e-12));
  }
}

// Per-member dropout: with every hidden unit 1 and the output layer the identity,
// the output is the mask itself. Member k zeroes a fraction ~p_k of its units and
// scales the rest by exactly 1 / (1 - p_k); rate 0 changes nothing; eval mode none.
TEST_P(PackedModel, MemberDropoutDropsEachMemberAtItsOwnRate) {
  const std::vector<double> rates{0.0, 0.2, 0.5, 0.8};
  const int64_t H = 32, B = 256;
  PackedMLP model(
      PackedMLPOptions(3, H).members(4).hidden(H).depth(1).member_dropout(rates).dtype(at::kDouble).device(device()));
  EXPECT_TRUE(model.options().has_dropout());
  {
    at::NoGradGuard no_grad;
    model.parameters().at("linear0.weight").zero_();
    model.parameters().at("linear0.bias").fill_(1.0);  // ReLU(1) = 1
    model.parameters().at("linear1.weight").copy_(at::eye(H, at::TensorOptions().dtype(at::kDouble)).expand({4, H, H}));
    model.parameters().at("linear1.bias").zero_();
  }
  const at::Tensor x = at::randn({B, 3}, at::TensorOptions().dtype(at::kDouble).device(device()));
  model.train(true);
  const at::Tensor out = model.forward(x).detach().cpu();  // (K, B, H)
  for (int64_t k = 0; k < 4; ++k) {
    const double p = rates[static_cast<size_t>(k)];
    const at::Tensor o = out[k];
    const at::Tensor kept = o != 0;
    EXPECT_TRUE(at::allclose(
        o.masked_select(kept),
        at::full({kept.sum().item<int64_t>()}, 1.0 / (1.0 - p), at::TensorOptions().dtype(at::kDouble)), 0, 1e-15))
        << "member " << k;
    const double n = static_cast<double>(B * H), dropped = n - kept.sum().item<double>();
    // Binomial(n, p): within 5 standard deviations (n = 8192).
    EXPECT_NEAR(dropped / n, p, 5 * std::sqrt(p * (1 - p) / n) + 1e-12) << "member " << k;
  }
  model.train(false);
  EXPECT_TRUE(at::equal(model.forward(x).cpu(), at::ones({4, B, H}, at::kDouble)));
  EXPECT_FALSE(PackedMLPOptions(3, 1).members(2).member_dropout({0.0, 0.0}).has_dropout());
}

// Pearson correlation of two 0/1 masks of the same shape.
double mask_correlation(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.ne(0).to(at::kDouble).flatten(), y = b.ne(0).to(at::kDouble).flatten();
  const at::Tensor dx = x - x.mean(), dy = y - y.mean();
  return ((dx * dy).sum() / (dx.square().sum() * dy.square().sum()).sqrt()).item<double>();
}

// Dropout's masks are a function of (seed, draw, member, row, unit) alone: on any
// device they equal a CPU pack's draws bit for bit; a member-parallel shard
// (first_member) draws the whole pack's members, a data-parallel rank (dropout_rows)
// the whole batch's rows; reseeding repeats the draws. And they look random: each
// member drops at its rate, and neighbouring units, rows, members (at one rate) and
// successive draws are uncorrelated.
TEST_P(PackedModel, DropoutMasksFollowFromSeedDrawMemberAndRowAlone) {
  const std::vector<double> rates{0.1, 0.5, 0.3, 0.5};
  const int64_t K = 4, B = 256, H = 64;
  const auto options = [&](c10::Device d) {
    return PackedMLPOptions(3, 2).members(K).hidden(H).member_dropout(rates).seed(9).dtype(at::kDouble).device(d);
  };
  const auto probe = [&](c10::Device d, int64_t members, int64_t rows) {
    return at::empty({members, rows, H}, at::TensorOptions().dtype(at::kDouble).device(d));
  };
  const c10::Device cpu(c10::kCPU);
  PackedMLP pack(options(device())), reference(options(cpu));
  pack.seed_dropout(77);
  reference.seed_dropout(77);
  std::vector<at::Tensor> draws;
  for (int d = 0; d < 3; ++d) {
    draws.push_back(pack.dropout_noise(probe(device(), K, B)).cpu());
    EXPECT_TRUE(all_equal(draws.back(), reference.dropout_noise(probe(cpu, K, B)))) << "draw " << d;
  }
  pack.seed_dropout(77);
  EXPECT_TRUE(all_equal(pack.dropout_noise(probe(device(), K, B)).cpu(), draws[0])) << "reseeding repeats";
  pack.seed_dropout(78);
  EXPECT_FALSE(at::equal(pack.dropout_noise(probe(device(), K, B)).cpu(), draws[0])) << "another seed, other masks";

  // Members 1 and 2 of the pack, alone (a member-parallel shard), in their second draw.
  PackedMLP shard(options(device()).members(2).first_member(1).member_dropout({rates[1], rates[2]}));
  shard.seed_dropout(77);
  shard.dropout_noise(probe(device(), 2, B));
  EXPECT_TRUE(all_equal(shard.dropout_noise(probe(device(), 2, B)).cpu(), draws[1].slice(0, 1, 3)));
  // Rows 100 .. 163 of the batch (a data-parallel rank), in the third draw.
  PackedMLP rank(options(device()));
  rank.seed_dropout(77);
  rank.dropout_rows(100, B);
  for (int d = 0; d < 3; ++d) {
    const at::Tensor mine = rank.dropout_noise(probe(device(), K, 64)).cpu();
    if (d == 2) {
      EXPECT_TRUE(all_equal(mine, draws[2].slice(1, 100, 164)));
    }
  }

  const at::Tensor all = at::stack(draws, 1);  // (K, 3 draws, B, H)
  for (int64_t k = 0; k < K; ++k) {
    const double p = rates[static_cast<size_t>(k)], n = 3.0 * B * H;
    const at::Tensor m = all[k];
    EXPECT_NEAR(m.eq(0).to(at::kDouble).mean().item<double>(), p, 5 * std::sqrt(p * (1 - p) / n)) << "member " << k;
    EXPECT_TRUE(all_close(m.masked_select(m.ne(0)),
                          at::full({1}, 1.0 / (1.0 - p), at::kDouble).expand({m.ne(0).sum().item<int64_t>()}), 0.0));
  }
  // |r| of independent masks is ~N(0, 1/n): 5 / sqrt(n) is a 5-sigma bound.
  const at::Tensor m = all[1];  // rate 0.5: (3, B, H)
  const double bound = 5.0 / std::sqrt(static_cast<double>(m.numel()) / 2);
  EXPECT_LT(std::abs(mask_correlation(m.slice(2, 0, H - 1), m.slice(2, 1, H))), bound) << "neighbouring units";
  EXPECT_LT(std::abs(mask_correlation(m.slice(1, 0, B - 1), m.slice(1, 1, B))), bound) << "neighbouring rows";
  EXPECT_LT(std::abs(mask_correlation(m.slice(0, 0, 2), m.slice(0, 1, 3))), bound) << "successive draws";
  EXPECT_LT(std::abs(mask_correlation(all[1], all[3])), bound) << "members 1 and 3, both at rate 0.5";
}

TEST_P(PackedModel, PackUnpackRoundTrip) {
  const auto options = small(device()).layer_norm(true);
  std::vector<torch::nn::Sequential> models;
  for (int64_t k = 0; k < 5; ++k) {
    models.push_back(make_standalone_mlp(PackedMLPOptions(options).seed(7 + k), 0));
  }
  PackedMLP packed = pack(models, options);
  ASSERT_EQ(packed.members(), 5);
  for (int64_t k = 0; k < 5; ++k) expect_params_equal(unpack(packed, k), models[k]);
}

TEST_P(PackedModel, PackRejectsAModelOfAnotherShape) {
  const auto options = small(device());
  std::vector<torch::nn::Sequential> models{make_standalone_mlp(options, 0),
                                            make_standalone_mlp(PackedMLPOptions(6, 3).hidden(11).device(device()), 0)};
  EXPECT_THAT([&] { pack(models, options); }, ::testing::ThrowsMessage<c10::Error>(HasSubstr("model 1 parameter")));
}

// Trains a pack 5 steps with some members frozen and returns it (with the optimizer).
struct Trained {
  std::unique_ptr<PackedMLP> model;
  std::unique_ptr<PackedOptimizer> optimizer;
};

void train_steps(PackedMLP& model, PackedOptimizer& optimizer, int steps, bool poison_member_two = false) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (int s = 0; s < steps; ++s) {
    const at::Tensor x = at::randn({16, 6}, gen).to(model.options().device());
    const at::Tensor y = at::randn({16, 3}, gen).to(model.options().device());
    model.parameters().zero_grad();
    at::Tensor loss = packed_mse_loss(model.forward(x), y);
    if (poison_member_two) {
      // Member 2's loss turns NaN: its gradients are NaN and must not leak anywhere.
      loss = loss * at::where(at::arange(model.members(), loss.options()).eq(2), NAN, 1.0);
    }
    loss.sum().backward();
    optimizer.step();
  }
}

TEST_P(PackedModel, MaskFreezesMembersBitwise_AdamAndSGD) {
  for (const std::string kind : {"adamw", "sgd"}) {
    PackedMLP model(small(device()));
    std::unique_ptr<PackedOptimizer> opt;
    if (kind == "adamw") {
      opt = std::make_unique<PackedAdam>(model.parameters(), adamw_options().lr(1e-2));
    } else {
      opt = std::make_unique<PackedSGD>(model.parameters(),
                                        SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01));
    }
    train_steps(model, *opt, 3);
    const at::Tensor before = model.parameters().flat().clone();
    const at::Tensor steps_before = opt->step_count().clone();
    at::Tensor state_before;
    if (auto* adam = dynamic_cast<PackedAdam*>(opt.get()))
      state_before = at::cat({adam->exp_avg(), adam->exp_avg_sq()}).clone();
    if (auto* sgd = dynamic_cast<PackedSGD*>(opt.get())) state_before = sgd->momentum_buffer().clone();

    at::Tensor mask = at::ones({8}, at::kBool);
    mask[2] = false;
    mask[5] = false;
    opt->set_mask(mask);
    train_steps(model, *opt, 4, /*poison_member_two=*/true);

    at::Tensor state_after;
    if (auto* adam = dynamic_cast<PackedAdam*>(opt.get())) state_after = at::cat({adam->exp_avg(), adam->exp_avg_sq()});
    if (auto* sgd = dynamic_cast<PackedSGD*>(opt.get())) state_after = sgd->momentum_buffer();
    const auto rows = [&](const at::Tensor& flat, int64_t k) {
      std::vector<at::Tensor> parts;
      for (const auto& block : model.parameters().blocks(flat.narrow(0, 0, model.parameters().flat().numel())))
        parts.push_back(block[k]);
      return at::cat(parts);
    };
    for (int64_t k : {2, 5}) {
      EXPECT_TRUE(all_equal(rows(model.parameters().flat(), k), rows(before, k))) << kind << " member " << k;
      EXPECT_TRUE(all_equal(rows(state_after, k), rows(state_before, k))) << kind << " state of member " << k;
      EXPECT_EQ(opt->step_count()[k].item<double>(), steps_before[k].item<double>()) << kind;
    }
    for (int64_t k : {0, 7}) {
      EXPECT_FALSE(at::equal(rows(model.parameters().flat(), k).cpu(), rows(before, k).cpu()))
          << kind << " member " << k << " stopped";
      EXPECT_EQ(opt->step_count()[k].item<double>(), steps_before[k].item<double>() + 4) << kind;
    }
    EXPECT_TRUE(model.parameters().flat().isfinite().all().item<bool>()) << kind << ": a frozen member's NaN leaked";
  }
}

TEST_P(PackedModel, ReinitializeEqualsFreshPackWithoutReallocating) {
  PackedMLP model(small(device()));
  PackedAdam opt(model.parameters(), adamw_options().lr(1e-2));
  train_steps(model, opt, 3);
  const void* address = model.parameters().flat().data_ptr();
  const void* weight_address = model.parameters()[0].data_ptr();

  model.reinitialize(777);
  opt.reset_state();
  EXPECT_EQ(model.parameters().flat().data_ptr(), address);
  EXPECT_EQ(model.parameters()[0].data_ptr(), weight_address);
  PackedMLP fresh(small(device()).seed(777));
  EXPECT_TRUE(all_equal(model.parameters().flat(), fresh.parameters().flat()));
  EXPECT_EQ(opt.step_count().sum().item<double>(), 0);
  EXPECT_EQ(opt.exp_avg().abs().sum().item<double>(), 0);

  // Re-initialized and reset, the pack trains exactly as a fresh one does.
  PackedAdam fresh_opt(fresh.parameters(), adamw_options().lr(1e-2));
  train_steps(model, opt, 3);
  train_steps(fresh, fresh_opt, 3);
  EXPECT_TRUE(all_equal(model.parameters().flat(), fresh.parameters().flat()));
}

TEST_P(PackedModel, ReinitializeSelectedMembersOnly) {
  PackedMLP model(small(device()));
  PackedAdam opt(model.parameters(), adamw_options().lr(1e-2));
  train_steps(model, opt, 3);
  const at::Tensor trained = model.parameters().flat().clone();
  at::Tensor which = at::zeros({8}, at::kBool);
  which[1] = true;
  which[6] = true;
  model.reinitialize(99, which);
  opt.reset_state(which);
  PackedMLP fresh(small(device()).seed(99));
  for (int64_t k = 0; k < 8; ++k) {
    const bool selected = k == 1 || k == 6;
    const at::Tensor expected = selected ? fresh.parameters().member_row(k) : [&] {
      std::vector<at::Tensor> parts;
      for (const auto& block : model.parameters().blocks(trained)) parts.push_back(block[k]);
      return at::cat(parts);
    }();
    EXPECT_TRUE(all_equal(model.parameters().member_row(k), expected)) << "member " << k;
    EXPECT_EQ(opt.step_count()[k].item<double>(), selected ? 0.0 : 3.0) << "member " << k;
  }
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(PackedModel);

// --- Bad input: each gets an error that names the offending values -------------

template <typename F>
void expect_error(F&& f, const std::string& fragment) {
  EXPECT_THAT(f, ::testing::ThrowsMessage<c10::Error>(HasSubstr(fragment)));
}

TEST(PackedErrors, ZeroMembers) {
  expect_error([] { PackedMLP(PackedMLPOptions(4, 1).members(0)); }, "members must be positive, got members=0");
}

TEST(PackedErrors, BadOptions) {
  expect_error([] { PackedMLP(PackedMLPOptions(0, 1)); }, "in_features must be positive, got 0");
  expect_error([] { PackedMLP(PackedMLPOptions(4, 1).dropout(1.5)); }, "dropout must be in [0, 1), got 1.5");
  expect_error([] { PackedMLP(PackedMLPOptions(4, 1).members(2).member_dropout({0.1})); },
               "per-member dropout: expected one rate per member (2), got 1");
  expect_error(
      [] {
        PackedMLP(PackedMLPOptions(4, 1).members(2).member_dropout({0.1, 1.0}));
      },
      "per-member dropout must be in [0, 1), got 1");
  expect_error([] { PackedMLP(PackedMLPOptions(4, 1).dtype(at::kLong)); }, "must be floating point");
  expect_error([] { parse_activation("swish"); }, "unknown activation 'swish'");
  expect_error([] { SGDOptions(0.1).nesterov(true).validate(); }, "Nesterov momentum requires momentum > 0");
  expect_error([] { AdamOptions().beta1(1.0).validate(); }, "beta1 must be in [0, 1), got 1");
}

TEST(PackedErrors, InputRankWidthAndK) {
  PackedMLP model(PackedMLPOptions(4, 1).members(3));
  expect_error([&] { model.forward(at::zeros({4})); }, "got rank 1 with shape [4]");
  expect_error([&] { model.forward(at::zeros({2, 3, 4, 5})); }, "got rank 4");
  expect_error([&] { model.forward(at::zeros({10, 5})); }, "expected I=4 (weight [3, 4, 64]), got input [10, 5]");
  expect_error(
      [&] {
        model.forward(at::zeros({2, 10, 4}));
      },
      "packed input for 3 members: expected [3, B, 4], got [2, 10, 4]");
}

TEST(PackedErrors, DtypeAndDeviceMismatch) {
  PackedMLP model(PackedMLPOptions(4, 1).members(3));
  expect_error(
      [&] {
        model.forward(at::zeros({10, 4}, at::kDouble));
      },
      "input dtype Double differs from the weights' Float");
  expect_error(
      [&] {
        model.forward(at::empty({10, 4}, at::TensorOptions().device(c10::kMeta)));
      },
      "input is on meta but the weights are on cpu");
}

TEST(PackedErrors, LossShapes) {
  const at::Tensor pred = at::zeros({3, 10, 2});
  expect_error([&] { packed_mse_loss(pred, at::zeros({10, 3})); }, "shared target must be [10, 2]");
  expect_error([&] { packed_mse_loss(pred, at::zeros({4, 10, 2})); }, "[3, 10, 2] per member");
  expect_error([&] { packed_gaussian_nll_loss(at::zeros({3, 10, 3}), at::zeros({10, 1})); }, "(K, B, 2*O)");
  expect_error([&] { packed_cross_entropy_loss(pred, at::zeros({10})); }, "target must be int64 class indices");
  expect_error([&] { packed_cross_entropy_loss(pred, at::zeros({9}, at::kLong)); }, "shared target must be [10]");
}

TEST(PackedErrors, OptimizerPerMemberShapes) {
  PackedMLP model(PackedMLPOptions(4, 1).members(3));
  PackedAdam opt(model.parameters(), AdamOptions());
  expect_error([&] { opt.set_lr(at::ones({4})); },
               "learning rate must have one value per member: expected [3], got [4]");
  expect_error([&] { opt.set_mask(at::ones({2})); }, "mask must have one value per member: expected [3], got [2]");
  expect_error([&] { opt.set_lr(-at::ones({3})); }, "learning rates must be >= 0");
  expect_error([&] { opt.reset_state(at::ones({3})); }, "member selection must be bool");
  expect_error([&] { model.reinitialize(1, at::ones({4}, at::kBool)); }, "bool tensor of shape [3], got Bool [4]");
}

// --- Losses equal LibTorch's per member ---------------------------------------

TEST(PackedLosses, MatchLibTorchPerMember) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor pred = at::randn({4, 9, 2}, gen, f64);
  const at::Tensor target = at::randn({9, 2}, gen, f64);
  const at::Tensor mse = packed_mse_loss(pred, target);
  const at::Tensor gauss_pred = at::randn({4, 9, 4}, gen, f64);
  const at::Tensor nll = packed_gaussian_nll_loss(gauss_pred, target, 1e-6);
  const at::Tensor logits = at::randn({4, 9, 5}, gen, f64);
  const at::Tensor classes = at::randint(0, 5, {4, 9}, gen, at::kLong);
  const at::Tensor ce = packed_cross_entropy_loss(logits, classes);
  // Class-weighted: LibTorch's weighted sum over the rows, divided by the rows (not by
  // the weights' sum, which is LibTorch's "mean").
  const at::Tensor class_weights = at::rand({5}, gen, f64) + 0.5;
  const at::Tensor weighted = packed_cross_entropy_loss(logits, classes, class_weights);
  ASSERT_EQ(mse.sizes(), (c10::IntArrayRef{4}));
  for (int64_t k = 0; k < 4; ++k) {
    EXPECT_NEAR(mse[k].item<double>(), torch::mse_loss(pred[k], target).item<double>(), 1e-14);
    const at::Tensor mean = gauss_pred[k].narrow(1, 0, 2);
    const at::Tensor var = torch::softplus(gauss_pred[k].narrow(1, 2, 2)) + 1e-6;
    // -log N(y; mean, var), straight from the density.
    const double reference =
        -(torch::exp(-(target - mean).square() / (2 * var)) / torch::sqrt(2 * M_PI * var)).log().mean().item<double>();
    EXPECT_NEAR(nll[k].item<double>(), reference, 1e-12);
    EXPECT_NEAR(ce[k].item<double>(), torch::cross_entropy_loss(logits[k], classes[k]).item<double>(), 1e-12);
    EXPECT_NEAR(weighted[k].item<double>(),
                torch::cross_entropy_loss(logits[k], classes[k], class_weights, at::Reduction::Sum).item<double>() / 9,
                1e-12);
  }
}

TEST(MemberSeed, DistinctPerMemberAndSeed) {
  EXPECT_NE(member_seed(0, 0), member_seed(0, 1));
  EXPECT_NE(member_seed(0, 1), member_seed(1, 0));
  EXPECT_EQ(member_seed(5, 3), member_seed(5, 3));
}

}  // namespace
}  // namespace packtrain::ensemble
