// bf16-mixed precision (ensemble/precision.h) behind the PackedModel seam: each
// member of a float32 pack set to bf16-mixed predicts and trains as the same member
// built standalone in LibTorch and run under LibTorch's own autocast to bfloat16
// (the policy Lightning's precision="bf16-mixed" is), for every architecture; the
// pack's outputs are float32; and the precision acts (float32 packs differ).
//
// Tolerances: the pack's batched products and the standalone's single ones sum in
// different orders, so a result near a rounding boundary may round to the
// neighbouring bfloat16 (an 8-bit mantissa: a step of 2^-8 relative), and that step
// is carried on downstream. Outputs are compared to within 4 such steps of their
// largest value; SGD's trained parameters, which move by lr x gradient each step, to
// within 4 such steps of the largest distance any parameter moved.
#include "packtrain/ensemble/optimizers/sgd.h"
#include "packtrain/ensemble/pack.h"
#include "packtrain/ensemble/packed_cnn.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_model.h"
#include "packtrain/ensemble/packed_step.h"
#include "packtrain/ensemble/residual_mlp.h"
#include "tests/support/test_support.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace packtrain::ensemble {
namespace {

constexpr int64_t kMembers = 3, kIn = 6, kOut = 2, kBatch = 32, kSteps = 5;
constexpr uint64_t kSeed = 5;
constexpr double kLr = 0.05;
const double kBf16Step = std::ldexp(1.0, -8);

// LibTorch's autocast to bfloat16 on one device while open: the reference, set here
// directly rather than through the PrecisionScope under test.
class LibTorchAutocast {
 public:
  explicit LibTorchAutocast(c10::DeviceType device) : device_(device) {
    at::autocast::set_autocast_dtype(device_, at::kBFloat16);
    at::autocast::set_autocast_enabled(device_, true);
  }
  ~LibTorchAutocast() {
    at::autocast::set_autocast_enabled(device_, false);
    at::autocast::clear_cache();
  }
  LibTorchAutocast(const LibTorchAutocast&) = delete;
  LibTorchAutocast& operator=(const LibTorchAutocast&) = delete;

 private:
  c10::DeviceType device_;
};

struct Architecture {
  std::string name;
  std::function<std::unique_ptr<PackedModel>(c10::Device)> pack;
  std::function<StandaloneMember(c10::Device, int64_t member)> standalone;
  std::vector<int64_t> sample;  // one input row's shape
};

// Wide enough (hidden 128) that a CPU with bfloat16 units trains it through autograd's
// bfloat16 kernels; the narrower "mlp" through the fused step (packed_mlp.cpp).
PackedMLPOptions mlp_wide(c10::Device d) {
  return PackedMLPOptions(kIn, kOut).members(kMembers).hidden(128).depth(1).seed(kSeed).device(d);
}
PackedMLPOptions mlp(c10::Device d) {
  return PackedMLPOptions(kIn, kOut)
      .members(kMembers)
      .hidden(24)
      .depth(2)
      .activation(Activation::kGELU)
      .seed(kSeed)
      .device(d);
}
ResidualMLPOptions residual(c10::Device d) {
  return ResidualMLPOptions(kIn, kOut).members(kMembers).hidden(24).blocks(2).seed(kSeed).device(d);
}
PackedCNNOptions cnn_2d(c10::Device d) {
  return PackedCNNOptions({2, 6, 6}, kOut).members(kMembers).channels({4, 8}).hidden(16).depth(1).seed(kSeed).device(d);
}
PackedCNNOptions cnn_1d(c10::Device d) {
  return PackedCNNOptions({2, 12}, kOut)
      .members(kMembers)
      .channels({6})
      .kernel_size(5)
      .hidden(16)
      .depth(2)
      .seed(kSeed)
      .device(d);
}

// An MLP pack of `options` and member k built standalone (make_standalone_mlp).
Architecture mlp_architecture(std::string name, PackedMLPOptions (*options)(c10::Device)) {
  return {std::move(name),
          [options](c10::Device d) { return std::make_unique<PackedMLP>(options(d)); },
          [options](c10::Device d, int64_t k) {
            torch::nn::Sequential seq = make_standalone_mlp(options(d), k);
            return StandaloneMember{seq.ptr(), [seq](const at::Tensor& x) mutable { return seq->forward(x); }};
          },
          {kIn}};
}

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> all{
      mlp_architecture("mlp", mlp),
      mlp_architecture("mlp_wide", mlp_wide),
      {"residual_mlp",
       [](c10::Device d) { return std::make_unique<ResidualMLP>(residual(d)); },
       [](c10::Device d, int64_t k) { return make_standalone_residual_mlp(residual(d), k); },
       {kIn}},
      {"cnn",
       [](c10::Device d) { return std::make_unique<PackedCNN>(cnn_2d(d)); },
       [](c10::Device d, int64_t k) { return make_standalone_cnn(cnn_2d(d), k); },
       {2 * 6 * 6}},
      {"cnn_1d",
       [](c10::Device d) { return std::make_unique<PackedCNN>(cnn_1d(d)); },
       [](c10::Device d, int64_t k) { return make_standalone_cnn(cnn_1d(d), k); },
       {2 * 12}},
  };
  return all;
}

