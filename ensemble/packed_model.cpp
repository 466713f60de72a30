#include "packtrain/ensemble/packed_model.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace packtrain::ensemble {

at::Tensor PackedModel::forward(const at::Tensor& x) const {
  const PrecisionScope scope(precision_, device().type());  // inactive for fp32
  return forward_layers(x).to(dtype());                     // fp32: the same tensor, no copy
}

std::vector<int64_t> members_to_reinitialize(const at::Tensor& which, int64_t members) {
  std::vector<int64_t> selected;
  if (!which.defined()) {
    for (int64_t k = 0; k < members; ++k) selected.push_back(k);
    return selected;
  }
  TORCH_CHECK(which.dim() == 1 && which.size(0) == members && which.scalar_type() == at::kBool,
              "reinitialize: the member selection must be a bool tensor of shape [", members, "], got ",
              which.scalar_type(), " ", which.sizes());
  const at::Tensor host = which.cpu().contiguous();
  const bool* flags = host.data_ptr<bool>();
  for (int64_t k = 0; k < members; ++k) {
    if (flags[k]) selected.push_back(k);
  }
  return selected;
}

}  // namespace packtrain::ensemble
