#include "packtrain/ensemble/packed_parameters.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>

namespace packtrain::ensemble {

PackedParameters::PackedParameters(int64_t members, std::vector<ParameterSpec> specs, c10::TensorOptions options)
    : members_(members), specs_(std::move(specs)) {
  TORCH_CHECK(members > 0, "a pack needs at least one member, got members=", members);
  TORCH_CHECK(!specs_.empty(), "a pack needs at least one parameter");
  for (const auto& spec : specs_) {
    int64_t numel = 1;
    for (int64_t d : spec.shape) {
      TORCH_CHECK(d > 0, "parameter '", spec.name, "' has a non-positive dimension in shape ",
                  c10::IntArrayRef(spec.shape));
      numel *= d;
    }
    row_offsets_.push_back(per_member_);
    numels_.push_back(numel);
    per_member_ += numel;
  }
  at::NoGradGuard no_grad;
  data_ = at::zeros({members_ * per_member_}, options.requires_grad(false));
  grad_ = at::zeros({members_ * per_member_}, options.requires_grad(false));
  int64_t offset = 0;
  for (size_t i = 0; i < specs_.size(); ++i) {
    std::vector<int64_t> shape{members_};
    shape.insert(shape.end(), specs_[i].shape.begin(), specs_[i].shape.end());
    const int64_t block = members_ * numels_[i];
    // detach() makes each view a leaf that shares the flat storage.
    views_.push_back(data_.narrow(0, offset, block).view(shape).detach().requires_grad_(true));
    grad_views_.push_back(grad_.narrow(0, offset, block).view(shape));
    offset += block;
  }
  bind_grads();
}

const at::Tensor& PackedParameters::at(const std::string& name) const {
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].name == name) return views_[i];
  }
  TORCH_CHECK(false, "no parameter named '", name, "' in this pack");
}

std::vector<at::Tensor> PackedParameters::blocks(const at::Tensor& flat_like) const {
  TORCH_CHECK(flat_like.dim() == 1 && flat_like.size(0) == data_.size(0),
              "flat tensor for this pack's layout: expected [", data_.size(0), "], got ", flat_like.sizes());
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const int64_t block = members_ * numels_[i];
    out.push_back(flat_like.narrow(0, offset, block).view({members_, numels_[i]}));
    offset += block;
  }
  return out;
}

at::Tensor PackedParameters::member_row(int64_t k) const {
  TORCH_CHECK(k >= 0 && k < members_, "member ", k, " out of range for a pack of ", members_, " members");
  std::vector<at::Tensor> parts;
  for (const at::Tensor& block : blocks(data_)) parts.push_back(block[k]);
  return at::cat(parts);
}

void PackedParameters::write_member_rows(const at::Tensor& rows, const std::vector<int64_t>& members) {
  const int64_t M = static_cast<int64_t>(members.size());
  TORCH_CHECK(rows.dim() == 2 && rows.size(0) == M && rows.size(1) == per_member_, "member rows: expected [", M, ", ",
              per_member_, "], got ", rows.sizes());
  for (int64_t k : members) {
    TORCH_CHECK(k >= 0 && k < members_, "member ", k, " out of range for a pack of ", members_, " members");
  }
  at::NoGradGuard no_grad;
  const at::Tensor source = rows.to(data_.options());
  const auto targets = blocks(data_);
  if (M == members_) {
    bool identity = true;
    for (int64_t j = 0; j < M; ++j) identity = identity && members[j] == j;
    if (identity) {
      for (size_t i = 0; i < targets.size(); ++i) targets[i].copy_(source.narrow(1, row_offsets_[i], numels_[i]));
      return;
    }
  }
  const at::Tensor index = at::tensor(members, at::kLong).to(data_.device());
  for (size_t i = 0; i < targets.size(); ++i) {
    targets[i].index_copy_(0, index, source.narrow(1, row_offsets_[i], numels_[i]));
  }
}

void PackedParameters::zero_grad() {
  grad_.zero_();
  bind_grads();
}

void PackedParameters::bind_grads() {
  for (size_t i = 0; i < views_.size(); ++i) {
    const auto& current = views_[i].grad();
    if (!current.defined() || !current.is_same(grad_views_[i])) {
      views_[i].mutable_grad() = grad_views_[i];
    }
  }
}

}  // namespace packtrain::ensemble
