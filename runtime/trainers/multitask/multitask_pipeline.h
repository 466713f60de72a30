// MultiTaskPipeline: one multi-task training step of a PackedTransformer split by
// blocks over S ranks (pipeline model parallelism). This rank holds one stage
// (ensemble::TransformerStage: the first also the embeddings, the last the final
// norm and heads); every rank holds the whole batch's tokens, lengths and labels
// (the data is small next to the model), so only activations and their gradients
// travel: forward from stage s to s + 1, backward from s + 1 to s, point to point
// (Gloo on CPU, NCCL on a GPU).
//
// A batch of B rows runs as M micro-batches of B / M rows. On the CPU the schedule
// is 1F1B (PipeDream-flush: stage s runs S - s - 1 forwards ahead, then alternates
// one forward and one backward, so it keeps at most S - s micro-batches' activations);
// on a GPU it is GPipe (all forwards, then all backwards), the order in which NCCL's
// in-stream sends and receives pair up. Both give the same gradients: each
// micro-batch's loss is its share of the whole batch's loss (rows / B of the
// classification mean, its target tokens over the batch's for the LM), so the
// summed gradients are the one-process step's.
//
// Tied weights: with a tied LM head the first stage's token embedding and the last
// stage's copy get their gradients summed (one exchange between those two ranks)
// before the update, and the same Adam update keeps them identical.
//
// Pipeline x data parallel (runtime/distributed/pipeline_groups.h): with R replicas
// of the pipeline, replica r runs rows [r B / R, (r + 1) B / R) of every batch as
// its M micro-batches, each micro-batch's loss still its share of the whole batch's,
// and each stage's gradients are summed over its R replicas before the update: the
// step is the one-process step on the whole batch.
#pragma once

#include "packtrain/ensemble/multitask_step.h"
#include "packtrain/ensemble/optimizers/packed_optimizer.h"
#include "packtrain/ensemble/packed_transformer.h"
#include "packtrain/graphs/captured_step.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

namespace packtrain::runtime {

namespace distributed {
class ProcessGroup;
}

enum class PipelineSchedule { k1F1B, kGPipe };

class PipelineStageSteps;

// How a stage runs a micro-batch's forward and backward.
enum class StageExecution {
  // The forward keeps its autograd graph until the micro-batch's backward (eager).
  kAutograd,
  // Static steps (runtime/trainers/multitask/pipeline_stage_steps.h): captured as CUDA graphs
  // on a GPU, eager on the CPU; the backward recomputes the stage's forward.
  kStatic,
};

class MultiTaskPipeline {
 public:
  // `model` is this rank's stage (rank s of the group holds stage s; the group has
  // one rank per stage); `replicas`, when given, is this stage's group across the
  // pipeline's replicas (rank i in replica i). Model, optimizer and groups must
  // outlive the pipeline. Throws std::invalid_argument when the stage does not match
  // the rank.
  // `execution`: kStatic captures each stage's micro-batch steps on a GPU (the
  // trainer's choice there), `capture` says how (and where their log goes).
  MultiTaskPipeline(ensemble::PackedTransformer& model, ensemble::PackedOptimizer& optimizer,
                    distributed::ProcessGroup& group, int64_t micro_batches, ensemble::TaskWeights weights,
                    distributed::ProcessGroup* replicas = nullptr, StageExecution execution = StageExecution::kAutograd,
                    graphs::CaptureOptions capture = {});
  ~MultiTaskPipeline();

  int64_t stages() const { return stages_; }
  int64_t stage() const { return stage_; }
  int64_t replicas() const { return replica_count_; }
  int64_t micro_batches() const { return micro_batches_; }
  PipelineSchedule schedule() const { return schedule_; }
  StageExecution execution() const { return steps_ != nullptr ? StageExecution::kStatic : StageExecution::kAutograd; }
  // kStatic: the stage's static steps made so far, and how many replay a CUDA graph.
  int64_t static_steps() const;
  int64_t captured_steps() const;

  // One training step on the batch (every rank passes the same one; B divisible by
  // R x M): gradients of this stage, the tied embedding's summed, with replicas
  // summed over them, one optimizer update. `step` names the step in errors.
  // Returns the whole batch's per-member losses (K) on the last stage
  // (classification mean, LM mean per target token); undefined tensors on the
  // others.
  ensemble::MultiTaskLosses train_step(const ensemble::TextBatch& batch, const at::Tensor& labels, int64_t step);

  // Forward only, no gradients: the final hidden states (K, B, T, d) on the last
  // stage, an undefined tensor on the others.
  at::Tensor forward(const at::Tensor& tokens, int64_t step = -1);

  // Micro-batches whose activations one step kept at most at once on this stage
  // (1F1B: min(M, S - s); GPipe: M), as measured in the last train_step.
  int64_t peak_micro_batches_in_flight() const { return peak_in_flight_; }

 private:
  struct InFlight;   // a micro-batch whose activations this stage holds
  struct StepState;  // one train_step's shares, losses and micro-batches in flight
  // train_step's phases, in order: the batch's shares and zeroed gradients; the
  // schedule's forwards and backwards; the replicas' sum; the tied embedding's.
  StepState start_step(const ensemble::TextBatch& batch, const at::Tensor& labels, int64_t step);
  void run_micro_batches(StepState& state);
  void forward_micro_batch(StepState& state, int64_t i);
  InFlight forward_static(StepState& state, int64_t row, const ensemble::TextBatch& micro);
  InFlight forward_autograd(StepState& state, int64_t row, const ensemble::TextBatch& micro);
  void backward_micro_batch(StepState& state);
  void backward_static(const InFlight& f, int64_t step);
  void sum_over_replicas(ensemble::MultiTaskLosses& losses, int64_t step);
  void exchange_tied_gradient(int64_t step);
  at::Tensor receive_activation(int64_t rows, int64_t tokens, int64_t step);

  ensemble::PackedTransformer* model_;
  ensemble::PackedOptimizer* optimizer_;
  distributed::ProcessGroup* group_;
  distributed::ProcessGroup* replicas_;
  int64_t stages_ = 1, stage_ = 0, replica_count_ = 1, replica_ = 0, micro_batches_ = 1;
  ensemble::TaskWeights weights_;
  PipelineSchedule schedule_ = PipelineSchedule::k1F1B;
  std::unique_ptr<PipelineStageSteps> steps_;  // kStatic only
  int64_t peak_in_flight_ = 0;
  // What each transfer is called in an error ("activations from stage 0 to stage 1
  // at step 12 failed on rank 1 of 2 …"), formatted once.
  std::string activation_in_, activation_out_, gradient_in_, gradient_out_, tied_in_, tied_out_;
};

}  // namespace packtrain::runtime
