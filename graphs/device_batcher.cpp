#include "packtrain/graphs/device_batcher.h"

#include "packtrain/profiling/nvtx.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <string>

namespace packtrain::graphs {

namespace {
at::Generator make_generator(c10::Device device) {
  if (device.is_cuda()) return at::make_generator<at::CUDAGeneratorImpl>(device.index() < 0 ? 0 : device.index());
  return at::make_generator<at::CPUGeneratorImpl>();
}

// splitmix64's finalizer over (seed, epoch): distinct, well-mixed seeds per epoch.
uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(epoch) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

DeviceBatcher::DeviceBatcher(std::vector<at::Tensor> data, c10::Device device, int64_t members, int64_t batch_size,
                             BatchOrder order, uint64_t seed)
    : device_(device), members_(members), batch_size_(batch_size), order_(order) {
  TORCH_CHECK(!data.empty(), "device batcher: no data tensors");
  TORCH_CHECK(members > 0, "device batcher: members must be positive, got ", members);
  TORCH_CHECK(batch_size > 0, "device batcher: batch size must be positive, got ", batch_size);
  rows_ = data.front().dim() > 0 ? data.front().size(0) : 0;
  for (const at::Tensor& t : data) {
    TORCH_CHECK(t.dim() > 0 && t.size(0) == rows_, "device batcher: every data tensor needs ", rows_,
                " rows, got a tensor of shape ", t.sizes());
    data_.push_back(t.to(device).contiguous());
  }
  TORCH_CHECK(batch_size <= rows_, "device batcher: batch size ", batch_size, " is larger than the data set (", rows_,
              " rows)");
  if (device_.is_cuda() && device_.index() < 0) device_ = c10::Device(c10::kCUDA, 0);
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  order_indices_ = order_ == BatchOrder::kShared ? at::arange(rows_, longs)
                                                 : at::arange(rows_, longs).expand({members_, rows_}).contiguous();
  counter_ = at::zeros({}, longs);
  epoch_batches_ = at::full({}, batches_per_epoch(), longs);
  batch_offsets_ = at::arange(batch_size_, longs);
  generator_ = make_generator(device_);
  seed_ = seed;
}

void DeviceBatcher::reseed(uint64_t seed) { restore_order_state({seed, 0}); }

void DeviceBatcher::replace_data(const std::vector<at::Tensor>& data) {
  TORCH_CHECK(data.size() == data_.size(), "device batcher: replace_data needs ", data_.size(), " tensors, got ",
              data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    TORCH_CHECK(data[i].sizes() == data_[i].sizes(), "device batcher: replace_data needs tensor ", i, " shaped ",
                data_[i].sizes(), ", got ", data[i].sizes());
  }
  for (size_t i = 0; i < data.size(); ++i) data_[i].copy_(data[i]);
  active_ = at::Tensor();
}

void DeviceBatcher::restore_order_state(const OrderState& state) {
  TORCH_CHECK(state.epochs_drawn >= 0, "device batcher: negative epoch count ", state.epochs_drawn);
  seed_ = state.seed;
  epochs_drawn_ = state.epochs_drawn;
}

void DeviceBatcher::set_active_rows(const at::Tensor& rows) {
  TORCH_CHECK(rows.scalar_type() == at::kLong && (rows.dim() == 1 || (rows.dim() == 2 && rows.size(0) == members_)),
              "device batcher: active rows must be (n) or (", members_, ", n) int64, got ", rows.sizes(), " ",
              rows.scalar_type());
  TORCH_CHECK(rows.dim() == 1 || order_ != BatchOrder::kShared,
              "device batcher: per-member active rows need a per-member or bootstrap order, not shared");
  const int64_t n = rows.size(-1);
  TORCH_CHECK(n >= batch_size_ && n <= rows_, "device batcher: ", n, " active rows, expected between the batch size ",
              batch_size_, " and the data set's ", rows_, " rows");
  TORCH_CHECK(rows.min().item<int64_t>() >= 0 && rows.max().item<int64_t>() < rows_,
              "device batcher: active row index out of range [0, ", rows_, ")");
  active_ = order_ == BatchOrder::kShared || rows.dim() == 2 ? rows.to(device_).contiguous()
                                                             : rows.to(device_).expand({members_, n}).contiguous();
}

void DeviceBatcher::start_epoch() {
  PACKTRAIN_NVTX_RANGE("shuffle");
  epoch_batches_.fill_(batches_per_epoch());
  counter_.zero_();
  generator_.set_current_seed(epoch_seed(seed_, epochs_drawn_++));  // private: no other user to lock out
  if (active_.defined()) return start_active_epoch();
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  switch (order_) {
    case BatchOrder::kShared: order_indices_.copy_(at::randperm(rows_, generator_, longs)); break;
    case BatchOrder::kPerMember:
      // Sorting K rows of uniform keys gives K independent uniform permutations.
      order_indices_.copy_(at::rand({members_, rows_}, generator_, at::TensorOptions().device(device_))
                               .argsort(/*dim=*/1, /*descending=*/false));
      break;
    case BatchOrder::kBootstrap: order_indices_.copy_(at::randint(rows_, {members_, rows_}, generator_, longs)); break;
  }
}

void DeviceBatcher::start_active_epoch() {
  // The same draws as over all rows, over positions 0..n-1 of the active rows, mapped
  // to their row indices; the order's tail past n is never reached (the counter
  // wraps at n / B batches).
  const int64_t n = active_.size(-1);
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  switch (order_) {
    case BatchOrder::kShared:
      order_indices_.narrow(0, 0, n).copy_(active_.index_select(0, at::randperm(n, generator_, longs)));
      break;
    case BatchOrder::kPerMember:
      order_indices_.narrow(1, 0, n).copy_(active_.gather(
          1, at::rand({members_, n}, generator_, at::TensorOptions().device(device_)).argsort(1, false)));
      break;
    case BatchOrder::kBootstrap:
      order_indices_.narrow(1, 0, n).copy_(active_.gather(1, at::randint(n, {members_, n}, generator_, longs)));
      break;
  }
}

std::vector<at::Tensor> DeviceBatcher::next_batch() {
  PACKTRAIN_NVTX_RANGE("gather");
  // Positions of this batch in the epoch's order; the modulo keeps an overrun in range.
  const at::Tensor positions = counter_.remainder(epoch_batches_).mul(batch_size_).add(batch_offsets_);
  std::vector<at::Tensor> batch;
  if (order_ == BatchOrder::kShared) {
    const at::Tensor rows = order_indices_.index_select(0, positions);  // (B)
    for (const at::Tensor& t : data_) batch.push_back(t.index_select(0, rows));
  } else {
    const at::Tensor rows = order_indices_.index_select(1, positions).reshape({-1});  // (K*B)
    for (const at::Tensor& t : data_) {
      std::vector<int64_t> shape{members_, batch_size_};
      shape.insert(shape.end(), t.sizes().begin() + 1, t.sizes().end());
      batch.push_back(t.index_select(0, rows).view(shape));
    }
  }
  counter_.add_(1);
  return batch;
}

}  // namespace packtrain::graphs
