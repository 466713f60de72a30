#include "packtrain/ensemble/optimizers/adam.h"

#include "packtrain/ensemble/optimizers/adam_math.h"
#include "packtrain/ensemble/optimizers/adam_update.h"
#include "packtrain/ensemble/optimizers/adam_update_cuda.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#if defined(PACKTRAIN_HAVE_CUDA_KERNELS)
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace packtrain::ensemble {

namespace {
// The fused CUDA kernels (adam_update_cuda.cu) exist when the build had nvcc;
// without them a CUDA pack falls back to ATen tensor ops.
#if defined(PACKTRAIN_HAVE_CUDA_KERNELS)
void* current_stream(const c10::Device& device) { return c10::cuda::getCurrentCUDAStream(device.index()).stream(); }
void check_cuda(int error) { C10_CUDA_CHECK(static_cast<cudaError_t>(error)); }
bool fused_cuda(const c10::Device& device) { return device.is_cuda(); }
#else
bool fused_cuda(const c10::Device&) { return false; }
#endif
}  // namespace

void AdamOptions::validate() const {
  TORCH_CHECK(lr() >= 0, "Adam: lr must be >= 0, got ", lr());
  TORCH_CHECK(beta1() >= 0 && beta1() < 1, "Adam: beta1 must be in [0, 1), got ", beta1());
  TORCH_CHECK(beta2() >= 0 && beta2() < 1, "Adam: beta2 must be in [0, 1), got ", beta2());
  TORCH_CHECK(eps() >= 0, "Adam: eps must be >= 0, got ", eps());
  TORCH_CHECK(weight_decay() >= 0, "Adam: weight_decay must be >= 0, got ", weight_decay());
}

PackedAdam::PackedAdam(PackedParameters& parameters, AdamOptions options)
    : PackedOptimizer(parameters, (options.validate(), options.lr()), options.weight_decay()),
      options_(options),
      exp_avg_(at::zeros_like(parameters.flat())),
      exp_avg_sq_(at::zeros_like(parameters.flat())),
      exp_avg_blocks_(parameters.blocks(exp_avg_)),
      exp_avg_sq_blocks_(parameters.blocks(exp_avg_sq_)),
      coefficients_(at::zeros({detail::kAdamCoefficientRows, parameters.members()},
                              parameters.flat().options().dtype(at::kDouble))) {
  // The moments live in the parameters' dtype: in float16, eps and every squared
  // gradient below 2^-24 round to zero, and the first zero gradient updates by 0/0.
  TORCH_CHECK(parameters.flat().scalar_type() != at::kHalf, "packed Adam on float16 parameters: eps=", options.eps(),
              " and squared gradients below 6e-8 underflow to zero in float16 (NaN updates); use bfloat16 or "
              "float32 parameters");
  for (size_t i = 0; i < parameters.size(); ++i) block_numels_.push_back(parameters.numel(i));
}

void PackedAdam::reset_state(const at::Tensor& which) {
  at::NoGradGuard no_grad;
  const at::Tensor selection = which.defined() ? checked_selection(which) : at::Tensor();
  clear_members(exp_avg_, selection);
  clear_members(exp_avg_sq_, selection);
  clear_members(step_, selection);
}

void PackedAdam::step() {
  at::NoGradGuard no_grad;
  const double beta1 = options_.beta1(), beta2 = options_.beta2();
  const bool decay = options_.weight_decay() != 0;
  const bool decoupled = decay && options_.decoupled_weight_decay();
  const int64_t K = members();
  const c10::Device device = parameters_->flat().device();

  // torch::optim::Adam(W)'s update with per-member coefficients (adam_math.h), a
  // (5, K) float64 table; a frozen member's are the identity and its step count
  // does not advance. The learning rate comes from each member's count of earlier
  // updates, read before this update advances it (lr_schedule_math.h: the same
  // function on the host and in the kernel, so a schedule adds no kernels).
  const detail::LrScheduleParams schedule = schedule_.params();
  if (device.is_cpu()) {
    // A loop over members, not ~15 tensor ops: on CPU the ops' dispatch was most of
    // a small pack's optimizer time.
    const bool* mask = mask_.data_ptr<bool>();
    double* step = step_.data_ptr<double>();
    const double* base_lr = lr_.data_ptr<double>();
    double* current = current_lr_.data_ptr<double>();
    const double* wd = weight_decay_.data_ptr<double>();
    double* table = coefficients_.data_ptr<double>();
    for (int64_t k = 0; k < K; ++k) {
      current[k] = base_lr[k] * detail::lr_schedule_factor(schedule, step[k]);
      detail::adam_member_coefficients(k, K, mask[k], step, current[k], wd[k], beta1, beta2, decay, decoupled, table);
    }
  } else if (fused_cuda(device)) {
#if defined(PACKTRAIN_HAVE_CUDA_KERNELS)
    check_cuda(detail::launch_adam_coefficients(K, mask_.data_ptr<bool>(), step_.data_ptr<double>(),
                                                lr_.data_ptr<double>(), schedule, current_lr_.data_ptr<double>(),
                                                weight_decay_.data_ptr<double>(), beta1, beta2, decay, decoupled,
                                                coefficients_.data_ptr<double>(), current_stream(device)));
#endif
  } else {
    const at::Tensor lr = scheduled_lr(step_);
    const at::Tensor active = mask_.to(at::kDouble);
    step_.add_(active);
    const at::Tensor steps = step_.clamp_min(1);
    coefficients_[detail::kActive].copy_(active);
    coefficients_[detail::kNegStepSize].copy_(-(lr / (1 - at::pow(beta1, steps))) * active);
    coefficients_[detail::kSqrtBiasCorrection2].copy_((1 - at::pow(beta2, steps)).sqrt());
    coefficients_[detail::kDecayFactor].copy_(decay && decoupled ? 1 - lr * weight_decay_ * active
                                                                 : at::ones_like(active));
    coefficients_[detail::kL2].copy_(decay && !decoupled ? weight_decay_ : at::zeros_like(active));
  }

  const at::Tensor& flat = parameters_->flat();
  const at::Tensor& flat_grad = parameters_->flat_grad();
  if (fused_cuda(device) && (flat.scalar_type() == at::kFloat || flat.scalar_type() == at::kDouble)) {
#if defined(PACKTRAIN_HAVE_CUDA_KERNELS)
    // One launch over the flat buffers (every parameter block), not one per block.
    check_cuda(detail::launch_adam_update_flat(flat.scalar_type() == at::kDouble, flat.data_ptr(), flat_grad.data_ptr(),
                                               exp_avg_.data_ptr(), exp_avg_sq_.data_ptr(), K, block_numels_.data(),
                                               static_cast<int>(block_numels_.size()), coefficients_.data_ptr<double>(),
                                               beta1, beta2, options_.eps(), decay, decoupled, current_stream(device)));
#endif
    return;
  }
  const detail::AdamCoefficients c = detail::coefficient_rows(coefficients_, decay, decoupled);
  for (size_t i = 0; i < param_blocks_.size(); ++i) {
    const at::Tensor &p = param_blocks_[i], &g = grad_blocks_[i];
    const at::Tensor &m = exp_avg_blocks_[i], &v = exp_avg_sq_blocks_[i];
    // The CPU's vectorized pass takes float32 and float64; bfloat16 and float16
    // packs (and any device without a fused kernel) update through tensor ops.
    if (device.is_cpu() && (p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble)) {
      detail::adam_update_cpu(p, g, m, v, c, beta1, beta2, options_.eps());
    } else {
      detail::adam_update_tensor_ops(p, g, m, v, c, beta1, beta2, options_.eps());
    }
  }
}

std::vector<std::pair<std::string, at::Tensor>> PackedAdam::state() const {
  auto out = PackedOptimizer::state();
  out.emplace_back("exp_avg", exp_avg_);
  out.emplace_back("exp_avg_sq", exp_avg_sq_);
  return out;
}

}  // namespace packtrain::ensemble
