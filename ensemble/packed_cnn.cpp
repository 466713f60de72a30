#include "packtrain/ensemble/packed_cnn.h"

#include "packtrain/ensemble/float32_arithmetic.h"

#include "packtrain/base/user_error.h"
#include "packtrain/ensemble/linear_init.h"
#include "packtrain/ensemble/member_seed.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/pooling.h>
#include <torch/utils.h>

#include <cmath>
#include <sstream>
#include <string>

namespace packtrain::ensemble {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << c10::IntArrayRef(shape);
  return out.str();
}

// Per-member channel lists: one per member, one count per block within the pack's,
// and no GroupNorm across different counts (PackedCNNOptions::member_channels).
void check_member_channels(const PackedCNNOptions& o) {
  if (o.member_channels().empty()) return;
  if (static_cast<int64_t>(o.member_channels().size()) != o.members()) {
    throw UserError("cnn per-member channels: expected one channel list per member (" + std::to_string(o.members()) +
                    "), got " + std::to_string(o.member_channels().size()));
  }
  for (size_t m = 0; m < o.member_channels().size(); ++m) {
    const std::vector<int64_t>& own = o.member_channels()[m];
    bool fits = own.size() == o.channels().size();
    for (size_t b = 0; fits && b < own.size(); ++b) fits = own[b] >= 1 && own[b] <= o.channels()[b];
    if (!fits) {
      throw UserError("cnn member " + std::to_string(m) + "'s channels " + shape_text(own) + " do not fit the pack's " +
                      shape_text(o.channels()) + ": give one count per block, each from 1 to the pack's");
    }
    if (o.norm_groups() > 0 && own != o.channels()) {
      throw UserError(
          "cnn members of different channel counts cannot have GroupNorm (norm groups " +
          std::to_string(o.norm_groups()) +
          "): a group would count a narrower member's padding channels in its statistics; give one channel list, "
          "or norm groups 0");
    }
  }
}

}  // namespace

