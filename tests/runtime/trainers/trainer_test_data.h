// What the EnsembleTrainer tests share: small regression data in original units
// far from standardized, and a small, fast trainer configuration.
#pragma once

#include "packtrain/runtime/trainers/ensemble/ensemble_trainer_options.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <string>

namespace packtrain::runtime::trainer_testing {

struct Data {
  at::Tensor x, y, val_x, val_y;
};

// y = sin(x0) + x1^2 + noise, in original units far from standardized (mean 10).
inline Data make_data(int64_t rows, int64_t val_rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor x = at::randn({rows + val_rows, 3}, gen, f64) * 2 + 1;
  const at::Tensor y =
      (x.select(1, 0).sin() + x.select(1, 1).square() * 0.3 + 10 + 0.1 * at::randn({rows + val_rows}, gen, f64))
          .unsqueeze(1);
  return {x.narrow(0, 0, rows), y.narrow(0, 0, rows), x.narrow(0, rows, val_rows), y.narrow(0, rows, val_rows)};
}

// n 8x8 images as rows of 64 (float64) of a horizontal (label 0) or a vertical
// (label 1) bar at a random row or column, in Gaussian noise of deviation 0.3: a
// task small convolutional members (architecture "cnn") learn in a few epochs.
struct BarImages {
  at::Tensor x;       // (n, 64) float64
  at::Tensor labels;  // (n) int64
};
inline BarImages bar_images(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  const at::Tensor labels = at::randint(2, {n}, gen, i64), where = at::randint(8, {n}, gen, i64);
  at::Tensor images = 0.3 * at::randn({n, 8, 8}, gen, at::TensorOptions().dtype(at::kDouble));
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = where[r].item<int64_t>();
    (labels[r].item<int64_t>() == 0 ? images[r].select(0, i) : images[r].select(1, i)).add_(1.0);
  }
  return {images.reshape({n, 64}), labels};
}

inline void ignore_log(const std::string&) {}

inline EnsembleTrainerOptions small_options(c10::Device d) {
  return EnsembleTrainerOptions()
      .patience(0)  // training runs every epoch, whatever the validation rows (tests that stop set it)
      .early_stopping(EarlyStopping::kMember)
      .members(4)
      .hidden(16)
      .depth(1)
      .epochs(12)
      .batch_size(16)
      .lr(1e-2)
      .seed(3)
      .unroll(3)
      .device(d)
      .log(&ignore_log);
}

}  // namespace packtrain::runtime::trainer_testing
