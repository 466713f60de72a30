#include "packtrain/runtime/trainers/multitask/multitask_pipeline.h"

#include "packtrain/profiling/nvtx.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/trainers/multitask/pipeline_stage_steps.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <vector>

namespace packtrain::runtime {

namespace {
// Message streams between neighbouring stages (and the tied embedding's two ranks).
constexpr int kActivationTag = 1, kGradientTag = 2, kTiedTag = 3;

// Where the token embedding's gradient block lives in the flat gradients.
at::Tensor tied_gradient(ensemble::PackedParameters& parameters) {
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (parameters.spec(i).name == "tok_emb.weight") return parameters.blocks(parameters.flat_grad())[i];
  }
  return {};
}
}  // namespace

MultiTaskPipeline::MultiTaskPipeline(ensemble::PackedTransformer& model, ensemble::PackedOptimizer& optimizer,
                                     distributed::ProcessGroup& group, int64_t micro_batches,
                                     ensemble::TaskWeights weights, distributed::ProcessGroup* replicas,
                                     StageExecution execution, graphs::CaptureOptions capture)
    : model_(&model),
      optimizer_(&optimizer),
      group_(&group),
      replicas_(replicas),
      stages_(group.world_size()),
      stage_(group.rank()),
      replica_count_(replicas != nullptr ? replicas->world_size() : 1),
      replica_(replicas != nullptr ? replicas->rank() : 0),
      micro_batches_(micro_batches),
      weights_(weights) {
  if (micro_batches < 1)
    throw std::invalid_argument(fmt::format("pipeline: micro-batches must be >= 1, got {}", micro_batches));
  if (&optimizer.parameters() != &model.parameters()) {
    throw std::invalid_argument("pipeline: the optimizer does not hold this stage's parameters");
  }
  if ((stage_ == 0) != model.first_stage() || (stage_ == stages_ - 1) != model.last_stage()) {
    throw std::invalid_argument(
        fmt::format("pipeline: rank {} of {} holds blocks {}-{} of {}: the first rank must "
                    "hold the first block and the last rank the last",
                    stage_, stages_, model.stage().first_layer, model.stage().end_layer - 1, model.options().layers()));
  }
  // NCCL's sends and receives wait in the stream for their peer: the GPipe order
  // pairs them up; 1F1B would need them grouped.
  schedule_ = model.parameters().flat().is_cuda() ? PipelineSchedule::kGPipe : PipelineSchedule::k1F1B;
  const int64_t s = stage_, tied_peer = stage_ == 0 ? stages_ - 1 : 0;
  activation_in_ = fmt::format("activations from stage {} to stage {}", s - 1, s);
  activation_out_ = fmt::format("activations from stage {} to stage {}", s, s + 1);
  gradient_in_ = fmt::format("activation gradients from stage {} to stage {}", s + 1, s);
  gradient_out_ = fmt::format("activation gradients from stage {} to stage {}", s, s - 1);
  tied_in_ = fmt::format("tied embedding gradient from stage {} to stage {}", tied_peer, s);
  tied_out_ = fmt::format("tied embedding gradient from stage {} to stage {}", s, tied_peer);
  if (execution == StageExecution::kStatic) {
    steps_ = std::make_unique<PipelineStageSteps>(model, weights_, std::move(capture));
  }
}

MultiTaskPipeline::~MultiTaskPipeline() = default;

int64_t MultiTaskPipeline::static_steps() const { return steps_ != nullptr ? steps_->steps() : 0; }
int64_t MultiTaskPipeline::captured_steps() const { return steps_ != nullptr ? steps_->captured() : 0; }

at::Tensor MultiTaskPipeline::receive_activation(int64_t rows, int64_t tokens, int64_t step) {
  const int64_t K = model_->members(), d = model_->options().width();
  at::Tensor x = at::empty({K, rows, tokens, d}, model_->parameters().flat().options());
  group_->recv_(x, stage_ - 1, kActivationTag, activation_in_.c_str(), step);
  return x;
}

at::Tensor MultiTaskPipeline::forward(const at::Tensor& tokens, int64_t step) {
  PACKTRAIN_NVTX_RANGE("pipeline forward");
  at::NoGradGuard no_grad;
  const at::Tensor x =
      model_->first_stage() ? model_->embed(tokens) : receive_activation(tokens.size(0), tokens.size(1), step);
  at::Tensor y = model_->run_blocks(x);
  if (!model_->last_stage()) {
    group_->send(y, stage_ + 1, kActivationTag, activation_out_.c_str(), step);
    group_->wait_sends();
    return {};
  }
  return model_->final_norm(y);
}

// A micro-batch whose activations this stage holds until its backward.
struct MultiTaskPipeline::InFlight {
  at::Tensor input;       // received activation (autograd: a leaf that requires grad; static steps: the
                          // micro-batch's tokens on stage 0); undefined on stage 0 otherwise
  at::Tensor output;      // sent activation, or the micro-batch's loss on the last stage (autograd)
  at::Tensor input_grad;  // static steps, last stage: the input's gradient, sent at the backward
};

