// ResidualMLP: K residual MLPs of one shape trained as one model — the second
// member architecture behind the PackedModel seam (packed_model.h), added in its own
// files. Member i is
//   h = input(x); for each block: h = h + fc2(relu(fc1(h))); y = output(relu(h))
// with torch::nn::Linear layers, and equals, bit for bit at initialization, the
// standalone module make_standalone_residual_mlp(options, i) builds.
#pragma once

#include "packtrain/ensemble/packed_linear.h"
#include "packtrain/ensemble/packed_model.h"
#include "packtrain/ensemble/packed_parameters.h"

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <torch/arg.h>

#include <cstdint>
#include <vector>

namespace packtrain::ensemble {

struct ResidualMLPOptions {
  /// Example: ResidualMLPOptions(8, 1).members(64).hidden(64).blocks(2)
  ResidualMLPOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}

  TORCH_ARG(int64_t, in_features);   // I
  TORCH_ARG(int64_t, out_features);  // O
  TORCH_ARG(int64_t, members) = 8;   // K
  TORCH_ARG(int64_t, hidden) = 64;   // H, the residual stream's width
  TORCH_ARG(int64_t, blocks) = 2;    // residual blocks (0: input, ReLU, output)
  TORCH_ARG(uint64_t, seed) = 0;     // member i draws from member_seed(seed, first_member + i)
  TORCH_ARG(int64_t, first_member) = 0;
  TORCH_ARG(c10::ScalarType, dtype) = c10::ScalarType::Float;
  TORCH_ARG(c10::Device, device) = c10::Device(c10::DeviceType::CPU);

 public:
  // Throws naming the offending field and value.
  void validate() const;
};

class ResidualMLP : public PackedModel {
 public:
  explicit ResidualMLP(ResidualMLPOptions options);

  std::string_view kind() const override { return "residual-mlp"; }
  const ResidualMLPOptions& options() const { return options_; }
  PackedParameters& parameters() override { return parameters_; }
  const PackedParameters& parameters() const override { return parameters_; }

  void seed_dropout(uint64_t) override {}          // no dropout
  void dropout_rows(int64_t, int64_t) override {}  // no dropout
  void reinitialize(uint64_t seed, const at::Tensor& which = {}) override;
  StandaloneMember standalone_member(int64_t member) const override;

 private:
  at::Tensor forward_layers(const at::Tensor& x) const override;
  ResidualMLPOptions options_;
  PackedParameters parameters_;
  PackedLinear input_, output_;
  std::vector<PackedLinear> fc1_, fc2_;  // one of each per block
};

// The standalone module member `member` of ResidualMLP(options) equals, built with
// torch::nn::Linear layers after seeding the default generator with
// member_seed(options.seed(), options.first_member() + member), then cast to
// options' dtype and device. (It reseeds the global generator: a test helper.)
StandaloneMember make_standalone_residual_mlp(const ResidualMLPOptions& options, int64_t member);

}  // namespace packtrain::ensemble
