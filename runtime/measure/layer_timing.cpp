#include "packtrain/runtime/measure/layer_timing.h"

#include "packtrain/ensemble/multitask_step.h"
#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/profiling/nvtx.h"
#include "packtrain/runtime/trainers/multitask/pipeline_stage_steps.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <vector>

namespace packtrain::runtime {

namespace {
// The median of `repeats` timed runs of `run` (after one untimed), the device's
// queue drained around each.
double median_seconds(const c10::Device device, int64_t repeats, const std::function<void()>& run) {
  const auto drain = [&] {
    if (device.is_cuda()) c10::cuda::device_synchronize();
  };
  run();
  drain();
  std::vector<double> seconds;
  for (int64_t i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    drain();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + repeats / 2, seconds.end());
  return seconds[static_cast<size_t>(repeats / 2)];
}

}  // namespace

LayerTimes measure_layer_times(const ensemble::PackedTransformerOptions& model, int64_t rows, int64_t tokens,
                               int64_t repeats) {
  if (rows < 1 || tokens < 1 || repeats < 1 || tokens > model.max_length()) {
    throw std::invalid_argument(
        fmt::format("measure_layer_times: rows {}, tokens {} (max_length {}) and repeats {} "
                    "must be >= 1, tokens within max_length",
                    rows, tokens, model.max_length(), repeats));
  }
  PACKTRAIN_NVTX_RANGE("layer timing");
  ensemble::PackedTransformer one(ensemble::PackedTransformerOptions(model).layers(1));
  const c10::Device device = model.device();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(0);
  ensemble::TextBatch batch;
  batch.lengths = at::full({rows}, tokens, at::kLong).to(device);
  batch.tokens = at::randint(3, model.vocab(), {rows, tokens}, generator, at::kLong).to(device);
  const at::Tensor labels = at::randint(0, model.classes(), {rows}, generator, at::kLong).to(device);
  const auto real = at::TensorOptions().dtype(model.dtype()).device(device);
  const at::Tensor gradient = at::randn({model.members(), rows, tokens, model.width()}, real) * 1e-3;
  const at::Tensor activation = at::randn({model.members(), rows, tokens, model.width()}, real);

  LayerTimes t;
  t.embedding = median_seconds(device, repeats, [&] { stage_backward(one, one.embed(batch.tokens), gradient, {}); });
  t.block = median_seconds(device, repeats, [&] {
    const at::Tensor x = activation.detach().requires_grad_(true);
    stage_backward(one, one.run_blocks(x), gradient, x);
  });
  {
    at::NoGradGuard no_grad;
    t.embedding_forward = median_seconds(device, repeats, [&] { one.embed(batch.tokens); });
    t.block_forward = median_seconds(device, repeats, [&] { one.run_blocks(activation); });
  }
  t.heads = median_seconds(device, repeats, [&] {
    const at::Tensor x = activation.detach().requires_grad_(true);
    const at::Tensor hidden = one.final_norm(x);
    const at::Tensor loss = ensemble::packed_cross_entropy_loss(one.classify(hidden, batch.lengths), labels) +
                            ensemble::packed_lm_loss(one.lm_logits(hidden), batch);
    stage_backward(one, loss.sum(), {}, x);
  });
  return t;
}

}  // namespace packtrain::runtime