void PackedCNNOptions::validate() const {
  TORCH_CHECK(members() > 0, "members must be positive, got members=", members());
  TORCH_CHECK(first_member() >= 0, "first_member must be >= 0, got ", first_member());
  TORCH_CHECK(c10::isFloatingType(dtype()), "PackedCNN dtype must be floating point, got ", dtype());
  const std::string shape = shape_text(input_shape());
  if (input_shape().size() != 2 && input_shape().size() != 3) {
    throw UserError("the cnn architecture needs an input shape {C, H, W} (images) or {C, L} (sequences), got " + shape);
  }
  for (const int64_t d : input_shape()) {
    if (d <= 0) throw UserError("cnn input shape " + shape + ": every size must be positive");
  }
  if (out_features() <= 0) throw UserError("cnn out_features must be positive, got " + std::to_string(out_features()));
  if (channels().empty()) throw UserError("cnn channels: give at least one convolution block's channel count");
  for (const int64_t c : channels()) {
    if (c <= 0) throw UserError("cnn channels must be positive, got " + shape_text(channels()));
  }
  if (kernel_size() <= 0) throw UserError("cnn kernel size must be positive, got " + std::to_string(kernel_size()));
  if (padding() == kSamePadding && kernel_size() % 2 == 0) {
    throw UserError("cnn kernel size must be odd for \"same\" padding k/2, got " + std::to_string(kernel_size()) +
                    ": pass an odd kernel, or an explicit padding");
  }
  if (stride() < 1) throw UserError("cnn stride must be at least 1, got " + std::to_string(stride()));
  if (padding() < 0 && padding() != kSamePadding) {
    throw UserError("cnn padding must be >= 0 (or \"same\"), got " + std::to_string(padding()));
  }
  if (norm_groups() < 0)
    throw UserError("cnn norm groups must be >= 0 (0: no normalization), got " + std::to_string(norm_groups()));
  for (size_t b = 0; norm_groups() > 0 && b < channels().size(); ++b) {
    if (channels()[b] % norm_groups() != 0) {
      throw UserError("cnn norm groups " + std::to_string(norm_groups()) + " do not divide block " + std::to_string(b) +
                      "'s " + std::to_string(channels()[b]) + " channels (channels " + shape_text(channels()) +
                      "): pass a group count that divides every block's channels");
    }
  }
  const auto check_rate = [](double p, const char* what) {
    if (!(p >= 0.0 && p < 1.0))
      throw UserError(std::string("cnn ") + what + " must be in [0, 1), got " + std::to_string(p));
  };
  check_rate(dropout(), "dropout");
  for (const double p : member_dropout()) check_rate(p, "per-member dropout");
  if (!member_dropout().empty() && static_cast<int64_t>(member_dropout().size()) != members()) {
    throw UserError("cnn per-member dropout: expected one rate per member (" + std::to_string(members()) + "), got " +
                    std::to_string(member_dropout().size()));
  }
  if (depth() < 0) throw UserError("cnn head depth must be >= 0, got " + std::to_string(depth()));
  if (depth() > 0 && hidden() <= 0)
    throw UserError("cnn hidden width must be positive, got " + std::to_string(hidden()));
  if (!member_hidden().empty() && static_cast<int64_t>(member_hidden().size()) != members()) {
    throw UserError("cnn per-member widths: expected one width per member (" + std::to_string(members()) + "), got " +
                    std::to_string(member_hidden().size()));
  }
  for (const int64_t w : member_hidden()) {
    if (w < 1 || w > hidden()) {
      throw UserError("cnn per-member width must be in [1, hidden=" + std::to_string(hidden()) + "], got " +
                      std::to_string(w));
    }
  }
  check_member_channels(*this);
  std::vector<int64_t> spatial(input_shape().begin() + 1, input_shape().end());
  for (size_t b = 0; b < channels().size(); ++b) {
    for (int64_t& s : spatial) {
      const int64_t convolved = conv_output(s);
      if (convolved < 2) {
        throw UserError("cnn input shape " + shape + " has no room for " + std::to_string(channels().size()) +
                        " blocks (channels " + shape_text(channels()) + ", kernel " + std::to_string(kernel_size()) +
                        ", stride " + std::to_string(stride()) + ", padding " + std::to_string(conv_padding()) +
                        "): block " + std::to_string(b) + " would pool a size-" + std::to_string(convolved) +
                        " dimension (its convolution's output); pass fewer channels, a smaller stride or more "
                        "padding");
      }
      s = convolved / 2;
    }
  }
}

int64_t PackedCNNOptions::conv_padding() const { return padding() == kSamePadding ? kernel_size() / 2 : padding(); }

int64_t PackedCNNOptions::conv_output(int64_t n) const {
  const int64_t padded = n + 2 * conv_padding();
  return padded < kernel_size() ? 0 : (padded - kernel_size()) / stride() + 1;
}

bool PackedCNNOptions::has_dropout() const { return drops_units(dropout(), member_dropout()); }

int64_t PackedCNNOptions::in_features() const {
  int64_t n = 1;
  for (const int64_t d : input_shape()) n *= d;
  return n;
}

int64_t PackedCNNOptions::member_width(int64_t member) const {
  return member_hidden().empty() ? hidden() : member_hidden().at(static_cast<size_t>(member));
}

const std::vector<int64_t>& PackedCNNOptions::member_channel_counts(int64_t member) const {
  return member_channels().empty() ? channels() : member_channels().at(static_cast<size_t>(member));
}

PackedCNNOptions PackedCNNOptions::member_options(int64_t member) const {
  PackedCNNOptions one = *this;
  one.members(1)
      .channels(member_channel_counts(member))
      .member_channels({})
      .hidden(member_width(member))
      .member_hidden({})
      .first_member(first_member() + member);
  if (!member_dropout().empty()) one.member_dropout({member_dropout().at(static_cast<size_t>(member))});
  return one;
}

int64_t PackedCNNOptions::spatial_dims() const { return static_cast<int64_t>(input_shape().size()) - 1; }

