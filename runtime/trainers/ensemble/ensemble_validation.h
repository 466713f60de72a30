// The validation loss of an ensemble as a whole: some members of a pack (a sweep's
// configuration, or every member: sweep_configurations in hyperparameter_sweep.h)
// as one uniform mixture. Early stopping on it
// (EarlyStopping::kEnsemble) keeps training while the mixture still improves, even
// after its members, each over-confident alone, got worse on their own losses.
#pragma once

#include "packtrain/runtime/trainers/ensemble/ensemble_trainer_options.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace packtrain::runtime {

// The mixture's mean loss over the rows, in the training loss's (standardized)
// units, of `members` of raw packed outputs (K, N, O): Gaussian head: the mixture's
// NLL; mean head: the MSE of the members' mean; classification: the NLL of the mean
// class probabilities. y: standardized targets (N, 1), or class indices (N).
double ensemble_validation_loss(const at::Tensor& raw, const at::Tensor& y, Head head, double min_variance,
                                const std::vector<int64_t>& members);

}  // namespace packtrain::runtime