// One train_step: this replica's micro-batch i is rows first + i * rows of the batch.
struct MultiTaskPipeline::StepState {
  StepState(const ensemble::TextBatch& batch, const at::Tensor& labels) : batch(batch), labels(labels) {}
  const ensemble::TextBatch& batch;
  const at::Tensor& labels;
  int64_t step = 0, rows = 0, first = 0, tokens = 0;
  // The whole batch's LM target tokens (all replicas'): each micro-batch's LM sum is
  // divided by it (kept on the device: no host synchronization inside the step).
  at::Tensor lm_targets;
  // Each micro-batch's share of the batch's classification mean (rows / B).
  at::Tensor classification_share;
  ensemble::MultiTaskLosses losses;  // (K) per task on the last stage, summed over the micro-batches
  std::deque<InFlight> in_flight;
  int64_t peak = 0;
};

namespace {
// Static steps: a send must not read a step's output buffer after the next step of
// its shape rewrote it. NCCL reads it in stream order, before that step; a Gloo send
// runs in the background, so it gets a copy.
at::Tensor sendable(const at::Tensor& buffer) { return buffer.is_cuda() ? buffer : buffer.clone(); }
}  // namespace

ensemble::MultiTaskLosses MultiTaskPipeline::train_step(const ensemble::TextBatch& batch, const at::Tensor& labels,
                                                        int64_t step) {
  PACKTRAIN_NVTX_RANGE("pipeline step");
  StepState state = start_step(batch, labels, step);
  run_micro_batches(state);
  if (replicas_ != nullptr) sum_over_replicas(state.losses, step);
  if (model_->options().tie_lm_head() && stages_ > 1 && (model_->first_stage() || model_->last_stage())) {
    exchange_tied_gradient(step);
  }
  {
    PACKTRAIN_NVTX_RANGE("optimizer");
    optimizer_->step();
  }
  return state.losses;
}

MultiTaskPipeline::StepState MultiTaskPipeline::start_step(const ensemble::TextBatch& batch, const at::Tensor& labels,
                                                           int64_t step) {
  const int64_t B = batch.tokens.size(0), M = micro_batches_, R = replica_count_;
  TORCH_CHECK(B % (R * M) == 0, "pipeline: a batch of ", B, " rows does not split into ", R, " replica(s) x ", M,
              " equal micro-batches");
  StepState state(batch, labels);
  state.step = step;
  state.rows = B / (R * M);
  state.first = replica_ * (B / R);
  state.tokens = batch.tokens.size(1);
  ensemble::PackedParameters& parameters = model_->parameters();
  parameters.zero_grad();
  state.lm_targets = ensemble::lm_target_count(batch).to(parameters.flat().scalar_type());
  if (model_->last_stage()) {
    state.losses.classification = at::zeros({model_->members()}, parameters.flat().options());
    state.losses.language_model = at::zeros_like(state.losses.classification);
  }
  state.classification_share =
      at::full({1}, static_cast<double>(state.rows) / static_cast<double>(B), parameters.flat().options());
  if (steps_ != nullptr && model_->last_stage()) steps_->zero_losses();
  return state;
}

void MultiTaskPipeline::run_micro_batches(StepState& state) {
  const int64_t M = micro_batches_;
  const int64_t ahead = schedule_ == PipelineSchedule::kGPipe ? M : std::min(M, stages_ - stage_ - 1);
  for (int64_t i = 0; i < ahead; ++i) forward_micro_batch(state, i);
  for (int64_t i = ahead; i < M; ++i) {
    forward_micro_batch(state, i);
    backward_micro_batch(state);
  }
  while (!state.in_flight.empty()) backward_micro_batch(state);
  group_->wait_sends();
  peak_in_flight_ = state.peak;
  if (steps_ != nullptr && model_->last_stage()) {
    state.losses.classification.copy_(steps_->classification_loss());
    state.losses.language_model.copy_(steps_->lm_loss());
  }
}

void MultiTaskPipeline::forward_micro_batch(StepState& state, int64_t i) {
  PACKTRAIN_NVTX_RANGE("forward");
  const int64_t row = state.first + i * state.rows;
  const ensemble::TextBatch micro{state.batch.tokens.narrow(0, row, state.rows),
                                  state.batch.lengths.narrow(0, row, state.rows)};
  state.in_flight.push_back(steps_ != nullptr ? forward_static(state, row, micro)
                                              : forward_autograd(state, row, micro));
  state.peak = std::max<int64_t>(state.peak, static_cast<int64_t>(state.in_flight.size()));
}

