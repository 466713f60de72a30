#include "packtrain/ensemble/architectures.h"

#include "packtrain/base/user_error.h"
#include "packtrain/ensemble/packed_cnn.h"
#include "packtrain/ensemble/residual_mlp.h"

#include <sstream>
#include <string>

namespace packtrain::ensemble {

namespace {

// The fields every architecture's options share, from the spec.
template <typename Options>
Options with_common(Options o, const PackSpec& s) {
  o.members(s.members).hidden(s.hidden).seed(s.seed).first_member(s.first_member).dtype(s.dtype).device(s.device);
  return o;
}

// Members of different channel counts are a cnn's: another architecture refuses them.
void refuse_member_channels(const PackSpec& s, const std::string& name) {
  if (!s.member_channels.empty()) {
    throw UserError("the " + name +
                    " architecture has no convolution channels to differ in (several --channels lists): use "
                    "--architecture cnn for them");
  }
}

std::unique_ptr<PackedModel> make_mlp(const PackSpec& s) {
  refuse_member_channels(s, "mlp");
  return std::make_unique<PackedMLP>(with_common(PackedMLPOptions(s.in_features, s.out_features), s)
                                         .depth(s.depth)
                                         .activation(s.activation)
                                         .layer_norm(s.layer_norm)
                                         .dropout(s.dropout)
                                         .member_dropout(s.member_dropout)
                                         .member_hidden(s.member_hidden));
}

double mlp_parameters(const PackSpec& s) {
  const double I = static_cast<double>(s.in_features), O = static_cast<double>(s.out_features),
               H = static_cast<double>(s.hidden), D = static_cast<double>(s.depth);
  if (s.depth == 0) return I * O + O;
  const double norms = s.layer_norm ? 2 * H * D : 0;
  return (I * H + H) + (D - 1) * (H * H + H) + (H * O + O) + norms;
}

// Members of different widths are an MLP's and a cnn head's (packed_mlp.h): another
// architecture refuses them with a UserError naming it.
void refuse_mixed_widths(const PackSpec& s, const std::string& name) {
  if (!s.member_hidden.empty()) {
    throw UserError("the " + name +
                    " architecture has no members of different widths (several --hidden values): sweep widths "
                    "with --architecture mlp, or give one --hidden");
  }
}

// What an architecture of plain ReLU layers (no other activation, no normalization,
// no dropout) has no place for is refused, not silently dropped: a UserError naming
// it and what the architecture `name` is.
void refuse_beyond_relu_layers(const PackSpec& s, const std::string& name, const std::string& what_it_is) {
  const auto lacks = [&](const std::string& what) {
    throw UserError("the " + name + " architecture has no " + what + " (it is " + what_it_is +
                    "): use --architecture mlp for it");
  };
  if (s.activation != Activation::kReLU) lacks("activation other than relu");
  if (s.layer_norm) lacks("layer norm");
  if (s.dropout != 0 || !s.member_dropout.empty()) lacks("dropout");
  refuse_mixed_widths(s, name);
}

std::unique_ptr<PackedModel> make_residual_mlp(const PackSpec& s) {
  refuse_member_channels(s, "residual-mlp");
  refuse_beyond_relu_layers(s, "residual-mlp", "input, blocks of h + fc2(relu(fc1(h))), relu, output");
  return std::make_unique<ResidualMLP>(
      with_common(ResidualMLPOptions(s.in_features, s.out_features), s).blocks(s.depth));
}

double residual_mlp_parameters(const PackSpec& s) {
  const double I = static_cast<double>(s.in_features), O = static_cast<double>(s.out_features),
               H = static_cast<double>(s.hidden), D = static_cast<double>(s.depth);
  return (I * H + H) + D * 2 * (H * H + H) + (H * O + O);
}

// The cnn's options from the spec: its sample shape (a UserError naming what to pass
// when there is none, or when it does not hold the rows' features), channels and
// kernel (the architecture's defaults when the spec leaves them empty, 0).
PackedCNNOptions cnn_options(const PackSpec& s) {
  if (s.input_shape.empty()) {
    throw UserError(
        "the cnn architecture needs the shape of each sample, {C, H, W} (images) or {C, L} "
        "(sequences), and these rows of " +
        std::to_string(s.in_features) +
        " features have none: pass input_shape (image and sequence data sets carry it), or use "
        "--architecture mlp for a table");
  }
  PackedCNNOptions o = with_common(PackedCNNOptions(s.input_shape, s.out_features), s)
                           .depth(s.depth)
                           .stride(s.stride)
                           .padding(s.padding)
                           .pool(s.pool)
                           .norm_groups(s.norm_groups)
                           .dropout(s.dropout)
                           .member_dropout(s.member_dropout)
                           .member_hidden(s.member_hidden)
                           .member_channels(s.member_channels);
  if (!s.channels.empty()) o.channels(s.channels);
  if (s.kernel_size != 0) o.kernel_size(s.kernel_size);
  o.validate();
  if (o.in_features() != s.in_features) {
    std::ostringstream shape;
    shape << c10::IntArrayRef(s.input_shape);
    throw UserError("cnn input shape " + shape.str() + " holds " + std::to_string(o.in_features()) +
                    " values per sample, but the rows have " + std::to_string(s.in_features) + " features");
  }
  return o;
}

std::unique_ptr<PackedModel> make_cnn(const PackSpec& s) {
  if (s.activation != Activation::kReLU) {
    throw UserError("the cnn architecture has no activation other than relu: use --architecture mlp for it");
  }
  if (s.layer_norm) {
    throw UserError(
        "the cnn architecture has no layer norm flag: pass norm groups instead (--norm-groups 1 normalizes each "
        "convolution block over all its channels and positions, a layer norm with per-channel affine)");
  }
  return std::make_unique<PackedCNN>(cnn_options(s));
}

double cnn_parameters(const PackSpec& s) { return cnn_options(s).parameters_per_member(); }

}  // namespace

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> table{
      {"mlp", "depth hidden layers of width hidden, each activation (and layer norm, dropout) after it", make_mlp,
       mlp_parameters},
      {"residual-mlp", "an input layer to width hidden, depth residual blocks h + fc2(relu(fc1(h))), relu, output",
       make_residual_mlp, residual_mlp_parameters},
      {"cnn",
       "convolution blocks (channels, odd kernel, group norm, relu, max- or average-pool 2) over each sample's "
       "{C, H, W} or {C, L}, flatten, depth hidden layers of width hidden (and dropout), output",
       make_cnn, cnn_parameters},
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
