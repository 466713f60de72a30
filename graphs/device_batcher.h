// DeviceBatcher: a whole small data set resident on the device, and the batches a
// captured step takes from it. Each epoch's order is drawn on the device (one shared
// permutation, a permutation per member, or a bootstrap resample per member) from a
// generator seeded by (seed, epoch number), so the position in the sequence of
// orders is two integers on any device (OrderState, what checkpoints store); inside
// the step, next_batch() gathers batch number `counter` and advances the counter,
// a device tensor, so U steps can be captured as one graph and no step needs the
// host.
#pragma once

#include "packtrain/base/enum_names.h"

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string_view>
#include <vector>

namespace packtrain::graphs {

enum class BatchOrder {
  kShared,     // one permutation per epoch for all members: batches are (B, ...)
  kPerMember,  // a permutation per member per epoch: batches are (K, B, ...)
  kBootstrap,  // each member draws N rows with replacement per epoch: (K, B, ...)
};

inline constexpr EnumNames<BatchOrder, 3> kBatchOrderNames{
    "batch order",
    {{{BatchOrder::kShared, "shared"}, {BatchOrder::kPerMember, "per-member"}, {BatchOrder::kBootstrap, "bootstrap"}}}};
inline std::string_view to_string(BatchOrder order) { return kBatchOrderNames.name(order); }
// Throws naming the value and the accepted names.
inline BatchOrder parse_batch_order(std::string_view name) { return kBatchOrderNames.parse(name); }

// Where a batcher is in its sequence of orders: epoch e's order is drawn from a
// generator seeded with mix(seed, e). Device-neutral: a checkpoint written on a CPU
// resumes on a GPU (each device draws its own orders from the same position).
struct OrderState {
  uint64_t seed = 0;
  int64_t epochs_drawn = 0;
};

class DeviceBatcher {
 public:
  // `data`: tensors with one common first dimension N (rows), copied to `device`
  // once. Batches of `batch_size` rows; an epoch has N / batch_size of them (the
  // last partial batch is dropped, keeping shapes static).
  DeviceBatcher(std::vector<at::Tensor> data, c10::Device device, int64_t members, int64_t batch_size, BatchOrder order,
                uint64_t seed);

  int64_t rows() const { return rows_; }
  int64_t members() const { return members_; }
  int64_t batch_size() const { return batch_size_; }
  // Rows an epoch draws from: all rows, or the active rows' count.
  int64_t epoch_rows() const { return active_.defined() ? active_.size(-1) : rows_; }
  int64_t batches_per_epoch() const { return epoch_rows() / batch_size_; }
  BatchOrder order() const { return order_; }
  c10::Device device() const { return device_; }
  const std::vector<at::Tensor>& data() const { return data_; }
  // New rows of the same shapes, copied into the resident tensors in place (captured
  // steps read those buffers and stay valid); the active rows are cleared.
  void replace_data(const std::vector<at::Tensor>& data);

  // Outside any graph: draws the next epoch's order on the device, in place, and
  // rewinds the counter. Never waits for the device.
  void start_epoch();
  // Restarts the sequence of orders from `seed` (what a fresh batcher would draw).
  void reseed(uint64_t seed);

  // Restricts the rows later epochs draw from (active learning's labelled set):
  // `rows` is (n) row indices for every member or (K, n) per member (not with
  // kShared), with batch_size <= n <= rows(). An epoch then has n / batch_size
  // batches. No buffer a graph reads is reallocated, so captured steps stay valid.
  void set_active_rows(const at::Tensor& rows);
  void clear_active_rows() { active_ = at::Tensor(); }
  const at::Tensor& active_rows() const { return active_; }

  // The position in the sequence of orders, for checkpoints; restoring it makes the
  // next start_epoch() draw what this batcher's next one would (on the same device).
  OrderState order_state() const { return {seed_, epochs_drawn_}; }
  void restore_order_state(const OrderState& state);

  // Inside a step: batch number (counter mod batches_per_epoch) of this epoch, one
  // tensor per data tensor, gathered on the device; then counter += 1.
  std::vector<at::Tensor> next_batch();

  // int64 scalar on the device: batches taken this epoch.
  const at::Tensor& counter() const { return counter_; }
  // This epoch's order: (N) for kShared, (K, N) otherwise, int64 on the device.
  const at::Tensor& epoch_order() const { return order_indices_; }

 private:
  void start_active_epoch();
  std::vector<at::Tensor> data_;
  c10::Device device_;
  int64_t rows_ = 0;
  int64_t members_ = 0;
  int64_t batch_size_ = 0;
  BatchOrder order_;
  at::Generator generator_;  // reseeded with mix(seed_, epochs_drawn_) each epoch
  uint64_t seed_ = 0;
  int64_t epochs_drawn_ = 0;
  at::Tensor order_indices_;  // static buffer, rewritten in place each epoch
  at::Tensor counter_;        // int64 scalar
  at::Tensor epoch_batches_;  // int64 scalar: batches_per_epoch() on the device
  at::Tensor active_;         // (n) or (K, n) int64 on the device; undefined: all rows
  at::Tensor batch_offsets_;  // arange(B), int64
};

}  // namespace packtrain::graphs