MultiTaskPipeline::InFlight MultiTaskPipeline::forward_static(StepState& state, int64_t row,
                                                              const ensemble::TextBatch& micro) {
  InFlight f;
  f.input = model_->first_stage() ? micro.tokens : receive_activation(state.rows, state.tokens, state.step);
  if (!model_->last_stage()) {
    f.output = steps_->forward(f.input);
    group_->send(sendable(f.output), stage_ + 1, kActivationTag, activation_out_.c_str(), state.step);
  } else {
    const at::Tensor dx = steps_->last(f.input, micro, state.labels.narrow(0, row, state.rows),
                                       state.classification_share, state.lm_targets.reshape({1}));
    if (dx.defined()) f.input_grad = dx.clone();  // its buffer serves the next micro-batch
  }
  return f;
}

MultiTaskPipeline::InFlight MultiTaskPipeline::forward_autograd(StepState& state, int64_t row,
                                                                const ensemble::TextBatch& micro) {
  InFlight f;
  at::Tensor x;
  if (model_->first_stage()) {
    x = model_->embed(micro.tokens);
  } else {
    f.input = receive_activation(state.rows, state.tokens, state.step).requires_grad_(true);
    x = f.input;
  }
  at::Tensor y = model_->run_blocks(x);
  if (!model_->last_stage()) {
    group_->send(y.detach(), stage_ + 1, kActivationTag, activation_out_.c_str(), state.step);
    f.output = y;
  } else {
    const MicroBatchLoss loss =
        micro_batch_loss(*model_, model_->final_norm(y), micro, state.labels.narrow(0, row, state.rows),
                         state.classification_share, state.lm_targets.reshape({1}), weights_);
    f.output = loss.total;
    state.losses.classification.add_(loss.classification.detach());
    state.losses.language_model.add_(loss.language_model.detach());
  }
  return f;
}

void MultiTaskPipeline::backward_micro_batch(StepState& state) {
  PACKTRAIN_NVTX_RANGE("backward");
  InFlight f = std::move(state.in_flight.front());
  state.in_flight.pop_front();
  if (steps_ != nullptr) return backward_static(f, state.step);
  at::Tensor grad_output;
  if (!model_->last_stage()) {
    grad_output = at::empty_like(f.output);
    group_->recv_(grad_output, stage_ + 1, kGradientTag, gradient_in_.c_str(), state.step);
  }
  const at::Tensor input_grad = stage_backward(*model_, f.output, grad_output, f.input);
  if (input_grad.defined()) {
    group_->send(input_grad.contiguous(), stage_ - 1, kGradientTag, gradient_out_.c_str(), state.step);
  }
}

void MultiTaskPipeline::backward_static(const InFlight& f, int64_t step) {
  if (model_->last_stage()) {
    if (f.input_grad.defined()) group_->send(f.input_grad, stage_ - 1, kGradientTag, gradient_out_.c_str(), step);
    return;
  }
  at::Tensor grad_output = at::empty_like(f.output);
  group_->recv_(grad_output, stage_ + 1, kGradientTag, gradient_in_.c_str(), step);
  const at::Tensor dx = steps_->backward(f.input, grad_output);
  if (dx.defined()) group_->send(sendable(dx), stage_ - 1, kGradientTag, gradient_out_.c_str(), step);
}

void MultiTaskPipeline::sum_over_replicas(ensemble::MultiTaskLosses& losses, int64_t step) {
  PACKTRAIN_NVTX_RANGE("replica gradient all-reduce");
  at::Tensor flat_grad = model_->parameters().flat_grad();
  replicas_->all_reduce_sum_(flat_grad, "gradient all-reduce", step);
  replicas_->watch_device("gradient all-reduce", step, step);  // CUDA: under the group's deadline
  if (model_->last_stage()) {  // each replica's losses are its rows' shares: summed, the batch's
    at::Tensor both = at::stack({losses.classification, losses.language_model});
    replicas_->all_reduce_sum_(both, "training-loss all-reduce", step);
    losses.classification = both[0];
    losses.language_model = both[1];
  }
}

// The tied embedding: its two copies' gradients summed on both ranks (the lower
// rank sends first, so NCCL's in-stream pair meets too). After the replicas' sum:
// that sum's order depends on where the block sits in each stage's flat gradients,
// and only a + b == b + a keeps the two copies bitwise equal.
void MultiTaskPipeline::exchange_tied_gradient(int64_t step) {
  PACKTRAIN_NVTX_RANGE("tied embedding exchange");
  at::Tensor mine = tied_gradient(model_->parameters());
  at::Tensor theirs = at::empty_like(mine);
  const int64_t peer = model_->first_stage() ? stages_ - 1 : 0;
  if (model_->first_stage()) {
    group_->send(mine, peer, kTiedTag, tied_out_.c_str(), step);
    group_->recv_(theirs, peer, kTiedTag, tied_in_.c_str(), step);
  } else {
    group_->recv_(theirs, peer, kTiedTag, tied_in_.c_str(), step);
    group_->send(mine, peer, kTiedTag, tied_out_.c_str(), step);
  }
  group_->wait_sends();
  at::NoGradGuard no_grad;
  mine.add_(theirs);
}

}  // namespace packtrain::runtime