int64_t PackedCNNOptions::flat_features() const {
  int64_t n = channels().back();
  for (size_t d = 1; d < input_shape().size(); ++d) {
    int64_t s = input_shape()[d];
    for (size_t b = 0; b < channels().size(); ++b) s = conv_output(s) / 2;
    n *= s;
  }
  return n;
}

double PackedCNNOptions::parameters_per_member() const {
  double total = 0, in = static_cast<double>(input_shape().front());
  const double taps = std::pow(static_cast<double>(kernel_size()), static_cast<double>(spatial_dims()));
  for (const int64_t c : channels()) {
    total += static_cast<double>(c) * in * taps + static_cast<double>(c);
    if (norm_groups() > 0) total += 2 * static_cast<double>(c);  // GroupNorm's weight and bias
    in = static_cast<double>(c);
  }
  double width = static_cast<double>(flat_features());
  for (int64_t l = 0; l < depth(); ++l) {
    total += width * static_cast<double>(hidden()) + static_cast<double>(hidden());
    width = static_cast<double>(hidden());
  }
  return total + width * static_cast<double>(out_features()) + static_cast<double>(out_features());
}

namespace {

// The parameters in the order the standalone Sequential constructs them (and so
// draws their initial values): each block's conv (and GroupNorm), each hidden
// Linear, the output.
std::vector<ParameterSpec> cnn_specs(const PackedCNNOptions& o) {
  std::vector<ParameterSpec> specs;
  int64_t in = o.input_shape().front();
  for (size_t b = 0; b < o.channels().size(); ++b) {
    const int64_t out = o.channels()[b];
    std::vector<int64_t> weight{out, in};
    for (int64_t d = 0; d < o.spatial_dims(); ++d) weight.push_back(o.kernel_size());
    specs.push_back({"conv" + std::to_string(b) + ".weight", weight});  // (Cout, Cin, k[, k]) as torch::nn::Conv
    specs.push_back({"conv" + std::to_string(b) + ".bias", {out}});
    if (o.norm_groups() > 0) {
      specs.push_back({"norm" + std::to_string(b) + ".weight", {out}});
      specs.push_back({"norm" + std::to_string(b) + ".bias", {out}});
    }
    in = out;
  }
  int64_t width = o.flat_features();
  for (int64_t l = 0; l <= o.depth(); ++l) {
    const int64_t out = l < o.depth() ? o.hidden() : o.out_features();
    const std::string name = l < o.depth() ? "fc" + std::to_string(l) : "output";
    specs.push_back({name + ".weight", {width, out}});  // (in, out): one baddbmm
    specs.push_back({name + ".bias", {1, out}});
    width = out;
  }
  return specs;
}

bool is_conv(const ParameterSpec& spec) { return spec.name.starts_with("conv"); }
bool is_norm(const ParameterSpec& spec) { return spec.name.starts_with("norm"); }

// torch::nn::Conv{1,2}d's reset_parameters, drawn into a member row's slots:
// kaiming_uniform(a = sqrt(5)) over fan_in = Cin * k^d, then bias ~ U(+-1/sqrt(fan_in)).
void draw_conv_init(const at::Tensor& weight, const at::Tensor& bias, at::Generator& generator) {
  const int64_t fan_in = weight.size(1) * weight[0][0].numel();
  const double gain = std::sqrt(2.0 / (1 + std::pow(std::sqrt(5.0), 2)));
  const double weight_bound = std::sqrt(3.0) * (gain / std::sqrt(static_cast<double>(fan_in)));
  weight.copy_(at::empty(weight.sizes(), at::kFloat).uniform_(-weight_bound, weight_bound, generator));
  const double bias_bound = 1 / std::sqrt(static_cast<double>(fan_in));
  bias.uniform_(-bias_bound, bias_bound, generator);
}

// One convolution over (B, groups*Cin, ...) with a (groups*Cout, Cin, k...) weight.
at::Tensor convolve(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const PackedCNNOptions& o,
                    int64_t groups) {
  const int64_t s = o.stride(), p = o.conv_padding();
  if (x.dim() == 4) return at::conv2d(x, weight, bias, {s, s}, {p, p}, {1, 1}, groups);
  return at::conv1d(x, weight, bias, {s}, {p}, {1}, groups);
}

at::Tensor pool(const at::Tensor& h, Pool kind) {
  if (kind == Pool::kAvg) return h.dim() == 4 ? at::avg_pool2d(h, {2, 2}) : at::avg_pool1d(h, {2});
  return h.dim() == 4 ? at::max_pool2d(h, {2, 2}) : at::max_pool1d(h, {2});
}

// torch::nn::GroupNorm's epsilon.
constexpr double kNormEps = 1e-5;

// Member k's network from its own options (PackedCNNOptions::member_options: one
// member, its channels, head width and dropout rate).
torch::nn::Sequential make_member_module(const PackedCNNOptions& o) {
  torch::nn::Sequential seq;
  seq->push_back(torch::nn::Unflatten(torch::nn::UnflattenOptions(1, o.input_shape())));
  int64_t in = o.input_shape().front();
  const int64_t k = o.kernel_size();
  const bool two_d = o.spatial_dims() == 2, avg = o.pool() == Pool::kAvg;
  for (const int64_t out : o.channels()) {
    if (two_d) {
      seq->push_back(
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).stride(o.stride()).padding(o.conv_padding())));
    } else {
      seq->push_back(
          torch::nn::Conv1d(torch::nn::Conv1dOptions(in, out, k).stride(o.stride()).padding(o.conv_padding())));
    }
    if (o.norm_groups() > 0) {
      seq->push_back(torch::nn::GroupNorm(torch::nn::GroupNormOptions(o.norm_groups(), out).eps(kNormEps)));
    }
    seq->push_back(torch::nn::ReLU());
    if (two_d && avg) seq->push_back(torch::nn::AvgPool2d(torch::nn::AvgPool2dOptions(2)));
    if (two_d && !avg) seq->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
    if (!two_d && avg) seq->push_back(torch::nn::AvgPool1d(torch::nn::AvgPool1dOptions(2)));
    if (!two_d && !avg) seq->push_back(torch::nn::MaxPool1d(torch::nn::MaxPool1dOptions(2)));
    in = out;
  }
  seq->push_back(torch::nn::Flatten());
  int64_t width = o.flat_features();
  const double rate = o.member_dropout().empty() ? o.dropout() : o.member_dropout().front();
  for (int64_t l = 0; l < o.depth(); ++l) {
    seq->push_back(torch::nn::Linear(width, o.hidden()));
    seq->push_back(torch::nn::ReLU());
    if (rate > 0) seq->push_back(torch::nn::Dropout(rate));
    width = o.hidden();
  }
  seq->push_back(torch::nn::Linear(width, o.out_features()));
  return seq;
}

