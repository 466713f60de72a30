// The multi-task step of a PackedTransformer as plain functions over tensors (what
// graphs/ captures): the trunk runs once per distinct input, the classification
// head and the causal-LM head both read its output, and the weighted sum of the
// task losses is backpropagated once — one forward, one backward, no second pass
// through the shared trunk (and so no "marked ready twice" under data parallelism).
#pragma once

#include "packtrain/ensemble/optimizers/packed_optimizer.h"
#include "packtrain/ensemble/packed_step.h"
#include "packtrain/ensemble/packed_transformer.h"

#include <ATen/core/Tensor.h>

namespace packtrain::ensemble {

// Right-padded token rows and their real lengths (>= 2: at least BOS and EOS).
struct TextBatch {
  at::Tensor tokens;   // (B, T) int64
  at::Tensor lengths;  // (B) int64
};

struct TaskWeights {
  double classification = 1.0;
  double language_model = 1.0;
  // (C) on the model's device: each row's classification loss scaled by its class's
  // weight (e.g. N / (C n_c), class-balanced); undefined: all 1. Read in place, so
  // a captured step sees later changes to it.
  at::Tensor class_weights = {};
};

// Per-member (K) losses of each task.
struct MultiTaskLosses {
  at::Tensor classification;  // mean cross-entropy over the rows
  at::Tensor language_model;  // mean next-token cross-entropy over the real tokens
};

// Next-token cross-entropy: logits (K, B, T, V) at position t predict token t+1;
// positions past a row's last real token are ignored. Returns (K), the mean over
// the batch's real target tokens.
at::Tensor packed_lm_loss(const at::Tensor& logits, const TextBatch& batch);

// Number of target tokens packed_lm_loss averages over: sum of (lengths - 1).
at::Tensor lm_target_count(const TextBatch& batch);

// Both tasks' losses. The trunk runs once when the two tasks read the same batch
// (the same tokens tensor), twice when they read different texts.
MultiTaskLosses multitask_losses(const PackedTransformer& model, const TextBatch& classification,
                                 const at::Tensor& labels, const TextBatch& language_model,
                                 const at::Tensor& class_weights = {});

// One training step: gradients zeroed in place, multitask_losses, one backward of
// sum over members of (w_c * classification + w_lm * language_model), one optimizer
// update (`after_backward`, when set, runs between the two: a data-parallel run
// averages the flat gradients there). Returns the detached losses.
MultiTaskLosses multitask_train_step(PackedTransformer& model, PackedOptimizer& optimizer,
                                     const TextBatch& classification, const at::Tensor& labels,
                                     const TextBatch& language_model, const TaskWeights& weights,
                                     const GradientHook& after_backward = {});

}  // namespace packtrain::ensemble
