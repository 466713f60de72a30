#include "packtrain/ensemble/pack.h"

#include "packtrain/ensemble/member_seed.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn.h>
#include <torch/utils.h>

namespace packtrain::ensemble {

namespace {
void push_activation(torch::nn::Sequential& seq, Activation activation) {
  switch (activation) {
    case Activation::kReLU: seq->push_back(torch::nn::ReLU()); return;
    case Activation::kGELU: seq->push_back(torch::nn::GELU()); return;
    case Activation::kSiLU: seq->push_back(torch::nn::SiLU()); return;
    case Activation::kTanh: seq->push_back(torch::nn::Tanh()); return;
  }
}

torch::nn::Sequential empty_standalone(const PackedMLPOptions& o) {
  // Modules are pushed one by one so their parameters are drawn in layer order.
  torch::nn::Sequential seq;
  int64_t in = o.in_features();
  for (int64_t l = 0; l < o.depth(); ++l) {
    seq->push_back(torch::nn::Linear(in, o.hidden()));
    if (o.layer_norm()) seq->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden()})));
    push_activation(seq, o.activation());
    if (o.dropout() > 0) seq->push_back(torch::nn::Dropout(o.dropout()));
    in = o.hidden();
  }
  seq->push_back(torch::nn::Linear(in, o.out_features()));
  return seq;
}

// The standalone model's parameters in the pack's order, each with its per-member
// view shape: Linear weights are (O, I) there and (I, O) in a pack.
std::vector<at::Tensor> standalone_in_pack_layout(const torch::nn::Sequential& seq) {
  std::vector<at::Tensor> out;
  for (const auto& module : seq->children()) {
    if (auto* linear = module->as<torch::nn::Linear>()) {
      out.push_back(linear->weight.t());
      out.push_back(linear->bias.unsqueeze(0));
    } else if (auto* norm = module->as<torch::nn::LayerNorm>()) {
      out.push_back(norm->weight.unsqueeze(0));
      out.push_back(norm->bias.unsqueeze(0));
    }
  }
  return out;
}

// Parameter i's shape (pack layout) in member k's own network: the slot's, with the
// hidden sides at the member's width (mixed widths have no LayerNorm: parameters are
// (weight, bias) pairs, layer i / 2).
std::vector<int64_t> member_shape(const PackedMLPOptions& o, const PackedParameters& params, size_t i, int64_t member) {
  std::vector<int64_t> shape = params.spec(i).shape;
  if (o.member_hidden().empty()) return shape;
  const auto layer = static_cast<int64_t>(i / 2);
  const int64_t width = o.member_width(member);
  if (i % 2 == 0 && layer > 0) shape[0] = width;
  if (layer < o.depth()) shape[1] = width;
  return shape;
}

// The leading block of a member's padded parameter slot that a standalone
// parameter of its own width fills (the whole slot without mixed widths).
at::Tensor member_block(const at::Tensor& slot, const at::Tensor& standalone) {
  at::Tensor block = slot;
  for (int64_t d = 0; d < slot.dim(); ++d) block = block.narrow(d, 0, standalone.size(d));
  return block;
}
}  // namespace

torch::nn::Sequential make_standalone_mlp(const PackedMLPOptions& options, int64_t member) {
  options.validate();
  TORCH_CHECK(member >= 0, "member index must be >= 0, got ", member);
  torch::manual_seed(member_seed(options.seed(), options.first_member() + member));
  torch::nn::Sequential seq = empty_standalone(options.member_options(member));
  seq->to(options.device(), options.dtype());
  return seq;
}

torch::nn::Sequential unpack(const PackedMLP& pack, int64_t member) {
  TORCH_CHECK(member >= 0 && member < pack.members(), "unpack: member ", member, " out of range for a pack of ",
              pack.members(), " members");
  torch::nn::Sequential seq = empty_standalone(pack.options().member_options(member));
  seq->to(pack.options().device(), pack.options().dtype());
  torch::NoGradGuard no_grad;
  const auto targets = standalone_in_pack_layout(seq);
  const PackedParameters& params = pack.parameters();
  TORCH_INTERNAL_ASSERT(targets.size() == params.size(), "standalone and pack layouts differ");
  for (size_t i = 0; i < targets.size(); ++i) targets[i].copy_(member_block(params[i][member], targets[i]));
  seq->train(pack.is_training());
  return seq;
}

PackedMLP pack(const std::vector<torch::nn::Sequential>& models, PackedMLPOptions options) {
  TORCH_CHECK(!models.empty(), "pack: needs at least one model, got none");
  options.members(static_cast<int64_t>(models.size()));
  PackedMLP packed(options);
  PackedParameters& params = packed.parameters();
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < models.size(); ++k) {
    const auto sources = standalone_in_pack_layout(models[k]);
    TORCH_CHECK(sources.size() == params.size(), "pack: model ", k, " has ", sources.size() / 2,
                " linear/norm layers' parameters, the pack's shape expects ", params.size() / 2);
    for (size_t i = 0; i < sources.size(); ++i) {
      const std::vector<int64_t> expected = member_shape(packed.options(), params, i, static_cast<int64_t>(k));
      TORCH_CHECK(sources[i].sizes() == c10::IntArrayRef(expected), "pack: model ", k, " parameter '",
                  params.spec(i).name, "' has shape ", sources[i].sizes(), " in pack layout, expected ",
                  c10::IntArrayRef(expected));
      member_block(params[i][k], sources[i]).copy_(sources[i]);
    }
  }
  return packed;
}

}  // namespace packtrain::ensemble
