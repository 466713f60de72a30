// PackedMLP: K multilayer perceptrons of one shape, trained as one model.
//
// Member i equals, bit for bit at initialization, the standalone
// torch::nn::Sequential that make_standalone_mlp(options, i) builds (ensemble/pack.h):
// Linear -> [LayerNorm] -> activation -> [Dropout], `depth` times, then Linear.
//
// Members of different widths (member_hidden): the pack is as wide as its widest
// member and a narrower member's units beyond its width are zero — their weights in
// and out and their biases. Zero stays zero through training with no mask: such a
// unit's pre-activation is 0, so its output is act(0) = 0 for every activation here
// (relu, gelu, silu, tanh), its outgoing weights (zero) pass no gradient back to it,
// and its incoming weights see no gradient; AdamW, SGD and weight decay leave a zero
// with a zero gradient at zero. So member k computes, and trains, exactly what the
// standalone network of its own width does (LayerNorm would count the padded units
// in its statistics: it is refused with mixed widths).
#pragma once

#include "packtrain/base/enum_names.h"

#include "packtrain/ensemble/packed_linear.h"
#include "packtrain/ensemble/packed_model.h"
#include "packtrain/ensemble/packed_parameters.h"

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <torch/arg.h>

#include <cstdint>
#include <string_view>
#include <vector>

namespace packtrain::ensemble {

enum class Activation { kReLU, kGELU, kSiLU, kTanh };

inline constexpr EnumNames<Activation, 4> kActivationNames{"activation",
                                                           {{{Activation::kReLU, "relu"},
                                                             {Activation::kGELU, "gelu"},
                                                             {Activation::kSiLU, "silu"},
                                                             {Activation::kTanh, "tanh"}}}};
inline std::string_view to_string(Activation activation) { return kActivationNames.name(activation); }
// Throws naming the value and the accepted names.
inline Activation parse_activation(std::string_view name) { return kActivationNames.parse(name); }

struct PackedMLPOptions {
  /// Example: PackedMLPOptions(8, 1).members(64).hidden(64).depth(2).activation(Activation::kGELU)
  PackedMLPOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}

  TORCH_ARG(int64_t, in_features);   // I
  TORCH_ARG(int64_t, out_features);  // O
  TORCH_ARG(int64_t, members) = 8;   // K
  TORCH_ARG(int64_t, hidden) = 64;   // H, width of every hidden layer (the widest member's)
  // Per-member widths (members() values in [1, hidden], or empty: every member is
  // `hidden` wide): a sweep over widths trains in one pack, padded to `hidden`.
  TORCH_ARG(std::vector<int64_t>, member_hidden) = {};
  TORCH_ARG(int64_t, depth) = 2;  // number of hidden layers (0: one linear map)
  TORCH_ARG(Activation, activation) = Activation::kReLU;
  TORCH_ARG(bool, layer_norm) = false;  // LayerNorm after each hidden Linear
  TORCH_ARG(double, dropout) = 0.0;     // after each hidden activation, in training mode
  // Per-member dropout rates (members() values, or empty: every member uses dropout):
  // a sweep over the rate trains in one pack, the rates a (K, 1, 1) device tensor.
  TORCH_ARG(std::vector<double>, member_dropout) = {};
  TORCH_ARG(uint64_t, seed) = 0;  // member i draws from member_seed(seed, first_member + i)
  // The global index of member 0: a shard of a bigger ensemble (member parallel)
  // holds members first_member .. first_member + K - 1 of it, initialized as there.
  TORCH_ARG(int64_t, first_member) = 0;
  TORCH_ARG(c10::ScalarType, dtype) = c10::ScalarType::Float;
  TORCH_ARG(c10::Device, device) = c10::Device(c10::DeviceType::CPU);

 public:
  // Throws naming the offending field and value.
  void validate() const;
  // Whether any member drops units in training: drops_units(dropout, member_dropout).
  bool has_dropout() const;
  // Member k's hidden width: member_hidden()[k], or hidden() without per-member widths.
  int64_t member_width(int64_t member) const;
  // Member k's own options: a pack of one member of its width (what it equals).
  PackedMLPOptions member_options(int64_t member) const;
};

