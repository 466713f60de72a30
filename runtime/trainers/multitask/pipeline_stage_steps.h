// PipelineStageSteps: one pipeline stage's work on a micro-batch as static steps
// over fixed buffers (graphs/captured_step.h): captured once per micro-batch shape
// as CUDA graphs on a GPU and replayed, run eagerly on the CPU — the same functions
// either way, so the CPU tests check what the GPU replays.
//
// A captured step may only write into tensors that exist before capture, so no
// autograd graph can wait between a stage's forward and its backward: the forward
// runs without autograd, and the backward recomputes it with autograd (one more
// forward of this stage's blocks; only the stage's input is kept per micro-batch in
// flight, not its activations). The last stage runs forward, losses and backward as
// one step. Gradients go into the parameters' flat gradients (accumulated over the
// micro-batches), the losses into per-member accumulators.
#pragma once

#include "packtrain/ensemble/multitask_step.h"
#include "packtrain/ensemble/packed_transformer.h"
#include "packtrain/graphs/captured_step.h"
#include "packtrain/graphs/graph_pool.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace packtrain::runtime {

// One micro-batch's share of the batch's multi-task loss, from the last stage's
// final hidden states: the classification loss x `classification_share` (its rows
// over the batch's) and the LM loss x its target tokens over `lm_total` (the whole
// batch's), per member (K), and their task-weighted sum over members — so that the
// micro-batches' gradients add up to the whole batch's. Both runs of a stage (with
// autograd kept, and as a static step) compute it here.
struct MicroBatchLoss {
  at::Tensor classification, language_model, total;
};
MicroBatchLoss micro_batch_loss(const ensemble::PackedTransformer& model, const at::Tensor& hidden,
                                const ensemble::TextBatch& micro, const at::Tensor& labels,
                                const at::Tensor& classification_share, const at::Tensor& lm_total,
                                const ensemble::TaskWeights& weights);

// A stage's backward: the gradients of `output` (for `grad_output`; a scalar loss
// when that is undefined) with respect to the stage's parameters, added into their
// flat gradients, and with respect to `input` when it is defined (a leaf that
// requires grad): returned, else undefined. Every backward of a stage runs here
// (kept autograd graph, static steps, layer timing).
at::Tensor stage_backward(ensemble::PackedTransformer& model, const at::Tensor& output, const at::Tensor& grad_output,
                          const at::Tensor& input);

class PipelineStageSteps {
 public:
  // `model` (this rank's stage) must outlive the steps.
  PipelineStageSteps(ensemble::PackedTransformer& model, ensemble::TaskWeights weights,
                     graphs::CaptureOptions capture = {});
  ~PipelineStageSteps();

  // Stages before the last. `input`: the micro-batch's tokens (rows, T) on the first
  // stage, the received activation (K, rows, T, d) on the others.
  // The stage's output activation (K, rows, T, d): a buffer, valid until the next
  // forward of this shape.
  const at::Tensor& forward(const at::Tensor& input);
  // Recomputes the forward of `input` with autograd, adds the parameters' gradients
  // for `grad_output` to the flat gradients, and returns the input activation's
  // gradient (a buffer, valid until the next backward of this shape; undefined on
  // the first stage).
  at::Tensor backward(const at::Tensor& input, const at::Tensor& grad_output);

  // The last stage: forward, losses and backward of one micro-batch. `input` as
  // above (unused when the stage is also the first: it reads `micro`'s tokens). The
  // loss is classification x `classification_share` (this micro-batch's rows over
  // the batch's) plus the LM loss x its target tokens over `lm_total` (the whole
  // batch's), each weighted by its task weight; its gradients are added to the flat
  // gradients, its per-member terms to the accumulators. Returns the input
  // activation's gradient (a buffer as above; undefined when the stage is also first).
  // `classification_share` and `lm_total`: one-element tensors of the parameters' dtype.
  at::Tensor last(const at::Tensor& input, const ensemble::TextBatch& micro, const at::Tensor& labels,
                  const at::Tensor& classification_share, const at::Tensor& lm_total);
  // The last stage's accumulated per-member losses (K each) since zero_losses().
  void zero_losses();
  const at::Tensor& classification_loss() const { return classification_; }
  const at::Tensor& lm_loss() const { return lm_; }

  // The steps made so far (one per kind and shape), and how many replay a graph.
  int64_t steps() const;
  int64_t captured() const;

 private:
  struct Shape;
  Shape& shape(int64_t rows, int64_t tokens);

  ensemble::PackedTransformer* model_;
  ensemble::TaskWeights weights_;
  graphs::CaptureOptions capture_;
  std::shared_ptr<graphs::GraphPool> pool_;
  at::Tensor classification_, lm_;                                        // (K) accumulators
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Shape>> shapes_;  // by (rows, tokens)
};

}  // namespace packtrain::runtime
