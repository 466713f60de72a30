// A packed linear layer: K independent linear maps applied as one batched GEMM.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace packtrain::ensemble {

// How a pack of one member (K = 1) multiplies; K > 1 always runs one baddbmm.
//   kBatched:   the same baddbmm as K > 1. PackedMLP and ResidualMLP use it, so their
//               K = 1 results stay bit for bit what they were.
//   kPlainGemm: one addmm on (I, O) and (O) views of the weight and bias, the GEMM a
//               standalone model runs (PackedTransformer). Views, not select(0, 0): a
//               view's gradient is a reshape, a select's a zero-filled copy.
enum class PackOfOne { kBatched, kPlainGemm };

// Views of one layer's packed weights; the storage belongs to PackedParameters. The
// layer holds the parameters' own (K, ...) leaf tensors (not new views of them), so
// gradients accumulate into their .grad(), and in-place writes to the flat buffer
// (checkpoint loads, reinitialization) are what the layer computes with.
class PackedLinear {
 public:
  PackedLinear() = default;
  // An undefined bias: a linear map without one (Llama's projections).
  PackedLinear(at::Tensor weight, at::Tensor bias, PackOfOne pack_of_one = PackOfOne::kBatched);

  int64_t members() const { return weight_.size(0); }
  int64_t in_features() const { return weight_.size(1); }
  int64_t out_features() const { return weight_.size(2); }
  const at::Tensor& weight() const { return weight_; }
  const at::Tensor& bias() const { return bias_; }
  PackOfOne pack_of_one() const { return pack_of_one_; }

  // x: (B, I) shared by all members, or (K, B, I) one batch per member.
  // Returns (K, B, O) = bias + x @ weight: one baddbmm, or one addmm for a pack of
  // one with PackOfOne::kPlainGemm.
  at::Tensor forward(const at::Tensor& x) const;

  // residual (K, B, O) + forward(x), the residual connection of a block: the bias is
  // added to the residual and the GEMM accumulates into that fresh sum in place
  // (beta = 1), so neither a broadcast copy of the bias nor a separate add is made.
  // Throws naming both shapes when residual is not (K, B, O).
  at::Tensor forward_onto(const at::Tensor& residual, const at::Tensor& x) const;

  // Checks x's rank, width, K, dtype and device; throws naming both shapes.
  void check_input(const at::Tensor& x) const;

 private:
  // Whether this call runs the pack of one's plain GEMM.
  bool plain_gemm() const { return pack_of_one_ == PackOfOne::kPlainGemm && members() == 1; }
  // x as (K, B, I): a shared batch is broadcast over members with a stride-0 view, not copied.
  at::Tensor batched(const at::Tensor& x) const;

  at::Tensor weight_;  // (K, I, O)
  at::Tensor bias_;    // (K, 1, O)
  PackOfOne pack_of_one_ = PackOfOne::kBatched;
};

}  // namespace packtrain::ensemble