struct Case {
  size_t architecture;
  c10::Device device;
};

class Bf16Mixed : public ::testing::TestWithParam<Case> {
 protected:
  const Architecture& arch() const { return architectures()[GetParam().architecture]; }
  c10::Device device() const { return GetParam().device; }
  void SetUp() override {
    if (const std::string why = packtrain::testing::device_unavailable_reason(device()); !why.empty()) {
      GTEST_SKIP() << why;
    }
  }
  at::Tensor rows(at::Generator& gen, int64_t lead) const {
    std::vector<int64_t> shape{lead, kBatch};
    shape.insert(shape.end(), arch().sample.begin(), arch().sample.end());
    return at::randn(shape, gen).to(device());
  }
};

double largest(const at::Tensor& t) { return t.detach().abs().max().item<double>(); }

TEST_P(Bf16Mixed, EachMemberPredictsAsItsStandaloneModuleUnderAutocast) {
  auto pack = arch().pack(device());
  pack->train(false);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor x = rows(gen, 1)[0];
  const at::Tensor fp32 = pack->forward(x);
  pack->set_precision(Precision::kBF16Mixed);
  const at::Tensor mixed = pack->forward(x);
  ASSERT_EQ(mixed.scalar_type(), at::kFloat) << "predictions are returned in float32";
  for (int64_t k = 0; k < kMembers; ++k) {
    StandaloneMember alone = arch().standalone(device(), k);
    alone.module->eval();
    at::Tensor expected;
    {
      const LibTorchAutocast autocast(device().type());
      expected = alone.forward(x);
    }
    EXPECT_EQ(expected.scalar_type(), at::kBFloat16) << "the reference ran under autocast";
    EXPECT_TRUE(packtrain::testing::all_close(mixed[k], expected.to(at::kFloat), 4 * kBf16Step * largest(expected)))
        << "member " << k;
  }
  // The precision acts: float32's outputs are not bfloat16's (by more than a step of 2^-12).
  EXPECT_GT(packtrain::testing::max_abs_diff(mixed, fp32), std::ldexp(1.0, -12) * largest(fp32));
}

TEST_P(Bf16Mixed, TrainingEqualsEachMemberTrainedAloneUnderAutocast) {
  auto pack = arch().pack(device());
  pack->set_precision(Precision::kBF16Mixed);
  pack->train(true);
  PackedSGD optimizer(pack->parameters(), SGDOptions(kLr));
  std::vector<StandaloneMember> alone;
  std::vector<std::unique_ptr<torch::optim::SGD>> optimizers;
  for (int64_t k = 0; k < kMembers; ++k) {
    alone.push_back(arch().standalone(device(), k));
    optimizers.push_back(
        std::make_unique<torch::optim::SGD>(alone.back().module->parameters(), torch::optim::SGDOptions(kLr)));
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (int64_t step = 0; step < kSteps; ++step) {
    const at::Tensor x = rows(gen, kMembers);
    const at::Tensor y = at::randn({kMembers, kBatch, kOut}, gen).to(device());
    packed_train_step(*pack, optimizer, x, y, LossKind::kMSE);
    for (int64_t k = 0; k < kMembers; ++k) {
      optimizers[k]->zero_grad();
      at::Tensor out;
      {
        const LibTorchAutocast autocast(device().type());
        out = alone[k].forward(x[k]);
      }
      torch::mse_loss(out.to(at::kFloat), y[k]).backward();  // the loss in float32, as the pack's
      optimizers[k]->step();
    }
  }
  for (int64_t k = 0; k < kMembers; ++k) {
    const std::vector<at::Tensor> packed = pack->standalone_member(k).module->parameters();
    const std::vector<at::Tensor> trained = alone[k].module->parameters();
    const std::vector<at::Tensor> initial = arch().standalone(device(), k).module->parameters();
    ASSERT_EQ(packed.size(), trained.size());
    double moved = 0;
    for (size_t i = 0; i < trained.size(); ++i)
      moved = std::max(moved, packtrain::testing::max_abs_diff(trained[i], initial[i]));
    EXPECT_GT(moved, 1e-3) << "member " << k << " trained";
    for (size_t i = 0; i < trained.size(); ++i) {
      EXPECT_EQ(packed[i].scalar_type(), at::kFloat) << "master weights stay float32";
      EXPECT_TRUE(packtrain::testing::all_close(packed[i], trained[i], 4 * kBf16Step * moved))
          << "member " << k << " parameter " << i;
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const c10::Device& d : packtrain::testing::test_devices())
    for (size_t a = 0; a < architectures().size(); ++a) out.push_back({a, d});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Architectures, Bf16Mixed, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return architectures()[info.param.architecture].name + "_" +
                                  (info.param.device.is_cuda() ? "CUDA" : "CPU");
                         });

}  // namespace
}  // namespace packtrain::ensemble
