#include "packtrain/ensemble/architectures.h"

#include "packtrain/base/user_error.h"
#include "packtrain/ensemble/residual_mlp.h"

#include <string>

namespace packtrain::ensemble {

namespace {

// The fields every architecture's options share, from the spec.
template <typename Options>
Options with_common(Options o, const PackSpec& s) {
  o.members(s.members).hidden(s.hidden).seed(s.seed).first_member(s.first_member).dtype(s.dtype).device(s.device);
  return o;
}

std::unique_ptr<PackedModel> make_mlp(const PackSpec& s) {
  return std::make_unique<PackedMLP>(with_common(PackedMLPOptions(s.in_features, s.out_features), s)
                                         .depth(s.depth)
                                         .activation(s.activation)
                                         .layer_norm(s.layer_norm)
                                         .dropout(s.dropout)
                                         .member_dropout(s.member_dropout));
}

double mlp_parameters(const PackSpec& s) {
  const double I = static_cast<double>(s.in_features), O = static_cast<double>(s.out_features),
               H = static_cast<double>(s.hidden), D = static_cast<double>(s.depth);
  if (s.depth == 0) return I * O + O;
  const double norms = s.layer_norm ? 2 * H * D : 0;
  return (I * H + H) + (D - 1) * (H * H + H) + (H * O + O) + norms;
}

std::unique_ptr<PackedModel> make_residual_mlp(const PackSpec& s) {
  // What the residual blocks have no place for is refused, not silently dropped.
  const auto lacks = [](const std::string& what) {
    throw UserError("the residual-mlp architecture has no " + what + " (it is " +
                    "input, blocks of h + fc2(relu(fc1(h))), relu, output): use --architecture mlp for it");
  };
  if (s.activation != Activation::kReLU) lacks("activation other than relu");
  if (s.layer_norm) lacks("layer norm");
  if (s.dropout != 0 || !s.member_dropout.empty()) lacks("dropout");
  return std::make_unique<ResidualMLP>(with_common(ResidualMLPOptions(s.in_features, s.out_features), s).blocks(s.depth));
}

double residual_mlp_parameters(const PackSpec& s) {
  const double I = static_cast<double>(s.in_features), O = static_cast<double>(s.out_features),
               H = static_cast<double>(s.hidden), D = static_cast<double>(s.depth);
  return (I * H + H) + D * 2 * (H * H + H) + (H * O + O);
}

}  // namespace

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> table{
      {"mlp", "depth hidden layers of width hidden, each activation (and layer norm, dropout) after it", make_mlp,
       mlp_parameters},
      {"residual-mlp", "an input layer to width hidden, depth residual blocks h + fc2(relu(fc1(h))), relu, output",
       make_residual_mlp, residual_mlp_parameters},
  };
  return table;
}

std::vector<std::string> architecture_names() {
  std::vector<std::string> names;
  for (const Architecture& a : architectures()) names.emplace_back(a.name);
  return names;
}

const Architecture& architecture(std::string_view name) {
  std::string known;
  for (const Architecture& a : architectures()) {
    if (a.name == name) return a;
    known += (known.empty() ? "" : ", ") + std::string(a.name);
  }
  throw UserError("unknown architecture '" + std::string(name) + "' (expected " + known + ")");
}

}  // namespace packtrain::ensemble
