// Flat storage for a pack's parameters and gradients.
//
// All parameters of the K members live in one flat (N) buffer, gradients in another
// of the same layout: parameter i is the contiguous block [offset_i, offset_i + K*n_i)
// holding its (K, ...) member-major tensor. So zeroing gradients and a gradient
// all-reduce each touch one tensor, every parameter and gradient is a dense view
// (autograd's gradient layout contract holds and accumulates in place), and the
// addresses a captured graph records never change.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <string>
#include <vector>

namespace packtrain::ensemble {

// One parameter of one member: its name and its per-member shape (no K).
struct ParameterSpec {
  std::string name;
  std::vector<int64_t> shape;  // e.g. {I, O} for a weight, {1, O} for a bias
};

class PackedParameters {
 public:
  PackedParameters() = default;
  // Allocates zeroed data and gradient buffers for `members` members.
  PackedParameters(int64_t members, std::vector<ParameterSpec> specs, c10::TensorOptions options);

  int64_t members() const { return members_; }
  // P: the number of scalars one member has; N = K * P.
  int64_t per_member() const { return per_member_; }
  const at::Tensor& flat() const { return data_; }       // (N)
  const at::Tensor& flat_grad() const { return grad_; }  // (N)
  size_t size() const { return specs_.size(); }
  const ParameterSpec& spec(size_t i) const { return specs_.at(i); }
  // (K, ...) leaf view of parameter i, requires grad; its .grad() is a view into grad().
  const at::Tensor& operator[](size_t i) const { return views_.at(i); }
  const at::Tensor& at(const std::string& name) const;
  const std::vector<at::Tensor>& tensors() const { return views_; }
  // Scalars one member has in parameter i (n_i), and where parameter i starts in a
  // member's row of P scalars (the order pack/unpack and initialization use).
  int64_t numel(size_t i) const { return numels_.at(i); }
  int64_t row_offset(size_t i) const { return row_offsets_.at(i); }

  // (K, n_i) views of parameter i's block in `flat_like`, an (N) tensor with this
  // layout (the data, the gradients, or optimizer state made by zeros_like(flat())).
  std::vector<at::Tensor> blocks(const at::Tensor& flat_like) const;

  // Member k's parameters as one (P) row, and its inverse: write rows (M, P) into
  // the members listed in `members` (M). In place; no tensor is reallocated.
  at::Tensor member_row(int64_t k) const;
  void write_member_rows(const at::Tensor& rows, const std::vector<int64_t>& members);

  // Zeroes all gradients in place (never resets them to undefined).
  void zero_grad();
  // Re-points every parameter's .grad() at its view of grad() (autograd never
  // replaces a defined gradient, but user code might).
  void bind_grads();

 private:
  int64_t members_ = 0;
  int64_t per_member_ = 0;
  std::vector<ParameterSpec> specs_;
  std::vector<int64_t> numels_;         // n_i
  std::vector<int64_t> row_offsets_;    // sum of n_j for j < i
  at::Tensor data_;                     // (N)
  at::Tensor grad_;                     // (N)
  std::vector<at::Tensor> views_;       // (K, ...) parameters
  std::vector<at::Tensor> grad_views_;  // (K, ...) gradients
};

}  // namespace packtrain::ensemble
