// Trains a small pack through the installed headers and libraries: prints
// "consumer: ok <rmse>" when the ensemble learned a linear target.
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"

#include <ATen/ATen.h>

#include <cstdio>

int main() {
  at::manual_seed(0);
  const at::Tensor x = at::randn({256, 3}, at::kDouble);
  const at::Tensor y = x.sum(1, /*keepdim=*/true) * 2 + 1;
  packtrain::runtime::EnsembleTrainer trainer(
      packtrain::runtime::EnsembleTrainerOptions().members(4).hidden(16).epochs(40).batch_size(32).log(
          [](const std::string&) {}));
  trainer.fit(x, y);
  const double rmse = trainer.evaluate(x, y).ensemble.rmse;
  std::printf("consumer: %s %.4f\n", rmse < 1.0 ? "ok" : "did not learn", rmse);
  return rmse < 1.0 ? 0 : 1;
}
