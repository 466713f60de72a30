// PackedLinear: K = 1 with PackOfOne::kPlainGemm is the standalone model's addmm and
// equals the batched path; the default keeps the baddbmm the MLP has always run;
// forward_onto is residual + forward, forward and backward.
#include "packtrain/ensemble/packed_linear.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

namespace packtrain::ensemble {
namespace {

using packtrain::testing::all_close;
using packtrain::testing::all_equal;

struct Layer {
  at::Tensor weight;  // (K, I, O) leaf
  at::Tensor bias;    // (K, 1, O) leaf
};

Layer random_layer(int64_t K, int64_t I, int64_t O, uint64_t seed, c10::Device device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto options = at::TensorOptions().dtype(at::kDouble);
  return {at::randn({K, I, O}, gen, options).to(device).requires_grad_(true),
          at::randn({K, 1, O}, gen, options).to(device).requires_grad_(true)};
}

at::Tensor random(std::vector<int64_t> shape, uint64_t seed, c10::Device device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble)).to(device);
}

class PackedLinearTest : public packtrain::testing::DeviceTest {};

TEST_P(PackedLinearTest, PackOfOnePlainGemmIsAddmmAndEqualsTheBatchedPath) {
  const Layer l = random_layer(1, 5, 7, 1, device());
  const PackedLinear plain(l.weight, l.bias, PackOfOne::kPlainGemm), batched(l.weight, l.bias);
  EXPECT_EQ(plain.pack_of_one(), PackOfOne::kPlainGemm);
  EXPECT_EQ(batched.pack_of_one(), PackOfOne::kBatched);
  at::NoGradGuard no_grad;
  const at::Tensor x = random({1, 6, 5}, 2, device());
  const at::Tensor out = plain.forward(x);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{1, 6, 7}));
  // Exactly the standalone model's GEMM on (I, O) and (O) views.
  EXPECT_TRUE(all_equal(out[0], at::addmm(l.bias.view({7}), x[0], l.weight.view({5, 7}))));
  // The default (the MLP's) stays exactly one baddbmm.
  EXPECT_TRUE(all_equal(batched.forward(x), at::baddbmm(l.bias, x, l.weight)));
  EXPECT_TRUE(all_close(out, batched.forward(x), 1e-12));
  // A shared (B, I) batch gives the same rows.
  EXPECT_TRUE(all_equal(plain.forward(x[0]), out));
  EXPECT_TRUE(all_close(batched.forward(x[0]), out, 1e-12));
}

TEST_P(PackedLinearTest, ManyMembersRunOneBaddbmmWhateverThePackOfOneChoice) {
  const Layer l = random_layer(3, 4, 2, 3, device());
  at::NoGradGuard no_grad;
  const at::Tensor x = random({3, 5, 4}, 4, device());
  const at::Tensor expected = at::baddbmm(l.bias, x, l.weight);
  EXPECT_TRUE(all_equal(PackedLinear(l.weight, l.bias, PackOfOne::kPlainGemm).forward(x), expected));
  EXPECT_TRUE(all_equal(PackedLinear(l.weight, l.bias).forward(x), expected));
  // A shared batch is every member's batch.
  const at::Tensor shared = random({5, 4}, 5, device());
  EXPECT_TRUE(all_equal(PackedLinear(l.weight, l.bias).forward(shared),
                        at::baddbmm(l.bias, shared.expand({3, 5, 4}).contiguous(), l.weight)));
}

// forward_onto(residual, x) equals residual + forward(x): values and the gradients
// of the weight, the bias, the residual and the input.
void expect_forward_onto_is_residual_plus_forward(int64_t K, PackOfOne pack_of_one, bool shared_input,
                                                  c10::Device device) {
  const std::string name = "K=" + std::to_string(K) + (pack_of_one == PackOfOne::kPlainGemm ? " plain" : " batched") +
                           (shared_input ? " shared" : " per member");
  const int64_t B = 6, I = 5, O = 4;
  const Layer l = random_layer(K, I, O, 6, device);
  const PackedLinear layer(l.weight, l.bias, pack_of_one);
  const at::Tensor x0 = shared_input ? random({B, I}, 7, device) : random({K, B, I}, 7, device);
  const at::Tensor r0 = random({K, B, O}, 8, device);
  const at::Tensor upstream = random({K, B, O}, 9, device);

  const auto run = [&](bool onto) {
    const at::Tensor x = x0.clone().requires_grad_(true), residual = r0.clone().requires_grad_(true);
    const at::Tensor out = onto ? layer.forward_onto(residual, x) : residual + layer.forward(x);
    EXPECT_TRUE(all_equal(residual.detach(), r0)) << name << ": the residual itself is never written";
    const std::vector<at::Tensor> grads = torch::autograd::grad({out}, {l.weight, l.bias, residual, x}, {upstream});
    std::vector<at::Tensor> values{out.detach()};
    values.insert(values.end(), grads.begin(), grads.end());
    return values;
  };
  const std::vector<at::Tensor> onto = run(true), reference = run(false);
  const char* what[] = {"output", "weight grad", "bias grad", "residual grad", "input grad"};
  for (size_t i = 0; i < onto.size(); ++i) {
    ASSERT_EQ(onto[i].sizes(), reference[i].sizes()) << name << " " << what[i];
    EXPECT_TRUE(all_close(onto[i], reference[i], 1e-12)) << name << " " << what[i];
  }
}

TEST_P(PackedLinearTest, ForwardOntoIsResidualPlusForward) {
  expect_forward_onto_is_residual_plus_forward(1, PackOfOne::kPlainGemm, false, device());
  expect_forward_onto_is_residual_plus_forward(1, PackOfOne::kPlainGemm, true, device());
  expect_forward_onto_is_residual_plus_forward(1, PackOfOne::kBatched, false, device());
  expect_forward_onto_is_residual_plus_forward(3, PackOfOne::kPlainGemm, false, device());
  expect_forward_onto_is_residual_plus_forward(3, PackOfOne::kBatched, true, device());
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(PackedLinearTest);

TEST(PackedLinearShapes, ForwardOntoRejectsAResidualOfAnotherShapeNamingBoth) {
  const Layer l = random_layer(2, 3, 4, 10, c10::Device(c10::kCPU));
  const PackedLinear layer(l.weight, l.bias);
  const at::Tensor x = at::zeros({2, 5, 3}, at::kDouble);
  try {
    layer.forward_onto(at::zeros({2, 6, 4}, at::kDouble), x);
    FAIL() << "a (2, 6, 4) residual for a (2, 5, 3) input was accepted";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("expected [2, 5, 4], got [2, 6, 4]"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace packtrain::ensemble
