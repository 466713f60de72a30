#include "packtrain/runtime/trainers/multitask/pipeline_stage_steps.h"

#include "packtrain/ensemble/packed_loss.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>

namespace packtrain::runtime {

MicroBatchLoss micro_batch_loss(const ensemble::PackedTransformer& model, const at::Tensor& hidden,
                                const ensemble::TextBatch& micro, const at::Tensor& labels,
                                const at::Tensor& classification_share, const at::Tensor& lm_total,
                                const ensemble::TaskWeights& weights) {
  MicroBatchLoss loss;
  loss.classification =
      ensemble::packed_cross_entropy_loss(model.classify(hidden, micro.lengths), labels, weights.class_weights) *
      classification_share;
  loss.language_model = ensemble::packed_lm_loss(model.lm_logits(hidden), micro) *
                        (ensemble::lm_target_count(micro).to(lm_total.scalar_type()) / lm_total);
  loss.total = (loss.classification * weights.classification + loss.language_model * weights.language_model).sum();
  return loss;
}

// One micro-batch shape's steps (made on first use) and their output buffers.
struct PipelineStageSteps::Shape {
  std::unique_ptr<graphs::CapturedStep> forward, backward, last;
  at::Tensor output, input_grad;  // (K, rows, T, d)
};

PipelineStageSteps::PipelineStageSteps(ensemble::PackedTransformer& model, ensemble::TaskWeights weights,
                                       graphs::CaptureOptions capture)
    : model_(&model),
      weights_(std::move(weights)),
      capture_(std::move(capture)),
      pool_(std::make_shared<graphs::GraphPool>(model.parameters().flat().device())) {
  classification_ = at::zeros({model.members()}, model.parameters().flat().options());
  lm_ = at::zeros_like(classification_);
}

PipelineStageSteps::~PipelineStageSteps() = default;

PipelineStageSteps::Shape& PipelineStageSteps::shape(int64_t rows, int64_t tokens) {
  std::unique_ptr<Shape>& s = shapes_[{rows, tokens}];
  if (s) return *s;
  s = std::make_unique<Shape>();
  const int64_t K = model_->members(), d = model_->options().width();
  const auto real = model_->parameters().flat().options();
  s->output = at::zeros({K, rows, tokens, d}, real);
  s->input_grad = at::zeros_like(s->output);
  return *s;
}

at::Tensor stage_backward(ensemble::PackedTransformer& model, const at::Tensor& output, const at::Tensor& grad_output,
                          const at::Tensor& input) {
  ensemble::PackedParameters& parameters = model.parameters();
  std::vector<at::Tensor> inputs(parameters.tensors().begin(), parameters.tensors().end());
  if (input.defined()) inputs.push_back(input);
  const std::vector<at::Tensor> grads = torch::autograd::grad(
      {output}, inputs, grad_output.defined() ? std::vector<at::Tensor>{grad_output} : std::vector<at::Tensor>{},
      /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> blocks = parameters.blocks(parameters.flat_grad());
  for (size_t p = 0; p < blocks.size(); ++p) {
    if (grads[p].defined()) blocks[p].add_(grads[p].reshape(blocks[p].sizes()));
  }
  return input.defined() ? grads.back() : at::Tensor();
}

namespace {
// The static input a stage reads: tokens on the first stage, else an activation.
graphs::StaticInput stage_input(const ensemble::PackedTransformer& model, int64_t rows, int64_t tokens) {
  if (model.first_stage()) return {"tokens", {rows, tokens}, at::kLong};
  return {
      "activation", {model.members(), rows, tokens, model.options().width()}, model.parameters().flat().scalar_type()};
}

std::string step_name(const char* what, int64_t rows, int64_t tokens) {
  return std::string("pipeline stage ") + what + " (" + std::to_string(rows) + " x " + std::to_string(tokens) + ")";
}
}  // namespace

const at::Tensor& PipelineStageSteps::forward(const at::Tensor& input) {
  TORCH_CHECK(!model_->last_stage(), "PipelineStageSteps::forward: the last stage runs last()");
  const int64_t rows = input.size(model_->first_stage() ? 0 : 1), tokens = input.size(model_->first_stage() ? 1 : 2);
  Shape& s = shape(rows, tokens);
  if (!s.forward) {
    Shape* sp = &s;
    s.forward = std::make_unique<graphs::CapturedStep>(
        step_name("forward", rows, tokens), input.device(),
        std::vector<graphs::StaticInput>{stage_input(*model_, rows, tokens)},
        [this, sp](const std::vector<at::Tensor>& in) {
          at::NoGradGuard no_grad;
          const at::Tensor x = model_->first_stage() ? model_->embed(in[0]) : in[0];
          sp->output.copy_(model_->run_blocks(x));
        },
        capture_, pool_);
  }
  s.forward->run({input});
  return s.output;
}

at::Tensor PipelineStageSteps::backward(const at::Tensor& input, const at::Tensor& grad_output) {
  TORCH_CHECK(!model_->last_stage(), "PipelineStageSteps::backward: the last stage runs last()");
  const int64_t rows = grad_output.size(1), tokens = grad_output.size(2);
  Shape& s = shape(rows, tokens);
  if (!s.backward) {
    Shape* sp = &s;
    std::vector<graphs::StaticInput> specs{
        stage_input(*model_, rows, tokens),
        {"activation gradient", grad_output.sizes().vec(), grad_output.scalar_type()}};
    s.backward = std::make_unique<graphs::CapturedStep>(
        step_name("backward", rows, tokens), input.device(), std::move(specs),
        [this, sp](const std::vector<at::Tensor>& in) {
          const at::Tensor leaf = model_->first_stage() ? at::Tensor() : in[0].detach().requires_grad_(true);
          const at::Tensor y = model_->run_blocks(model_->first_stage() ? model_->embed(in[0]) : leaf);
          const at::Tensor input_grad = stage_backward(*model_, y, in[1], leaf);
          if (input_grad.defined()) sp->input_grad.copy_(input_grad);
        },
        capture_, pool_);
  }
  s.backward->run({input, grad_output});
  return model_->first_stage() ? at::Tensor() : s.input_grad;
}

at::Tensor PipelineStageSteps::last(const at::Tensor& input, const ensemble::TextBatch& micro, const at::Tensor& labels,
                                    const at::Tensor& classification_share, const at::Tensor& lm_total) {
  TORCH_CHECK(model_->last_stage(), "PipelineStageSteps::last: only the last stage computes the losses");
  const int64_t rows = micro.tokens.size(0), tokens = micro.tokens.size(1);
  const bool first = model_->first_stage();
  Shape& s = shape(rows, tokens);
  if (!s.last) {
    Shape* sp = &s;
    const c10::ScalarType real = model_->parameters().flat().scalar_type();
    std::vector<graphs::StaticInput> specs;
    if (!first) specs.push_back(stage_input(*model_, rows, tokens));
    specs.push_back({"tokens", {rows, tokens}, at::kLong});
    specs.push_back({"lengths", {rows}, at::kLong});
    specs.push_back({"labels", {rows}, at::kLong});
    specs.push_back({"classification share", {1}, real});
    specs.push_back({"LM target tokens of the batch", {1}, real});
    s.last = std::make_unique<graphs::CapturedStep>(
        step_name("forward + losses + backward", rows, tokens), labels.device(), std::move(specs),
        [this, sp, first](const std::vector<at::Tensor>& in) {
          const size_t o = first ? 0 : 1;  // where the micro-batch's own inputs start
          const ensemble::TextBatch batch{in[o], in[o + 1]};
          const at::Tensor leaf = first ? at::Tensor() : in[0].detach().requires_grad_(true);
          const at::Tensor hidden = model_->final_norm(model_->run_blocks(first ? model_->embed(batch.tokens) : leaf));
          const MicroBatchLoss loss =
              micro_batch_loss(*model_, hidden, batch, in[o + 2], in[o + 3], in[o + 4], weights_);
          const at::Tensor input_grad = stage_backward(*model_, loss.total, {}, leaf);
          at::NoGradGuard no_grad;
          if (input_grad.defined()) sp->input_grad.copy_(input_grad);
          classification_.add_(loss.classification.detach());
          lm_.add_(loss.language_model.detach());
        },
        capture_, pool_);
  }
  std::vector<at::Tensor> in;
  if (!first) in.push_back(input);
  in.insert(in.end(), {micro.tokens, micro.lengths, labels, classification_share, lm_total});
  s.last->run(in);
  return first ? at::Tensor() : s.input_grad;
}

void PipelineStageSteps::zero_losses() {
  classification_.zero_();
  lm_.zero_();
}

int64_t PipelineStageSteps::steps() const {
  int64_t n = 0;
  for (const auto& [key, s] : shapes_) n += (s->forward ? 1 : 0) + (s->backward ? 1 : 0) + (s->last ? 1 : 0);
  return n;
}

int64_t PipelineStageSteps::captured() const {
  int64_t n = 0;
  for (const auto& [key, s] : shapes_) {
    for (const auto* step : {s->forward.get(), s->backward.get(), s->last.get()}) {
      n += step != nullptr && step->mode() == graphs::StepMode::kGraph ? 1 : 0;
    }
  }
  return n;
}

}  // namespace packtrain::runtime
