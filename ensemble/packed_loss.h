// Packed losses: each returns a (K) vector, member k's mean loss over its batch.
// A step backpropagates their sum, so each member's gradient is exactly its own.
#pragma once

#include "packtrain/base/enum_names.h"

#include <ATen/core/Tensor.h>

#include <string_view>

namespace packtrain::ensemble {

enum class LossKind {
  kMSE,           // pred (K, B, O) against target (B, O) or (K, B, O)
  kGaussianNLL,   // pred (K, B, 2*O): mean and raw variance per output (gaussian_head)
  kCrossEntropy,  // logits (K, B, C) against class indices (B) or (K, B), int64
};

inline constexpr EnumNames<LossKind, 3> kLossKindNames{
    "loss",
    {{{LossKind::kMSE, "mse"}, {LossKind::kGaussianNLL, "gaussian-nll"}, {LossKind::kCrossEntropy, "cross-entropy"}}}};
inline std::string_view to_string(LossKind kind) { return kLossKindNames.name(kind); }
// Throws naming the value and the accepted names.
inline LossKind parse_loss_kind(std::string_view name) { return kLossKindNames.parse(name); }

// (K) per-member mean losses of `kind`.
at::Tensor packed_loss(LossKind kind, const at::Tensor& pred, const at::Tensor& target, double min_variance = 1e-6);

// pred (K, B, O); target (B, O) shared or (K, B, O) per member. Returns (K).
at::Tensor packed_mse_loss(const at::Tensor& pred, const at::Tensor& target);

// The deep-ensemble regression head: pred (K, B, 2*O) holds a mean and a raw
// variance per output; variance = softplus(raw) + min_variance.
struct GaussianPrediction {
  at::Tensor mean;      // (K, B, O)
  at::Tensor variance;  // (K, B, O)
};
GaussianPrediction gaussian_head(const at::Tensor& pred, double min_variance = 1e-6);

// Gaussian negative log-likelihood of target under gaussian_head(pred), including
// the 0.5*log(2*pi) constant, averaged over batch and outputs. Returns (K).
at::Tensor packed_gaussian_nll_loss(const at::Tensor& pred, const at::Tensor& target, double min_variance = 1e-6);

// logits (K, B, C); target class indices (B) shared or (K, B) per member, int64.
// Returns (K), the mean cross-entropy per member. With `class_weights` (C), each
// row's cross-entropy is scaled by its true class's weight, still divided by B (not
// by the weights' sum, so micro-batches' losses add up to the batch's).
at::Tensor packed_cross_entropy_loss(const at::Tensor& logits, const at::Tensor& target,
                                     const at::Tensor& class_weights = {});

}  // namespace packtrain::ensemble
