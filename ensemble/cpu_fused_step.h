// The packed MLP's forward, loss and backward on CPU, one member at a time, with
// hand-derived gradients: what packed_train_step runs on CPU instead of autograd.
//
// Why: an eager autograd step dispatches ~100 ATen ops whatever K is (~1 us each:
// most of a small ensemble's step), and at large K every op streams (K, B, H)
// activations through memory several times. Here each member's forward and backward
// run back to back while its activations (B x H) sit in cache, its GEMMs go straight
// to BLAS, and members are spread over threads: one call per step, no autograd graph.
// It writes exactly the gradients autograd would (up to float rounding; the tests
// compare the two) into the pack's flat gradient buffer; the optimizer is unchanged.
//
// Handles: float32/float64 CPU tensors, any depth and activation, MSE, Gaussian NLL
// and cross-entropy, shared (B, I) or per-member (K, B, I) inputs and targets, and
// dropout (one rate or per-member rates: the masks are drawn as forward draws them,
// so the same generator state drops the same units).
// bf16-mixed precision (float32 packs): torch.autocast's rounding points
// (ensemble/precision.h) applied here, so the fused step computes what autograd
// under autocast computes, up to summation order. The GEMMs stay float32 (sgemm of
// bfloat16-rounded operands: exact products, float32 sums), which is how fast
// bfloat16 runs on a CPU without bfloat16 matrix units (cpu_has_bf16_matrix_units).
// Not handled (packed_train_step keeps autograd): layer norm, any other device or
// dtype, and inputs autograd would reject (it then reports them).
#pragma once

#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_step.h"

#include <ATen/core/Tensor.h>

namespace packtrain::ensemble {

// Whether cpu_fused_gradients handles this model and batch.
bool cpu_fused_step_applies(const PackedMLP& model, const at::Tensor& x, const at::Tensor& y, LossKind kind);

// Overwrites every parameter's gradient with the gradient of its member's mean loss
// over (x, y), and returns the (K) per-member losses (the model's dtype). Requires
// cpu_fused_step_applies(model, x, y, kind).
at::Tensor cpu_fused_gradients(PackedMLP& model, const at::Tensor& x, const at::Tensor& y, LossKind kind,
                               double min_variance = 1e-6);

}  // namespace packtrain::ensemble