// Whether training drops units: a per-member rate above 0, or, without per-member
// rates, `dropout` above 0 (per-member rates replace the one rate).
bool drops_units(double dropout, const std::vector<double>& member_dropout);

class PackedMLP : public PackedModel {
 public:
  explicit PackedMLP(PackedMLPOptions options);

  std::string_view kind() const override { return "mlp"; }
  const PackedMLPOptions& options() const { return options_; }
  PackedParameters& parameters() override { return parameters_; }
  const PackedParameters& parameters() const override { return parameters_; }
  const std::vector<PackedLinear>& linears() const { return linears_; }

  // The multiplier training applies to a hidden activation h (K, B, H): 0 where a
  // unit is dropped, 1 / keep where it is kept; undefined when no member drops
  // units. Each call is one draw: the draw count advances, so a step that draws its
  // masks here, layer by layer, drops the units forward would.
  //
  // Counter-based (dropout_mask_math.h): whether member m keeps unit j of row r is a
  // function of the seed, the draw count, m's index in the whole ensemble
  // (first_member + k) and r's index in the whole batch (see dropout_rows) — so what
  // member m drops does not depend on which pack it trains in (a sweep's
  // configuration, a member-parallel shard), on the process, the threads or the
  // device: a CUDA pack draws the CPU's masks bit for bit, and the draw count lives
  // in a device tensor that a captured step's replays advance.
  at::Tensor dropout_noise(const at::Tensor& h) const;

  // Sets the masks' seed and restarts the draw count. Seeded from options.seed() at
  // construction; the trainer reseeds every epoch, so a resumed run drops what an
  // uninterrupted one would. Safe between replays of a captured step (it writes the
  // state tensor in place).
  void seed_dropout(uint64_t seed) override;
  // Data parallel: this rank's batch is rows [offset, offset + B) of a global batch
  // of `rows`; its masks are those rows' masks, so the ranks together drop what one
  // process would.
  void dropout_rows(int64_t offset, int64_t rows) override;

  // Re-initializes members in place from `seed` (member i from member_seed(seed, i)),
  // all members, or those where `which` (K, bool) is true. No tensor is reallocated,
  // so captured graphs stay valid. Afterwards the model equals a fresh pack with
  // that seed on the re-initialized members.
  void reinitialize(uint64_t seed, const at::Tensor& which = {}) override;

  // Member `member` as a standalone torch::nn::Sequential (pack.h's unpack).
  StandaloneMember standalone_member(int64_t member) const override;

  // The fused CPU step (cpu_fused_step.h) where it applies to this batch.
  std::optional<at::Tensor> fused_gradients(const at::Tensor& x, const at::Tensor& y, LossKind kind,
                                            double min_variance) override;

 private:
  at::Tensor forward_layers(const at::Tensor& x) const override;
  // Member i's initial parameters as one row of P scalars (CPU, float32 draws cast
  // to the model dtype), drawn exactly as torch::nn::Linear's reset_parameters does.
  at::Tensor initial_member_row(uint64_t seed, int64_t member) const;

  PackedMLPOptions options_;
  PackedParameters parameters_;
  std::vector<PackedLinear> linears_;     // depth + 1 layers
  std::vector<at::Tensor> norm_weights_;  // (K, 1, H) each, when layer_norm
  std::vector<at::Tensor> norm_biases_;   // (K, 1, H) each, when layer_norm
  bool drops_units_ = false;              // options_.has_dropout(), decided once
  std::vector<double> keep_rates_;        // member k keeps a unit with probability keep_rates_[k]
  at::Tensor keep_;                       // (K) float64 keep_rates_ on the pack's device, with dropout
  at::Tensor dropout_state_;              // (2) int64 {seed, draw count} on the pack's device, with dropout
  int64_t dropout_row_offset_ = 0, dropout_rows_ = 0;  // data parallel (0 rows: the batch is all of them)
};

}  // namespace packtrain::ensemble
