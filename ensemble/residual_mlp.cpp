#include "packtrain/ensemble/residual_mlp.h"

#include "packtrain/ensemble/linear_init.h"
#include "packtrain/ensemble/member_seed.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <cmath>
#include <string>

namespace packtrain::ensemble {

void ResidualMLPOptions::validate() const {
  TORCH_CHECK(members() > 0, "members must be positive, got members=", members());
  TORCH_CHECK(first_member() >= 0, "first_member must be >= 0, got ", first_member());
  TORCH_CHECK(in_features() > 0, "in_features must be positive, got ", in_features());
  TORCH_CHECK(out_features() > 0, "out_features must be positive, got ", out_features());
  TORCH_CHECK(hidden() > 0, "hidden width must be positive, got hidden=", hidden());
  TORCH_CHECK(blocks() >= 0, "residual blocks must be >= 0, got ", blocks());
  TORCH_CHECK(c10::isFloatingType(dtype()), "ResidualMLP dtype must be floating point, got ", dtype());
}

namespace {

// The layers in the order the standalone module constructs them (and so draws
// their initial values): input, each block's fc1 and fc2, output.
struct LayerShape {
  std::string name;
  int64_t in, out;
};
std::vector<LayerShape> layer_shapes(const ResidualMLPOptions& o) {
  std::vector<LayerShape> layers{{"input", o.in_features(), o.hidden()}};
  for (int64_t b = 0; b < o.blocks(); ++b) {
    layers.push_back({"block" + std::to_string(b) + ".fc1", o.hidden(), o.hidden()});
    layers.push_back({"block" + std::to_string(b) + ".fc2", o.hidden(), o.hidden()});
  }
  layers.push_back({"output", o.hidden(), o.out_features()});
  return layers;
}

std::vector<ParameterSpec> specs(const ResidualMLPOptions& o) {
  std::vector<ParameterSpec> out;
  for (const LayerShape& l : layer_shapes(o)) {
    out.push_back({l.name + ".weight", {l.in, l.out}});  // stored (in, out): one baddbmm
    out.push_back({l.name + ".bias", {1, l.out}});
  }
  return out;
}

// The standalone member: the same layers as torch::nn::Linear modules.
struct ResidualMLPMemberImpl : torch::nn::Module {
  explicit ResidualMLPMemberImpl(const ResidualMLPOptions& o) {
    for (const LayerShape& l : layer_shapes(o)) {
      // Registered under the pack's names with '.' as '_' (a module name has no dots).
      std::string name = l.name;
      for (char& c : name) c = c == '.' ? '_' : c;
      layers.push_back(register_module(name, torch::nn::Linear(l.in, l.out)));
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = layers.front()->forward(x);
    for (size_t b = 1; b + 1 < layers.size(); b += 2) h = h + layers[b + 1]->forward(at::relu(layers[b]->forward(h)));
    return layers.back()->forward(at::relu(h));
  }
  std::vector<torch::nn::Linear> layers;  // input, (fc1, fc2) per block, output
};
TORCH_MODULE(ResidualMLPMember);

}  // namespace

ResidualMLP::ResidualMLP(ResidualMLPOptions options) : options_(std::move(options)) {
  options_.validate();
  parameters_ = PackedParameters(options_.members(), specs(options_),
                                 c10::TensorOptions().dtype(options_.dtype()).device(options_.device()));
  const auto linear = [&](const std::string& name) {
    return PackedLinear(parameters_.at(name + ".weight"), parameters_.at(name + ".bias"));
  };
  input_ = linear("input");
  for (int64_t b = 0; b < options_.blocks(); ++b) {
    fc1_.push_back(linear("block" + std::to_string(b) + ".fc1"));
    fc2_.push_back(linear("block" + std::to_string(b) + ".fc2"));
  }
  output_ = linear("output");
  reinitialize(options_.seed());
}

at::Tensor ResidualMLP::forward_layers(const at::Tensor& x) const {
  input_.check_input(x);
  at::Tensor h = input_.forward(x);  // (K, B, H)
  for (size_t b = 0; b < fc1_.size(); ++b) h = h + fc2_[b].forward(at::relu(fc1_[b].forward(h)));
  return output_.forward(at::relu(h));  // (K, B, O)
}

void ResidualMLP::reinitialize(uint64_t seed, const at::Tensor& which) {
  at::NoGradGuard no_grad;
  const std::vector<int64_t> selected = members_to_reinitialize(which, members());
  if (selected.empty()) return;
  if (!which.defined()) options_.seed(seed);
  // Each member's draws in torch::nn::Linear::reset_parameters' order (linear_init.h).
  std::vector<at::Tensor> rows;
  for (const int64_t k : selected) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(member_seed(seed, options_.first_member() + k));
    at::Tensor row = at::empty({parameters_.per_member()}, at::kFloat);
    for (size_t i = 0; i < parameters_.size(); i += 2) {              // weight, bias of each layer
      const std::vector<int64_t>& shape = parameters_.spec(i).shape;  // (in, out)
      draw_linear_init(row.narrow(0, parameters_.row_offset(i), parameters_.numel(i)).view({shape[0], shape[1]}),
                       row.narrow(0, parameters_.row_offset(i + 1), parameters_.numel(i + 1)), generator);
    }
    rows.push_back(row);
  }
  parameters_.write_member_rows(at::stack(rows).to(options_.dtype()), selected);
}

StandaloneMember ResidualMLP::standalone_member(int64_t member) const {
  TORCH_CHECK(member >= 0 && member < members(), "standalone_member: member ", member, " out of range for a pack of ",
              members(), " members");
  ResidualMLPMember module(options_);
  module->to(options_.device(), options_.dtype());
  torch::NoGradGuard no_grad;
  for (size_t l = 0; l < module->layers.size(); ++l) {
    module->layers[l]->weight.copy_(parameters_[2 * l][member].t());  // (in, out) -> (out, in)
    module->layers[l]->bias.copy_(parameters_[2 * l + 1][member].view({-1}));
  }
  module->train(training_);
  return {module.ptr(), [module](const at::Tensor& x) mutable { return module->forward(x); }};
}

StandaloneMember make_standalone_residual_mlp(const ResidualMLPOptions& options, int64_t member) {
  options.validate();
  TORCH_CHECK(member >= 0, "member index must be >= 0, got ", member);
  torch::manual_seed(member_seed(options.seed(), options.first_member() + member));
  ResidualMLPMember module(options);
  module->to(options.device(), options.dtype());
  return {module.ptr(), [module](const at::Tensor& x) mutable { return module->forward(x); }};
}

}  // namespace packtrain::ensemble
