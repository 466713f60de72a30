// PackedCNN: K small convolutional networks of one shape trained as one model, behind
// the PackedModel seam (packed_model.h). Member i is
//   x (B, C*H*W) -> (B, C, H, W); per block: pool(relu([norm](conv(x))), 2);
//   flatten; `depth` hidden Linear + ReLU [+ Dropout] layers of width `hidden`; output Linear
// (1-D: (B, C*L) -> (B, C, L), Conv1d and MaxPool1d/AvgPool1d), convolutions of
// kernel k, stride s and zero padding p (by default s = 1 and "same" padding k/2 of
// an odd k), each pool (max or average, kernel 2) halving (rounding down) every
// spatial dimension. It equals, bit for bit at
// initialization, the torch::nn::Sequential (Unflatten, Conv2d/Conv1d, [GroupNorm],
// ReLU, MaxPool2d/AvgPool2d/..., Flatten, Linear, ReLU, [Dropout]) make_standalone_cnn(options, i) builds.
//
// Packing: the activations stay (B, K*C, ...), members' channels side by side, and
// every convolution is one grouped convolution (groups = K) with the weight
// (K, Cout, Cin, k...) viewed as (K*Cout, Cin, k...) — a free view, each parameter
// being one contiguous member-major block of the flat buffer. A shared batch (B, I)
// enters the first block as one ungrouped convolution with K*Cout output channels
// (no K copies of the input); per-member batches (K, B, I) are transposed to
// (B, K*C, ...) once. Members cannot be folded into the batch: their weights differ.
// The head flattens to (K, B, F) and runs PackedLinear layers (one baddbmm each).
// Measured against a loop of K convolutions: benchmarks/conv_pack_bench.cpp.
//
// Normalization is group normalization (norm_groups G > 0: torch::nn::GroupNorm(G, C)
// after each convolution, per-channel affine weight and bias as (K, C) parameters).
// Why not batch normalization: group norm is stateless — nothing differs between
// training and evaluation, so captured steps stay static, checkpoints hold no
// buffers, and data parallel needs no synchronized statistics — and it packs for
// free: on (B, K*C, ...) one at::group_norm with K*G groups is each member's
// GroupNorm(G, C), since every group lies inside one member's channels. G = 1 is a
// layer norm over each block's (C, H, W) with per-channel affine (the MLP's
// layer_norm flag is refused here: pass norm_groups). G must divide every block's
// channels.
//
// Dropout (dropout / member_dropout, as PackedMLPOptions) follows each hidden
// activation of the head, in training mode, with the MLP's counter-based masks: a
// depth-0 PackedMLP of the same members, seed and rates is their source (its
// dropout_noise is the one implementation, CPU and CUDA), so a member drops what it
// would in an MLP pack of its index — whatever pack, shard or rank it trains in.
// The convolution blocks have no dropout.
//
// Not here: batch normalization (see above), activations other than ReLU, dropout
// in the convolution blocks; the registry refuses a spec asking for them
// (architectures.cpp).
#pragma once

#include "packtrain/base/enum_names.h"

