// A regression ensemble's predictive distribution, per row: the uniform mixture of
// its included members' Gaussians N(mean_k, variance_k) (a mean head: of point
// masses at the member means), in original units. Its uncertainty split into the
// members' own predicted noise (aleatoric) and their disagreement (epistemic), its
// CDF, density, quantiles and central intervals — from the mixture itself, not the
// moment-matched Gaussian — and its CRPS. A classifier's: the mixture of its members'
// categorical distributions, its entropy split the same way. All float64 (N) or
// (N, P) tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace packtrain::runtime {

struct EnsemblePrediction;  // runtime/trainers/ensemble/ensemble_predictions.h

// total² = aleatoric² + epistemic²: the mixture's variance is the members' mean
// variance (the noise they predict; 0 for a mean head) plus the variance of their
// means (how far they disagree).
struct UncertaintyDecomposition {
  at::Tensor mean;           // (N)
  at::Tensor total_std;      // (N)
  at::Tensor aleatoric_std;  // (N)
  at::Tensor epistemic_std;  // (N)
};
UncertaintyDecomposition decompose_uncertainty(const EnsemblePrediction& p);

// P(Y <= y_n) under row n's mixture (N).
at::Tensor mixture_cdf(const EnsemblePrediction& p, const at::Tensor& y);
// log density of y_n under row n's mixture (N); a mean head has none (throws).
at::Tensor mixture_log_density(const EnsemblePrediction& p, const at::Tensor& y);
// The mixture's quantiles (N, P) at probabilities in (0, 1): the smallest x with
// CDF(x) >= q, found by bisection to float64 resolution (for point masses: the
// member mean where the CDF crosses q).
at::Tensor mixture_quantiles(const EnsemblePrediction& p, const std::vector<double>& probabilities);

// The central interval holding `level` of the mixture's mass: its (1 - level) / 2
// and (1 + level) / 2 quantiles.
struct PredictionInterval {
  double level;
  at::Tensor lower, upper;  // (N)
};
std::vector<PredictionInterval> central_intervals(const EnsemblePrediction& p, const std::vector<double>& levels);

// The continuous ranked probability score of y_n under row n's mixture (N), in
// closed form for a Gaussian mixture: E|X - y| - E|X - X'| / 2 (Grimit et al., 2006).
at::Tensor mixture_crps(const EnsemblePrediction& p, const at::Tensor& y);

// Classification, in nats: entropy = aleatoric + mutual information, the entropy of
// the mixture's class probabilities split into the members' mean entropy (what each
// member is unsure of) and the mutual information between the label and the member
// (their disagreement: BALD's score).
struct ClassUncertaintyDecomposition {
  at::Tensor entropy;             // (N) H[mean_k p_k]
  at::Tensor aleatoric;           // (N) mean_k H[p_k]
  at::Tensor mutual_information;  // (N) the difference, >= 0
};
ClassUncertaintyDecomposition decompose_class_uncertainty(const EnsemblePrediction& p);

}  // namespace packtrain::runtime
