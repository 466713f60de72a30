// A packed linear layer: K independent linear maps applied as one batched GEMM.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace packtrain::ensemble {

// Views of one layer's packed weights; the storage belongs to PackedParameters.
class PackedLinear {
 public:
  PackedLinear() = default;
  PackedLinear(at::Tensor weight, at::Tensor bias);

  int64_t members() const { return weight_.size(0); }
  int64_t in_features() const { return weight_.size(1); }
  int64_t out_features() const { return weight_.size(2); }
  const at::Tensor& weight() const { return weight_; }
  const at::Tensor& bias() const { return bias_; }

  // x: (B, I) shared by all members, or (K, B, I) one batch per member.
  // Returns (K, B, O) = bias + x @ weight, one baddbmm.
  at::Tensor forward(const at::Tensor& x) const;

  // Checks x's rank, width, K, dtype and device; throws naming both shapes.
  void check_input(const at::Tensor& x) const;

 private:
  at::Tensor weight_;  // (K, I, O)
  at::Tensor bias_;    // (K, 1, O)
};

}  // namespace packtrain::ensemble