// The leading block of a padded parameter slot that a member's own parameter of
// `shape` (pack layout) fills: all of it unless the member is narrower.
at::Tensor leading_block(at::Tensor slot, const std::vector<int64_t>& shape) {
  for (int64_t d = 0; d < slot.dim(); ++d) slot = slot.narrow(d, 0, shape[static_cast<size_t>(d)]);
  return slot;
}

StandaloneMember as_member(torch::nn::Sequential seq) {
  return {seq.ptr(), [seq](const at::Tensor& x) mutable { return seq->forward(x); }};
}

}  // namespace

PackedCNN::PackedCNN(PackedCNNOptions options) : options_(std::move(options)) {
  options_.validate();
  parameters_ = PackedParameters(options_.members(), cnn_specs(options_),
                                 c10::TensorOptions().dtype(options_.dtype()).device(options_.device()));
  for (size_t b = 0; b < options_.channels().size(); ++b) {
    conv_weights_.push_back(parameters_.at("conv" + std::to_string(b) + ".weight"));
    conv_biases_.push_back(parameters_.at("conv" + std::to_string(b) + ".bias"));
    if (options_.norm_groups() > 0) {
      norm_weights_.push_back(parameters_.at("norm" + std::to_string(b) + ".weight"));
      norm_biases_.push_back(parameters_.at("norm" + std::to_string(b) + ".bias"));
    }
  }
  for (int64_t l = 0; l <= options_.depth(); ++l) {
    const std::string name = l < options_.depth() ? "fc" + std::to_string(l) : "output";
    head_.emplace_back(parameters_.at(name + ".weight"), parameters_.at(name + ".bias"));
  }
  if (options_.has_dropout()) {
    // Only the masks are used: one input, one output, no hidden layer.
    masks_ = std::make_unique<PackedMLP>(PackedMLPOptions(1, 1)
                                             .members(options_.members())
                                             .depth(0)
                                             .dropout(options_.dropout())
                                             .member_dropout(options_.member_dropout())
                                             .seed(options_.seed())
                                             .first_member(options_.first_member())
                                             .dtype(options_.dtype())
                                             .device(options_.device()));
  }
  reinitialize(options_.seed());
}

