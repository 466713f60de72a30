// Recalibrating a regression ensemble's spread after training: one scale s, fitted
// on validation rows, by which the predictive distribution is stretched about its
// mean — every member's mean moved to mean + sqrt(s) (mean_k - mean), its variance
// times s — so each row's mixture keeps its shape and mean, its variance becomes s
// times its own (σ-scaling: Laves et al., 2020; Kuleshov et al., 2018 motivate
// recalibrating on held-out rows). Deep-ensemble members trained to their best
// validation epoch are often over- or under-confident as a whole (the UCI protocol:
// 90% intervals covering 86% of boston's test rows, 100% of yacht's); one number
// fitted on rows training never used corrects the scale without touching the mean.
#pragma once

#include <ATen/core/Tensor.h>

namespace packtrain::runtime {

struct EnsemblePrediction;  // runtime/trainers/ensemble/ensemble_predictions.h

// The s minimizing the moment-matched Gaussian's NLL of y (N) under a combined
// regression prediction scaled by s: in closed form, the mean over the rows of
// (y - mean)² / variance. NaN when it is not a positive finite number (no rows, a
// row of zero variance with an error, non-finite inputs): the caller keeps 1.
double fit_variance_scale(const EnsemblePrediction& p, const at::Tensor& y);

// p (combined) with its mixture stretched about its mean by sqrt(scale): member
// means and variances, the mixture's variance and spread; the mean unchanged (up to
// rounding: it is recomputed from the stretched members).
EnsemblePrediction scale_variance(EnsemblePrediction p, double scale);

}  // namespace packtrain::runtime
