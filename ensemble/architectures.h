// The member architectures a trainer can pack, by name: the one registration a new
// architecture needs is its row in architectures.cpp's table (its PackedModel, its
// standalone module and its row of the contract test's table live in its own files).
// The trainer's `architecture` option (runtime's EnsembleTrainerOptions, and so
// `train --architecture`, the Python estimators and checkpoints) names one of them.
#pragma once

#include "packtrain/ensemble/packed_cnn.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_model.h"

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace packtrain::ensemble {

// What a trainer asks of a pack, whatever its architecture: the shape, the hidden
// width and depth (an MLP's hidden layers; a residual MLP's blocks; a CNN's head), the
// MLP's activation, LayerNorm and dropout, a CNN's sample shape and convolutions, and
// where member i draws from.
struct PackSpec {
  int64_t in_features = 1, out_features = 1;
  int64_t members = 1, hidden = 64, depth = 2;
  // Per-member hidden widths (mixed widths, padded to `hidden`, the widest; mlp, cnn head):
  // empty, or one width per member.
  std::vector<int64_t> member_hidden;
  Activation activation = Activation::kReLU;
  bool layer_norm = false;
  double dropout = 0.0;
  std::vector<double> member_dropout;  // empty, or one rate per member
  // Convolutional members (cnn): the sample shape each row of I values holds, {C, H, W}
  // (images) or {C, L} (sequences), empty when the data has none (the cnn refuses it);
  // each convolution block's output channels and the kernel size (empty, 0: the
  // architecture's defaults, PackedCNNOptions), its stride and padding, the pooling, and the group count of
  // the GroupNorm after each convolution (0: none).
  std::vector<int64_t> input_shape;
  std::vector<int64_t> channels;
  // Per-member channel lists (cnn; PackedCNNOptions::member_channels): empty, or one list
  // per member, padded to `channels`, the widest in each block.
  std::vector<std::vector<int64_t>> member_channels;
  int64_t kernel_size = 0;
  int64_t stride = 1;
  int64_t padding = kSamePadding;  // each convolution's zero padding (kSamePadding: kernel / 2)
  Pool pool = Pool::kMax;
  int64_t norm_groups = 0;
  uint64_t seed = 0;
  int64_t first_member = 0;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  c10::ScalarType dtype = c10::ScalarType::Float;
};

struct Architecture {
  std::string_view name;         // "mlp"
  std::string_view description;  // one line, for --help and the docs
  // The pack; a spec the architecture cannot build (a residual MLP with dropout) is a
  // packtrain::UserError naming what it lacks.
  std::function<std::unique_ptr<PackedModel>(const PackSpec&)> make;
  // Parameters per member (a double: memory estimates of absurd sizes stay finite).
  std::function<double(const PackSpec&)> parameters_per_member;
};

// Every registered architecture, "mlp" first (the default).
const std::vector<Architecture>& architectures();
std::vector<std::string> architecture_names();
// The one named; a UserError naming the registered ones otherwise.
const Architecture& architecture(std::string_view name);

}  // namespace packtrain::ensemble
