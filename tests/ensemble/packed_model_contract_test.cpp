// The contract every member architecture behind the PackedModel seam meets, one
// test template instantiated per architecture (add a line to kArchitectures for a
// new one): member i equals its standalone module at initialization (to a few ulps),
// and after training each member equals its standalone module trained alone with
// torch::optim::AdamW on the same batches (float64); reinitializing some members
// restores exactly those.
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/pack.h"
#include "packtrain/ensemble/packed_cnn.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_model.h"
#include "packtrain/ensemble/packed_step.h"
#include "packtrain/ensemble/residual_mlp.h"
#include "tests/support/test_support.h"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace packtrain::ensemble {
namespace {

constexpr int64_t kMembers = 4, kIn = 5, kOut = 3, kBatch = 16, kSteps = 30;
constexpr uint64_t kSeed = 7;

// What the template needs of an architecture: the pack, and member k's standalone
// module built independently (not unpacked from the pack), and its input width.
struct Architecture {
  std::string name;
  std::function<std::unique_ptr<PackedModel>(c10::Device, uint64_t seed)> pack;
  std::function<StandaloneMember(c10::Device, uint64_t seed, int64_t member)> standalone;
  int64_t in = kIn;
  // The CPU forward's tolerance at initialization, outputs of order 1: a few float64
  // ulps. Bit for bit on AVX2 CPUs; on an AVX-512 one (an AMD EPYC with AVX-512 BF16,
  // 2026-12-07) LibTorch's batched GEMM and nn::Linear's single one sum a narrow
  // output (3 columns) in another order: 1.1e-16 to 2.2e-16 at every architecture.
  // Also where the pack's sums run over more terms than the member's own (a narrower
  // member's zero channels), which the CPU's convolutions block in another order.
  double cpu_forward_tolerance = 1e-15;
};

// Convolutional members: 2-D samples {2, 4, 4} through two blocks, 1-D {2, 6} through one.
// Four GELU members of widths 5, 12, 8 and 12 in a pack 12 wide (GELU: a padded unit's
// activation has a non-zero slope at 0, so only the zero weights keep it out).
PackedMLPOptions mixed_widths(c10::Device d, uint64_t seed) {
  return PackedMLPOptions(kIn, kOut)
      .members(kMembers)
      .hidden(12)
      .member_hidden({5, 12, 8, 12})
      .depth(2)
      .activation(Activation::kGELU)
      .seed(seed)
      .dtype(at::kDouble)
      .device(d);
}

PackedCNNOptions cnn_2d(c10::Device d, uint64_t seed) {
  return PackedCNNOptions({2, 4, 4}, kOut)
      .members(kMembers)
      .channels({3, 4})
      .hidden(12)
      .depth(1)
      .seed(seed)
      .dtype(at::kDouble)
      .device(d);
}
PackedCNNOptions cnn_1d(c10::Device d, uint64_t seed) {
  return PackedCNNOptions({2, 6}, kOut)
      .members(kMembers)
      .channels({3})
      .kernel_size(5)
      .hidden(12)
      .depth(2)
      .seed(seed)
      .dtype(at::kDouble)
      .device(d);
}

// A cnn head of different widths (3, 12, 7, 12) padded to 12, as mlp_mixed_widths.
PackedCNNOptions cnn_1d_mixed_widths(c10::Device d, uint64_t seed) {
  return cnn_1d(d, seed).member_hidden({3, 12, 7, 12});
}

// Normalization, average pooling and dropout: 2-D with GroupNorm(2, C), average
// pools and per-member dropout rates (member 0 drops nothing); 1-D with
// GroupNorm(1, C) (a layer norm over each block), max pools and one rate.
PackedCNNOptions cnn_2d_layers(c10::Device d, uint64_t seed) {
  return cnn_2d(d, seed).channels({4, 6}).norm_groups(2).pool(Pool::kAvg).depth(2).member_dropout({0.0, 0.2, 0.5, 0.3});
}
PackedCNNOptions cnn_1d_layers(c10::Device d, uint64_t seed) { return cnn_1d(d, seed).norm_groups(1).dropout(0.25); }
// Strided convolutions with explicit padding and an even kernel: 2-D 4x4 -> conv (k 2,
// s 2, p 1) 3x3 -> pool 1x1; 1-D 6 -> conv (k 3, s 2, p 0) 2 -> pool 1.
PackedCNNOptions cnn_2d_strided(c10::Device d, uint64_t seed) {
  return cnn_2d(d, seed).channels({3}).kernel_size(2).stride(2).padding(1);
}
PackedCNNOptions cnn_1d_strided(c10::Device d, uint64_t seed) {
  return cnn_1d(d, seed).stride(2).padding(0).kernel_size(3);
}

// Members of different channel counts padded to the widest in each block (the 2-D
// pack's blocks 3 and 4 wide, its heads of widths 12, 5, 12, 7 too; the 1-D pack's one
// block 3 wide, strided): member k equals the network of its own channels.
PackedCNNOptions cnn_2d_mixed_channels(c10::Device d, uint64_t seed) {
  return cnn_2d(d, seed).member_channels({{1, 4}, {3, 2}, {2, 1}, {3, 4}}).member_hidden({12, 5, 12, 7});
}
PackedCNNOptions cnn_1d_mixed_channels(c10::Device d, uint64_t seed) {
  return cnn_1d_strided(d, seed).member_channels({{2}, {3}, {1}, {3}});
}

// Member k standalone (make_standalone_cnn: torch::nn::Dropout after each hidden
// ReLU where the member drops units) whose Dropout modules, in training, apply the
// masks the pack draws for member k — torch::nn::Dropout draws from the global
// generator, the pack from its counter-based masks (that function of seed, draw,
// member and row is packed_model_test.cpp's). A twin pack of the same options draws
// them in the pack's order; each mask must be 0 or 1 / (1 - p) for the module's p,
// so the standalone's rate is the member's. What this checks: where dropout acts,
// at which rate, and that training through it equals the standalone's.
StandaloneMember cnn_with_pack_masks(const PackedCNNOptions& options, int64_t k) {
  StandaloneMember alone = make_standalone_cnn(options, k);
  const auto seq = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(alone.module);
  const auto twin = std::make_shared<PackedCNN>(options);
  alone.forward = [seq, twin, k](const at::Tensor& x) {
    at::Tensor h = x;
    for (torch::nn::AnyModule& layer : *seq) {
      const auto* dropout = layer.ptr()->as<torch::nn::Dropout>();
      if (dropout == nullptr) {
        h = layer.forward(h);
      } else if (dropout->is_training()) {
        const at::Tensor mask = twin->dropout_noise(at::empty({twin->members(), h.size(0), h.size(1)}, h.options()))[k];
        const double scale = 1 / (1 - dropout->options.p());
        EXPECT_TRUE(((mask == 0) | ((mask - scale).abs() < 1e-12)).all().item<bool>()) << "member " << k;
        h = h * mask;
      }
    }
    return h;
  };
  return alone;
}

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> all{
      {"mlp",
       [](c10::Device d, uint64_t seed) {
         return std::make_unique<PackedMLP>(
             PackedMLPOptions(kIn, kOut).members(kMembers).hidden(12).depth(2).seed(seed).dtype(at::kDouble).device(d));
       },
       [](c10::Device d, uint64_t seed, int64_t k) {
         torch::nn::Sequential seq = make_standalone_mlp(
             PackedMLPOptions(kIn, kOut).members(kMembers).hidden(12).depth(2).seed(seed).dtype(at::kDouble).device(d),
             k);
         return StandaloneMember{seq.ptr(), [seq](const at::Tensor& x) mutable { return seq->forward(x); }};
       }},
      // Members of different widths padded to the widest (packed_mlp.h): member k
      // equals the standalone network of its own width.
      {"mlp_mixed_widths",
       [](c10::Device d, uint64_t seed) { return std::make_unique<PackedMLP>(mixed_widths(d, seed)); },
       [](c10::Device d, uint64_t seed, int64_t k) {
         torch::nn::Sequential seq = make_standalone_mlp(mixed_widths(d, seed), k);
         return StandaloneMember{seq.ptr(), [seq](const at::Tensor& x) mutable { return seq->forward(x); }};
       }},
      {"residual_mlp",
       [](c10::Device d, uint64_t seed) {
         return std::make_unique<ResidualMLP>(ResidualMLPOptions(kIn, kOut)
                                                  .members(kMembers)
                                                  .hidden(12)
                                                  .blocks(2)
                                                  .seed(seed)
                                                  .dtype(at::kDouble)
                                                  .device(d));
       },
       [](c10::Device d, uint64_t seed, int64_t k) {
         return make_standalone_residual_mlp(ResidualMLPOptions(kIn, kOut)
                                                 .members(kMembers)
                                                 .hidden(12)
                                                 .blocks(2)
                                                 .seed(seed)
                                                 .dtype(at::kDouble)
                                                 .device(d),
                                             k);
       }},
      {"cnn", [](c10::Device d, uint64_t seed) { return std::make_unique<PackedCNN>(cnn_2d(d, seed)); },
       [](c10::Device d, uint64_t seed, int64_t k) { return make_standalone_cnn(cnn_2d(d, seed), k); }, 32},
      {"cnn_1d", [](c10::Device d, uint64_t seed) { return std::make_unique<PackedCNN>(cnn_1d(d, seed)); },
       [](c10::Device d, uint64_t seed, int64_t k) { return make_standalone_cnn(cnn_1d(d, seed), k); }, 12},
      {"cnn_1d_mixed_widths",
       [](c10::Device d, uint64_t seed) { return std::make_unique<PackedCNN>(cnn_1d_mixed_widths(d, seed)); },
       [](c10::Device d, uint64_t seed, int64_t k) { return make_standalone_cnn(cnn_1d_mixed_widths(d, seed), k); },
       12},
      {"cnn_norm_avg_dropout",
       [](c10::Device d, uint64_t seed) { return std::make_unique<PackedCNN>(cnn_2d_layers(d, seed)); },
       [](c10::Device d, uint64_t seed, int64_t k) { return cnn_with_pack_masks(cnn_2d_layers(d, seed), k); }, 32},
      {"cnn_1d_norm_dropout",
       [](c10::Device d, uint64_t seed) { return std::make_unique<PackedCNN>(cnn_1d_layers(d, seed)); },
       [](c10::Device d, uint64_t seed, int64_t k) { return cnn_with_pack_masks(cnn_1d_layers(d, seed), k); }, 12},
      {"cnn_strided", [](c10::Device d, uint64_t seed) { return std::make_unique<PackedCNN>(cnn_2d_strided(d, seed)); },
       [](c10::Device d, uint64_t seed, int64_t k) { return make_standalone_cnn(cnn_2d_strided(d, seed), k); }, 32},
      {"cnn_1d_strided",
       [](c10::Device d, uint64_t seed) { return std::make_unique<PackedCNN>(cnn_1d_strided(d, seed)); },
       [](c10::Device d, uint64_t seed, int64_t k) { return make_standalone_cnn(cnn_1d_strided(d, seed), k); }, 12},
      {"cnn_mixed_channels",
       [](c10::Device d, uint64_t seed) { return std::make_unique<PackedCNN>(cnn_2d_mixed_channels(d, seed)); },
       [](c10::Device d, uint64_t seed, int64_t k) { return make_standalone_cnn(cnn_2d_mixed_channels(d, seed), k); },
       32},
      {"cnn_1d_mixed_channels",
       [](c10::Device d, uint64_t seed) { return std::make_unique<PackedCNN>(cnn_1d_mixed_channels(d, seed)); },
       [](c10::Device d, uint64_t seed, int64_t k) { return make_standalone_cnn(cnn_1d_mixed_channels(d, seed), k); },
       12},
  };
  return all;
}

