// The README's example: 64 small regressors trained as one pack with AdamW.
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/ensemble/packed_mlp.h"

#include <ATen/ATen.h>

#include <iostream>

int main() {
  using namespace packtrain::ensemble;
  // README-BEGIN
  PackedMLP model(PackedMLPOptions(/*in=*/8, /*out=*/1).members(64).hidden(64).depth(2).seed(7));
  PackedAdam optimizer(model.parameters(), adamw_options().lr(1e-3));

  const at::Tensor x = at::randn({128, 8});  // one batch shared by all 64 members
  const at::Tensor y = at::randn({128, 1});
  for (int step = 0; step < 100; ++step) {
    model.parameters().zero_grad();                                // in place, one tensor
    const at::Tensor loss = packed_mse_loss(model.forward(x), y);  // (64): each member's loss
    loss.sum().backward();                                         // each member gets its own gradient
    optimizer.step();                                              // one update for all members
  }
  // README-END
  std::cout << "final mean loss " << packed_mse_loss(model.forward(x), y).mean().item<double>() << "\n";
  return 0;
}
