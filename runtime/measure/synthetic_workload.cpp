#include "packtrain/runtime/measure/synthetic_workload.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

namespace packtrain::runtime {

std::string WorkloadOptions::describe() const {
  return fmt::format("members {}, hidden {}, depth {}, batch {}, {} inputs, {} order", members(), hidden(), depth(),
                     batch(), inputs(), graphs::to_string(order()));
}

SyntheticWorkload::SyntheticWorkload(WorkloadOptions options) : options_(std::move(options)) {
  const int64_t rows = options_.rows() > 0 ? options_.rows() : 16 * options_.batch();
  // y = sin(sum of x) + noise: smooth, learnable, deterministic from the seed.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed() + 7);
  const at::Tensor x = at::randn({rows, options_.inputs()}, gen);
  const at::Tensor y = x.sum(1, /*keepdim=*/true).sin() + 0.1 * at::randn({rows, 1}, gen);
  model_ = std::make_unique<ensemble::PackedMLP>(ensemble::PackedMLPOptions(options_.inputs(), 1)
                                                     .members(options_.members())
                                                     .hidden(options_.hidden())
                                                     .depth(options_.depth())
                                                     .seed(options_.seed())
                                                     .device(options_.device()));
  model_->set_precision(options_.precision());
  optimizer_ = std::make_unique<ensemble::PackedAdam>(model_->parameters(), ensemble::adamw_options().lr(1e-3));
  steps_ = std::make_unique<EnsembleSteps>(
      *model_, *optimizer_, std::vector<at::Tensor>{x, y},
      EnsembleStepsOptions()
          .batch_size(options_.batch())
          .order(options_.order())
          .loss(ensemble::LossKind::kMSE)
          .unroll(options_.unroll())
          .seed(options_.seed())
          .capture(graphs::CaptureOptions().capture(options_.capture()).log(options_.log())));
  steps_->batcher().start_epoch();
}

SyntheticWorkload::~SyntheticWorkload() = default;

}  // namespace packtrain::runtime