void PackedCNN::check_input(const at::Tensor& x) const {
  const int64_t K = members(), I = options_.in_features();
  TORCH_CHECK(x.defined(), "packed cnn: input is undefined");
  TORCH_CHECK((x.dim() == 2 || x.dim() == 3) && x.size(-1) == I, "packed cnn input for input shape ",
              c10::IntArrayRef(options_.input_shape()), ": expected (B, ", I, ") shared or (", K, ", B, ", I,
              ") per member, got ", x.sizes());
  TORCH_CHECK(x.dim() == 2 || x.size(0) == K, "packed cnn input for ", K, " members: expected [", K, ", B, ", I,
              "], got ", x.sizes());
  TORCH_CHECK(x.device() == device(), "packed cnn input is on ", x.device(), " but the weights are on ", device());
  TORCH_CHECK(x.scalar_type() == dtype(), "packed cnn input dtype ", x.scalar_type(), " differs from the weights' ",
              dtype());
}

at::Tensor PackedCNN::forward_layers(const at::Tensor& x) const {
  check_input(x);
  const ExactFloat32Scope exact;  // float32 convolutions, also when predicting
  at::Tensor f = features(x);
  for (size_t l = 0; l + 1 < head_.size(); ++l) {
    f = head_[l].forward(f).relu_();
    if (training_ && masks_) f = f * masks_->dropout_noise(f);
  }
  return head_.back().forward(f);  // (K, B, O)
}

at::Tensor PackedCNN::features(const at::Tensor& x) const {
  const int64_t K = members(), B = x.size(-2);
  std::vector<int64_t> sample = options_.input_shape();  // {C, H, W} or {C, L}
  // Member-grouped convolution weights (K*Cout, Cin, k...) and biases (K*Cout): views.
  const auto grouped = [&](size_t b) {
    std::vector<int64_t> shape = conv_weights_[b].sizes().vec();
    shape[1] *= K;
    shape.erase(shape.begin());
    return std::make_pair(conv_weights_[b].view(shape), conv_biases_[b].view({-1}));
  };
  at::Tensor h;  // (B, K*C, ...): member k's channels at [k*C, (k+1)*C)
  {
    const auto [weight, bias] = grouped(0);
    if (x.dim() == 2) {
      // One batch for all: one ungrouped convolution to K*Cout channels.
      sample.insert(sample.begin(), B);
      h = convolve(x.reshape(sample), weight, bias, options_, 1);
    } else {
      sample[0] *= K;
      sample.insert(sample.begin(), B);
      h = convolve(x.transpose(0, 1).reshape(sample), weight, bias, options_, K);
    }
  }
  // Member k's GroupNorm(G, C) is group norm with K*G groups over (B, K*C, ...):
  // each group lies inside one member's channels.
  const auto block_end = [&](at::Tensor c, size_t b) {
    if (options_.norm_groups() > 0) {
      c = at::group_norm(c, K * options_.norm_groups(), norm_weights_[b].view({-1}), norm_biases_[b].view({-1}),
                         kNormEps);
    }
    return pool(c.relu_(), options_.pool());
  };
  h = block_end(h, 0);
  for (size_t b = 1; b < conv_weights_.size(); ++b) {
    const auto [weight, bias] = grouped(b);
    h = block_end(convolve(h, weight, bias, options_, K), b);
  }
  return h.reshape({B, K, -1}).transpose(0, 1);  // (K, B, F), each member's (C, H, W) flattening
}