#include "packtrain/ensemble/packed_linear.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_model.h"
#include "packtrain/ensemble/packed_parameters.h"

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace packtrain::ensemble {

// Each convolution block's output channels unless told otherwise (the trainer's
// `channels` option shows and uses the same).
inline const std::vector<int64_t> kDefaultCnnChannels{32, 64};

// Each block's pooling (kernel 2, stride 2): torch::nn::MaxPool2d/1d or AvgPool2d/1d.
enum class Pool { kMax, kAvg };
inline constexpr EnumNames<Pool, 2> kPoolNames{"pool", {{{Pool::kMax, "max"}, {Pool::kAvg, "avg"}}}};
inline std::string_view to_string(Pool pool) { return kPoolNames.name(pool); }

// PackedCNNOptions::padding's default: k/2 on each side, which keeps a stride-1
// convolution's output the size of its input for an odd kernel k.
inline constexpr int64_t kSamePadding = -1;

struct PackedCNNOptions {
  /// Example: PackedCNNOptions({1, 8, 8}, 10).members(64).channels({32, 64}).hidden(64).depth(1)
  PackedCNNOptions(std::vector<int64_t> input_shape, int64_t out_features)
      : input_shape_(std::move(input_shape)), out_features_(out_features) {}

  TORCH_ARG(std::vector<int64_t>, input_shape);  // {C, H, W} (2-D) or {C, L} (1-D); I = their product
  TORCH_ARG(int64_t, out_features);              // O
  TORCH_ARG(int64_t, members) = 8;               // K
  TORCH_ARG(std::vector<int64_t>, channels) = kDefaultCnnChannels;  // output channels per conv block
  TORCH_ARG(int64_t, kernel_size) = 3;                              // k (odd for "same" padding)
  TORCH_ARG(int64_t, stride) = 1;                                   // each convolution's stride
  TORCH_ARG(int64_t, padding) = kSamePadding;  // each convolution's zero padding; kSamePadding: k/2
  TORCH_ARG(Pool, pool) = Pool::kMax;          // each block's pooling, kernel 2
  TORCH_ARG(int64_t, norm_groups) = 0;         // G: GroupNorm(G, C) after each convolution (0: none)
  TORCH_ARG(int64_t, hidden) = 64;             // H, width of the head's hidden layers (the widest member's)
  // Per-member head widths (members() values in [1, hidden], or empty): members of
  // different widths padded to `hidden`, as PackedMLP's member_hidden (packed_mlp.h:
  // zero padding stays zero, so member k is the network of its own width).
  TORCH_ARG(std::vector<int64_t>, member_hidden) = {};
  // Per-member convolution channels (members() lists of channels().size() counts, block
  // b's in [1, channels()[b]], or empty): members of different channel widths padded to
  // `channels`, the widest in each block. A narrower member's extra channels have zero
  // weights and biases, so they are zero after each convolution, ReLU passes no gradient
  // back through them (its derivative at 0 is 0) and nothing updates them; its head's
  // first layer reads only its leading Cout*H*W flattened features (channel-major). So
  // member k is the network of its own channels. Refused with GroupNorm: a group would
  // count a narrower member's zero channels in its statistics.
  TORCH_ARG(std::vector<std::vector<int64_t>>, member_channels) = {};
  TORCH_ARG(int64_t, depth) = 1;     // the head's hidden layers (0: flatten -> output)
  TORCH_ARG(double, dropout) = 0.0;  // after each hidden activation of the head, in training mode
  // Per-member rates (members() values, or empty: every member uses dropout), as
  // PackedMLPOptions::member_dropout.
  TORCH_ARG(std::vector<double>, member_dropout) = {};
  TORCH_ARG(uint64_t, seed) = 0;  // member i draws from member_seed(seed, first_member + i)
  TORCH_ARG(int64_t, first_member) = 0;
  TORCH_ARG(c10::ScalarType, dtype) = c10::ScalarType::Float;
  TORCH_ARG(c10::Device, device) = c10::Device(c10::DeviceType::CPU);

 public:
  // Throws packtrain::UserError naming the value: an input shape of another rank, a
  // non-positive size, an even kernel with "same" padding, a stride below 1 or a
  // padding below 0, more blocks than the image has room for (every spatial
  // dimension must be at least 2 after each convolution, before its pool), a group
  // count that does not divide a block's channels, a dropout rate outside [0, 1),
  // per-member channel lists of the wrong count or size, wider than the pack, or with
  // GroupNorm.
  void validate() const;
  bool has_dropout() const;                    // drops_units(dropout, member_dropout)
  int64_t member_width(int64_t member) const;  // member_hidden[member], or hidden
  // member_channels[member], or channels
  const std::vector<int64_t>& member_channel_counts(int64_t member) const;
  // Member k's own network as a one-member pack's options (its channels, head width and
  // dropout rate): what it equals, and the leading block of each parameter slot it fills.
  PackedCNNOptions member_options(int64_t member) const;
  int64_t in_features() const;   // I = prod(input_shape)
  int64_t spatial_dims() const;  // 2 for {C, H, W}, 1 for {C, L}
  int64_t conv_padding() const;  // padding, or kernel_size / 2 for kSamePadding
  // A convolution's output size along one dimension of size n: (n + 2p - k) / s + 1,
  // or 0 where the kernel does not fit the padded input (n + 2p < k).
  int64_t conv_output(int64_t n) const;
  int64_t flat_features() const;  // F: channels.back() times the pooled spatial sizes
  // Scalars one member has (convolutions and head), as a double for estimates.
  double parameters_per_member() const;
};

class PackedCNN : public PackedModel {
 public:
  explicit PackedCNN(PackedCNNOptions options);

  std::string_view kind() const override { return "cnn"; }
  const PackedCNNOptions& options() const { return options_; }
  PackedParameters& parameters() override { return parameters_; }
  const PackedParameters& parameters() const override { return parameters_; }

  // Dropout's masks, seed and data-parallel rows: PackedMLP's (packed_mlp.h), from
  // the mask source; dropout_noise(h) takes the head's (K, B, H) activations and is
  // undefined when no member drops units.
  at::Tensor dropout_noise(const at::Tensor& h) const;
  void seed_dropout(uint64_t seed) override;
  void dropout_rows(int64_t offset, int64_t rows) override;
  void reinitialize(uint64_t seed, const at::Tensor& which = {}) override;
  StandaloneMember standalone_member(int64_t member) const override;

 private:
  // x: (B, I) shared by all members, or (K, B, I) per member, I = C*H*W or C*L.
  at::Tensor forward_layers(const at::Tensor& x) const override;
  // Checks x's rank, width, K, dtype and device; throws naming both shapes.
  void check_input(const at::Tensor& x) const;
  // The convolution blocks, flattened to (K, B, F) in each member's (C, H, W) order.
  at::Tensor features(const at::Tensor& x) const;

  PackedCNNOptions options_;
  PackedParameters parameters_;
  std::vector<at::Tensor> conv_weights_;  // (K, Cout, Cin, k[, k]) each
  std::vector<at::Tensor> conv_biases_;   // (K, Cout) each
  std::vector<at::Tensor> norm_weights_;  // (K, Cout) each, with norm_groups
  std::vector<at::Tensor> norm_biases_;   // (K, Cout) each, with norm_groups
  std::vector<PackedLinear> head_;        // depth hidden layers, then the output layer
  std::unique_ptr<PackedMLP> masks_;      // dropout's mask source (depth 0), with dropout
};

// The standalone module member `member` of PackedCNN(options) equals: a
// torch::nn::Sequential built after seeding the default generator with
// member_seed(options.seed(), options.first_member() + member), then cast to
// options' dtype and device. (It reseeds the global generator: a test helper.)
StandaloneMember make_standalone_cnn(const PackedCNNOptions& options, int64_t member);

}  // namespace packtrain::ensemble