std::vector<at::Tensor> parameters_of(const StandaloneMember& m) { return m.module->parameters(); }

double max_parameter_diff(const StandaloneMember& a, const StandaloneMember& b) {
  const auto pa = parameters_of(a), pb = parameters_of(b);
  EXPECT_EQ(pa.size(), pb.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(pa.size(), pb.size()); ++i) {
    EXPECT_EQ(pa[i].sizes(), pb[i].sizes()) << "parameter " << i;
    if (pa[i].sizes() == pb[i].sizes()) worst = std::max(worst, packtrain::testing::max_abs_diff(pa[i], pb[i]));
  }
  return worst;
}

struct Case {
  size_t architecture;
  c10::Device device;
};

class PackedModelContract : public ::testing::TestWithParam<Case> {
 protected:
  const Architecture& arch() const { return architectures()[GetParam().architecture]; }
  c10::Device device() const { return GetParam().device; }
  void SetUp() override {
    if (const std::string why = packtrain::testing::device_unavailable_reason(device()); !why.empty()) {
      GTEST_SKIP() << why;
    }
  }
};

TEST_P(PackedModelContract, EachMemberIsItsStandaloneModuleAtInitialization) {
  const auto pack = arch().pack(device(), kSeed);
  EXPECT_EQ(pack->members(), kMembers);
  const at::Tensor x = at::randn({kBatch, arch().in}, at::TensorOptions().dtype(at::kDouble)).to(device());
  const at::Tensor packed_out = pack->forward(x);
  ASSERT_EQ(packed_out.sizes(), (std::vector<int64_t>{kMembers, kBatch, kOut}));
  for (int64_t k = 0; k < kMembers; ++k) {
    const StandaloneMember alone = arch().standalone(device(), kSeed, k);
    EXPECT_EQ(max_parameter_diff(pack->standalone_member(k), alone), 0.0) << "member " << k;
    // Within a few ulps on the CPU (above); cuBLAS's batched and single GEMMs may sum in
    // different orders (measured on an H100: not bit-equal), so CUDA gets double rounding room.
    EXPECT_LE(packtrain::testing::max_abs_diff(packed_out[k], alone.forward(x)),
              device().is_cpu() ? arch().cpu_forward_tolerance : 1e-12)
        << "member " << k;
  }
  // Members differ from one another (each draws from its own seed).
  EXPECT_FALSE(torch::equal(packed_out[0], packed_out[1]));
}