at::Tensor PackedCNN::dropout_noise(const at::Tensor& h) const {
  return masks_ ? masks_->dropout_noise(h) : at::Tensor();
}

void PackedCNN::seed_dropout(uint64_t seed) {
  if (masks_) masks_->seed_dropout(seed);
}

void PackedCNN::dropout_rows(int64_t offset, int64_t rows) {
  if (masks_) masks_->dropout_rows(offset, rows);
}

void PackedCNN::reinitialize(uint64_t seed, const at::Tensor& which) {
  at::NoGradGuard no_grad;
  const std::vector<int64_t> selected = members_to_reinitialize(which, members());
  if (selected.empty()) return;
  if (!which.defined()) options_.seed(seed);
  // Each member's draws in the standalone Sequential's construction order, each into
  // the leading block of its slot that the member's own channels and width fill; the
  // rest stays zero (member_channels, member_hidden).
  std::vector<at::Tensor> rows;
  for (const int64_t m : selected) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(member_seed(seed, options_.first_member() + m));
    const std::vector<ParameterSpec> own = cnn_specs(options_.member_options(m));
    at::Tensor row = at::zeros({parameters_.per_member()}, at::kFloat);
    for (size_t i = 0; i < parameters_.size(); i += 2) {  // weight, bias of each layer
      const ParameterSpec& spec = parameters_.spec(i);
      const auto slot = [&](size_t j) {
        return row.narrow(0, parameters_.row_offset(j), parameters_.numel(j)).view(parameters_.spec(j).shape);
      };
      const at::Tensor weight = leading_block(slot(i), own[i].shape);
      const at::Tensor bias = leading_block(slot(i + 1), own[i + 1].shape);
      if (is_norm(spec)) {  // GroupNorm starts at ones and zeros and draws nothing
        weight.fill_(1.0);
        bias.fill_(0.0);
      } else if (is_conv(spec)) {
        draw_conv_init(weight, bias, generator);
      } else {
        draw_linear_init(weight, bias, generator);
      }
    }
    rows.push_back(row);
  }
  parameters_.write_member_rows(at::stack(rows).to(options_.dtype()), selected);
}

StandaloneMember PackedCNN::standalone_member(int64_t member) const {
  TORCH_CHECK(member >= 0 && member < members(), "standalone_member: member ", member, " out of range for a pack of ",
              members(), " members");
  const PackedCNNOptions own = options_.member_options(member);
  torch::nn::Sequential seq = make_member_module(own);
  seq->to(options_.device(), options_.dtype());
  torch::NoGradGuard no_grad;
  const std::vector<at::Tensor> params = seq->parameters();
  const std::vector<ParameterSpec> own_specs = cnn_specs(own);
  TORCH_INTERNAL_ASSERT(params.size() == parameters_.size(), "cnn member module has ", params.size(),
                        " parameters, the pack ", parameters_.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const ParameterSpec& spec = parameters_.spec(i);
    const at::Tensor block = leading_block(parameters_[i][member], own_specs[i].shape);
    const bool linear_weight = !is_conv(spec) && !is_norm(spec) && spec.name.ends_with(".weight");
    params[i].copy_(linear_weight ? block.t() : block.reshape(params[i].sizes()));  // Linear: (in, out) -> (out, in)
  }
  seq->train(training_);
  return as_member(seq);
}

StandaloneMember make_standalone_cnn(const PackedCNNOptions& options, int64_t member) {
  options.validate();
  TORCH_CHECK(member >= 0, "member index must be >= 0, got ", member);
  TORCH_CHECK(member < options.members(), "member ", member, " out of range for ", options.members(), " members");
  torch::manual_seed(member_seed(options.seed(), options.first_member() + member));
  torch::nn::Sequential seq = make_member_module(options.member_options(member));
  seq->to(options.device(), options.dtype());
  return as_member(seq);
}

}  // namespace packtrain::ensemble
