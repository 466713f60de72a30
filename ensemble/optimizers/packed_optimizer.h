// The base of packed optimizers: per-member learning rate, weight decay, mask and
// step count as (K) device tensors, so a captured step reads them on the device
// and no host scalar that changes between steps enters an update.
#pragma once

#include "ensemble/packed_parameters.h"

#include <ATen/core/Tensor.h>

#include <vector>

namespace packtrain::ensemble {

class PackedOptimizer {
 public:
  PackedOptimizer(PackedParameters& parameters, double lr, double weight_decay);
  virtual ~PackedOptimizer() = default;
  PackedOptimizer(const PackedOptimizer&) = delete;
  PackedOptimizer& operator=(const PackedOptimizer&) = delete;

  // One update of every unmasked member from the gradients in parameters().grad().
  // Gradients of masked (frozen) members are ignored, NaN included; a frozen
  // member's weights, optimizer state and step count do not change.
  virtual void step() = 0;

  // Clears moments and step counts of all members, or of those where `which`
  // (K, bool) is true: the optimizer half of an in-place re-initialization.
  virtual void reset_state(const at::Tensor& which = {}) = 0;

  int64_t members() const { return parameters_->members(); }
  PackedParameters& parameters() { return *parameters_; }

  // (K) float64 tensors on the parameters' device. Write them in place (fill_,
  // copy_) to change a member's hyperparameters; a captured step sees the change.
  const at::Tensor& lr() const { return lr_; }
  const at::Tensor& weight_decay() const { return weight_decay_; }
  // (K) bool: true where a member trains.
  const at::Tensor& mask() const { return mask_; }
  // (K) float64: updates each member has taken.
  const at::Tensor& step_count() const { return step_; }

  // Validated in-place setters (shape [K], any real dtype, any device).
  void set_lr(const at::Tensor& lr);
  void set_weight_decay(const at::Tensor& weight_decay);
  void set_mask(const at::Tensor& mask);

 protected:
  // (K) per-member values as a (K, 1) column in the parameters' dtype, for
  // broadcasting against (K, n_i) parameter blocks.
  at::Tensor column(const at::Tensor& per_member) const;
  // (K, 1) bool view of the mask.
  at::Tensor mask_column() const;
  // Zeroes the members of `state`, a flat (N) tensor in the parameters' layout,
  // selected by `which` (all if undefined).
  void clear_members(const at::Tensor& state, const at::Tensor& which) const;
  // Ignores the gradients of masked members (NaN included) by zeroing them.
  void drop_masked_gradients() const;
  at::Tensor checked_selection(const at::Tensor& which) const;

  PackedParameters* parameters_;
  std::vector<at::Tensor> param_blocks_;  // (K, n_i) views of the parameters
  std::vector<at::Tensor> grad_blocks_;   // (K, n_i) views of the gradients
  at::Tensor lr_;            // (K) float64
  at::Tensor weight_decay_;  // (K) float64
  at::Tensor mask_;          // (K) bool
  at::Tensor step_;          // (K) float64
};

}  // namespace packtrain::ensemble
