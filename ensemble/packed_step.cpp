#include "packtrain/ensemble/packed_step.h"

#include "packtrain/ensemble/float32_arithmetic.h"
#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/profiling/nvtx.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <optional>
#include <string>
#include <vector>

namespace packtrain::ensemble {

void backward_into_flat_grad(PackedParameters& parameters, const at::Tensor& loss) {
  const ExactFloat32Scope exact;  // the backward's convolutions and matmuls
  const std::vector<at::Tensor>& params = parameters.tensors();
  const std::vector<at::Tensor> grads = torch::autograd::grad({loss}, params, /*grad_outputs=*/{},
                                                              /*retain_graph=*/false, /*create_graph=*/false,
                                                              /*allow_unused=*/true);
  std::vector<at::Tensor> pieces;
  pieces.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    pieces.push_back(grads[i].defined() ? grads[i].reshape({-1}) : at::zeros({params[i].numel()}, params[i].options()));
  }
  at::Tensor out = parameters.flat_grad();  // the buffer's handle: written in place
  at::NoGradGuard no_grad;
  at::cat_out(out, pieces);
}

at::Tensor packed_train_step(PackedModel& model, PackedOptimizer& optimizer, const at::Tensor& x, const at::Tensor& y,
                             LossKind kind, double min_variance, const GradientHook& after_backward) {
  TORCH_CHECK(&optimizer.parameters() == &model.parameters(),
              "packed_train_step: the optimizer does not hold this model's parameters");
  const ExactFloat32Scope exact;
  // The model's own forward + backward, where it offers one for this batch.
  if (const std::optional<at::Tensor> fused = model.fused_gradients(x, y, kind, min_variance)) {
    if (after_backward) after_backward();
    PACKTRAIN_NVTX_RANGE("optimizer");
    optimizer.step();
    return *fused;
  }
  at::Tensor losses;
  {
    PACKTRAIN_NVTX_RANGE("forward");
    losses = packed_loss(kind, model.forward(x), y, min_variance);
  }
  {
    PACKTRAIN_NVTX_RANGE("backward");
    backward_into_flat_grad(model.parameters(), losses.sum());
  }
  if (after_backward) after_backward();
  {
    PACKTRAIN_NVTX_RANGE("optimizer");
    optimizer.step();
  }
  return losses.detach();
}

at::Tensor packed_eval_losses(const PackedModel& model, const at::Tensor& x, const at::Tensor& y, LossKind kind,
                              double min_variance) {
  at::NoGradGuard no_grad;
  const ExactFloat32Scope exact;
  PACKTRAIN_NVTX_RANGE("eval");
  return packed_loss(kind, model.forward(x), y, min_variance);
}

}  // namespace packtrain::ensemble
