// PackedModel: the seam between a member architecture and everything that trains
// it. A pack of K models of one shape gives: its parameters as views of one flat
// buffer (PackedParameters), forward on a shared (B, I) or per-member (K, B, I)
// batch, training mode and per-member dropout seeding, per-member
// reinitialization from (seed, member), and member i as a standalone LibTorch
// module. packed_step.h, runtime's EnsembleSteps and the synthetic workload take a
// PackedModel; PackedMLP (packed_mlp.h) and ResidualMLP (residual_mlp.h) implement
// it. A faster path a model offers (the MLP's fused CPU step) is a virtual it
// overrides, not a type test in the step.
#pragma once

#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/ensemble/packed_parameters.h"
#include "packtrain/ensemble/precision.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace packtrain::ensemble {

// One member as a standalone LibTorch module: the module (its parameters, train()
// and to()) and its forward, (B, I) -> (B, O).
struct StandaloneMember {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
};

class PackedModel {
 public:
  virtual ~PackedModel() = default;

  // The architecture's name ("mlp", "residual-mlp").
  virtual std::string_view kind() const = 0;
  virtual PackedParameters& parameters() = 0;
  virtual const PackedParameters& parameters() const = 0;
  int64_t members() const { return parameters().members(); }  // K
  c10::Device device() const { return parameters().flat().device(); }
  c10::ScalarType dtype() const { return parameters().flat().scalar_type(); }

  // x: (B, I) shared by all members, or (K, B, I) per member. Returns (K, B, O) in
  // the model's dtype, computed in its precision (forward_layers under
  // PrecisionScope: with bf16-mixed the layers' products run in bfloat16 and the
  // output is cast back).
  at::Tensor forward(const at::Tensor& x) const;

  // The arithmetic of forward, of the training step's forward and backward and of
  // fused_gradients (ensemble/precision.h); kFP32 until set.
  void set_precision(Precision precision) { precision_ = precision; }
  Precision precision() const { return precision_; }

  // Training mode enables dropout where the architecture has it.
  void train(bool on = true) { training_ = on; }
  bool is_training() const { return training_; }
  // Dropout's seed (restarting its draw count) and this rank's rows of a global
  // batch (data parallel); no-ops for a model that drops nothing.
  virtual void seed_dropout(uint64_t seed) = 0;
  virtual void dropout_rows(int64_t offset, int64_t rows) = 0;

  // Re-initializes members in place from `seed` (member i from member_seed(seed,
  // first member + i)): all, or those where `which` (K, bool) is true. No tensor is
  // reallocated, so captured graphs stay valid.
  virtual void reinitialize(uint64_t seed, const at::Tensor& which = {}) = 0;

  // Member `member` as a new standalone module (forward takes (B, I), returns
  // (B, O)) on the pack's device and dtype, equal to the member.
  virtual StandaloneMember standalone_member(int64_t member) const = 0;

  // A faster forward + backward the architecture offers for this batch (the MLP's
  // fused CPU step): overwrites every gradient and returns the (K) losses, or
  // nothing where it does not apply and the step runs autograd.
  virtual std::optional<at::Tensor> fused_gradients(const at::Tensor& x, const at::Tensor& y, LossKind kind,
                                                    double min_variance) {
    (void)x, (void)y, (void)kind, (void)min_variance;
    return std::nullopt;
  }

 protected:
  // The architecture's forward, as `forward` documents it, in whatever dtype its
  // layers produce under the open precision scope.
  virtual at::Tensor forward_layers(const at::Tensor& x) const = 0;

  bool training_ = true;
  Precision precision_ = Precision::kFP32;
};

// The members reinitialize(seed, which) re-draws: those where `which` (K, bool) is
// true, or all K when it is undefined. Throws naming a selection of another shape.
std::vector<int64_t> members_to_reinitialize(const at::Tensor& which, int64_t members);

}  // namespace packtrain::ensemble
