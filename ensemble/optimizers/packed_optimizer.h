// The base of packed optimizers: per-member learning rate, weight decay, mask and
// step count as (K) device tensors, so a captured step reads them on the device
// and no host scalar that changes between steps enters an update.
#pragma once

#include "packtrain/ensemble/optimizers/lr_schedule.h"
#include "packtrain/ensemble/packed_parameters.h"

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
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

  // Every tensor a checkpoint needs to continue exactly, by name: the per-member
  // hyperparameters, mask and step counts, then the subclass's moments. Loading
  // copies into these same tensors in place, so captured graphs stay valid.
  virtual std::vector<std::pair<std::string, at::Tensor>> state() const;

  int64_t members() const { return parameters_->members(); }
  PackedParameters& parameters() { return *parameters_; }

  // (K) float64 tensors on the parameters' device. Write them in place (fill_,
  // copy_) to change a member's hyperparameters; a captured step sees the change.
  // lr() is the base rate the schedule multiplies.
  const at::Tensor& lr() const { return lr_; }
  // (K) float64: the learning rate the last update used (base rate times schedule).
  const at::Tensor& current_lr() const { return schedule_.is_constant() ? lr_ : current_lr_; }
  const at::Tensor& weight_decay() const { return weight_decay_; }
  // (K) bool: true where a member trains.
  const at::Tensor& mask() const { return mask_; }
  // (K) float64: updates each member has taken.
  const at::Tensor& step_count() const { return step_; }

  // Validated in-place setters (shape [K], any real dtype, any device).
  void set_lr(const at::Tensor& lr);
  void set_weight_decay(const at::Tensor& weight_decay);
  void set_mask(const at::Tensor& mask);

  // The schedule every member follows from its own step count (so a re-initialized
  // member, whose count is reset, starts its schedule again). Default: constant.
  // Set it before a step is captured: a graph keeps the schedule's shape (kind,
  // warm-up, length) it was captured with; the per-member progress stays live.
  void set_schedule(LrSchedule schedule);
  const LrSchedule& schedule() const { return schedule_; }

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
  // The (K) float64 learning rates of this update, where `update_number` (K, float64)
  // counts each member's earlier updates; also stored in current_lr(). A constant
  // schedule is lr() itself: no work in the step.
  at::Tensor scheduled_lr(const at::Tensor& update_number);

  PackedParameters* parameters_;
  std::vector<at::Tensor> param_blocks_;  // (K, n_i) views of the parameters
  std::vector<at::Tensor> grad_blocks_;   // (K, n_i) views of the gradients
  at::Tensor lr_;                         // (K) float64
  at::Tensor weight_decay_;               // (K) float64
  at::Tensor mask_;                       // (K) bool
  at::Tensor step_;                       // (K) float64
  at::Tensor current_lr_;                 // (K) float64
  LrSchedule schedule_;
};

}  // namespace packtrain::ensemble
