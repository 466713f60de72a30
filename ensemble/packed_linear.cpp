#include "packtrain/ensemble/packed_linear.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace packtrain::ensemble {

PackedLinear::PackedLinear(at::Tensor weight, at::Tensor bias)
    : weight_(std::move(weight)), bias_(std::move(bias)) {
  TORCH_CHECK(weight_.dim() == 3, "packed weight must be (K, I, O), got ", weight_.sizes());
  TORCH_CHECK(bias_.dim() == 3 && bias_.size(0) == weight_.size(0) && bias_.size(1) == 1 &&
                  bias_.size(2) == weight_.size(2),
              "packed bias for weight ", weight_.sizes(), ": expected [", weight_.size(0), ", 1, ",
              weight_.size(2), "], got ", bias_.sizes());
}

void PackedLinear::check_input(const at::Tensor& x) const {
  TORCH_CHECK(x.defined(), "packed linear: input is undefined");
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3,
              "packed linear input must be (B, I) shared by all members or (K, B, I) per member; got rank ",
              x.dim(), " with shape ", x.sizes());
  TORCH_CHECK(x.size(-1) == in_features(), "packed linear input width: expected I=", in_features(),
              " (weight ", weight_.sizes(), "), got input ", x.sizes());
  TORCH_CHECK(x.dim() == 2 || x.size(0) == members(), "packed input for ", members(),
              " members: expected [", members(), ", B, ", in_features(), "], got ", x.sizes());
  TORCH_CHECK(x.device() == weight_.device(), "packed linear input is on ", x.device(),
              " but the weights are on ", weight_.device());
  TORCH_CHECK(x.scalar_type() == weight_.scalar_type(), "packed linear input dtype ",
              x.scalar_type(), " differs from the weights' ", weight_.scalar_type());
}

at::Tensor PackedLinear::forward(const at::Tensor& x) const {
  // A shared batch is broadcast over members with a stride-0 view, not copied.
  const at::Tensor batched = x.dim() == 2 ? x.unsqueeze(0).expand({members(), x.size(0), x.size(1)}) : x;
  return at::baddbmm(bias_, batched, weight_);
}

}  // namespace packtrain::ensemble