TEST_P(PackedModelContract, TrainingEqualsEachMemberTrainedAloneWithAdamW) {
  const auto pack = arch().pack(device(), kSeed);
  PackedAdam optimizer(pack->parameters(), AdamOptions().lr(1e-2).weight_decay(0.05).decoupled_weight_decay(true));
  std::vector<StandaloneMember> alone;
  std::vector<std::unique_ptr<torch::optim::AdamW>> optimizers;
  for (int64_t k = 0; k < kMembers; ++k) {
    alone.push_back(arch().standalone(device(), kSeed, k));
    optimizers.push_back(std::make_unique<torch::optim::AdamW>(alone.back().module->parameters(),
                                                               torch::optim::AdamWOptions(1e-2).weight_decay(0.05)));
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  for (int64_t step = 0; step < kSteps; ++step) {
    const at::Tensor x = at::randn({kMembers, kBatch, arch().in}, gen, f64).to(device());
    const at::Tensor y = at::randn({kMembers, kBatch, kOut}, gen, f64).to(device());
    packed_train_step(*pack, optimizer, x, y, LossKind::kMSE);
    for (int64_t k = 0; k < kMembers; ++k) {
      optimizers[k]->zero_grad();
      torch::mse_loss(alone[k].forward(x[k]), y[k]).backward();
      optimizers[k]->step();
    }
  }
  for (int64_t k = 0; k < kMembers; ++k) {
    EXPECT_LE(max_parameter_diff(pack->standalone_member(k), alone[k]), 1e-9) << "member " << k;
    // Training moved the member (a pack that never trained would match nothing).
    EXPECT_GT(max_parameter_diff(alone[k], arch().standalone(device(), kSeed, k)), 1e-3) << "member " << k;
  }
}

TEST_P(PackedModelContract, ReinitializingSomeMembersRestoresExactlyThose) {
  const auto pack = arch().pack(device(), kSeed);
  {
    at::NoGradGuard no_grad;
    pack->parameters().flat().add_(1.0);
  }
  const at::Tensor which = at::tensor({1, 0, 1, 0}, at::kLong).to(at::kBool);
  pack->reinitialize(kSeed, which);
  for (int64_t k = 0; k < kMembers; ++k) {
    const at::Tensor row = pack->parameters().member_row(k).cpu();
    const at::Tensor fresh = arch().pack(c10::Device(c10::kCPU), kSeed)->parameters().member_row(k);
    if (k % 2 == 0) {
      EXPECT_TRUE(torch::equal(row, fresh)) << "member " << k << " was not restored";
    } else {
      EXPECT_TRUE(torch::equal(row, fresh + 1.0)) << "member " << k << " was touched";
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (size_t a = 0; a < architectures().size(); ++a) {
    for (const c10::Device d : {c10::Device(c10::kCPU), c10::Device("cuda:0")}) out.push_back({a, d});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Architectures, PackedModelContract, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return architectures()[info.param.architecture].name + "_" +
                                  (info.param.device.is_cuda() ? "cuda" : "cpu");
                         });

}  // namespace
}  // namespace packtrain::ensemble
