#include "packtrain/ensemble/packed_linear.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

namespace packtrain::ensemble {

PackedLinear::PackedLinear(at::Tensor weight, at::Tensor bias, PackOfOne pack_of_one)
    : weight_(std::move(weight)), bias_(std::move(bias)), pack_of_one_(pack_of_one) {
  TORCH_CHECK(weight_.dim() == 3, "packed weight must be (K, I, O), got ", weight_.sizes());
  TORCH_CHECK(!bias_.defined() || (bias_.dim() == 3 && bias_.size(0) == weight_.size(0) && bias_.size(1) == 1 &&
                                   bias_.size(2) == weight_.size(2)),
              "packed bias for weight ", weight_.sizes(), ": expected [", weight_.size(0), ", 1, ", weight_.size(2),
              "], got ", bias_.sizes());
}

void PackedLinear::check_input(const at::Tensor& x) const {
  TORCH_CHECK(x.defined(), "packed linear: input is undefined");
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3,
              "packed linear input must be (B, I) shared by all members or (K, B, I) per member; got rank ", x.dim(),
              " with shape ", x.sizes());
  TORCH_CHECK(x.size(-1) == in_features(), "packed linear input width: expected I=", in_features(), " (weight ",
              weight_.sizes(), "), got input ", x.sizes());
  TORCH_CHECK(x.dim() == 2 || x.size(0) == members(), "packed input for ", members(), " members: expected [", members(),
              ", B, ", in_features(), "], got ", x.sizes());
  TORCH_CHECK(x.device() == weight_.device(), "packed linear input is on ", x.device(), " but the weights are on ",
              weight_.device());
  TORCH_CHECK(x.scalar_type() == weight_.scalar_type(), "packed linear input dtype ", x.scalar_type(),
              " differs from the weights' ", weight_.scalar_type());
}

at::Tensor PackedLinear::batched(const at::Tensor& x) const {
  return x.dim() == 2 ? x.unsqueeze(0).expand({members(), x.size(0), x.size(1)}) : x;
}

at::Tensor PackedLinear::forward(const at::Tensor& x) const {
  if (plain_gemm()) {
    const int64_t I = in_features(), O = out_features();
    const at::Tensor rows = x.reshape({-1, I});  // (B, I)
    const at::Tensor out =
        bias_.defined() ? at::addmm(bias_.view({O}), rows, weight_.view({I, O})) : at::mm(rows, weight_.view({I, O}));
    return out.view({1, rows.size(0), O});
  }
  return bias_.defined() ? at::baddbmm(bias_, batched(x), weight_) : at::bmm(batched(x), weight_);
}

at::Tensor PackedLinear::forward_onto(const at::Tensor& residual, const at::Tensor& x) const {
  const int64_t B = x.size(-2), O = out_features();
  TORCH_CHECK(residual.dim() == 3 && residual.size(0) == members() && residual.size(1) == B && residual.size(2) == O,
              "packed linear residual for input ", x.sizes(), ": expected [", members(), ", ", B, ", ", O, "], got ",
              residual.sizes());
  // Under autocast (bf16-mixed) the sum stays float32, as a float32 residual plus a
  // bfloat16 product is in PyTorch; the fused forms below would round the residual
  // to bfloat16 (baddbmm's operands) or refuse the mix (in place).
  if (at::autocast::is_autocast_enabled(residual.device().type())) return residual + forward(x);
  // The in-place GEMM writes a fresh sum, never a view of the residual or the bias.
  if (plain_gemm()) {
    const int64_t I = in_features();
    const at::Tensor rows = x.reshape({-1, I});  // (B, I)
    if (!bias_.defined())
      return at::addmm(residual.reshape({-1, O}), rows, weight_.view({I, O})).view({1, rows.size(0), O});
    at::Tensor out = residual.reshape({-1, O}) + bias_.view({O});
    return out.addmm_(rows, weight_.view({I, O})).view({1, rows.size(0), O});
  }
  if (!bias_.defined()) return at::baddbmm(residual, batched(x), weight_);
  return (residual + bias_).baddbmm_(batched(x), weight_);
}

}  // namespace packtrain::ensemble
