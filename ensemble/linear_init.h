// torch::nn::Linear's initial values, drawn into a pack's member row: what
// reset_parameters draws, in its order, from a member's own generator. Shared by
// every architecture built of packed linear layers (packed_mlp.cpp, residual_mlp.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cmath>

namespace packtrain::ensemble {

// weight: the (in, out) slot of a member row (stored transposed), bias: its (out)
// slot. Draws weight (out, in) ~ U(-b, b) with b = sqrt(3) * gain(leaky_relu,
// sqrt(5)) / sqrt(in) (kaiming_uniform), then bias ~ U(-1/sqrt(in), 1/sqrt(in)).
inline void draw_linear_init(const at::Tensor& weight, const at::Tensor& bias, at::Generator& generator) {
  const int64_t in = weight.size(0), out = weight.size(1);
  const double gain = std::sqrt(2.0 / (1 + std::pow(std::sqrt(5.0), 2)));
  const double weight_bound = std::sqrt(3.0) * (gain / std::sqrt(static_cast<double>(in)));
  weight.copy_(at::empty({out, in}, at::kFloat).uniform_(-weight_bound, weight_bound, generator).t());
  const double bias_bound = 1 / std::sqrt(static_cast<double>(in));
  bias.uniform_(-bias_bound, bias_bound, generator);
}

}  // namespace packtrain::ensemble
