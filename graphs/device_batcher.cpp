#include "graphs/device_batcher.h"

#include "profiling/nvtx.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <string>

namespace packtrain::graphs {

std::string_view to_string(BatchOrder order) {
  switch (order) {
    case BatchOrder::kShared: return "shared";
    case BatchOrder::kPerMember: return "per-member";
    case BatchOrder::kBootstrap: return "bootstrap";
  }
  return "?";
}

BatchOrder parse_batch_order(std::string_view name) {
  if (name == "shared") return BatchOrder::kShared;
  if (name == "per-member") return BatchOrder::kPerMember;
  if (name == "bootstrap") return BatchOrder::kBootstrap;
  TORCH_CHECK(false, "unknown batch order '", std::string(name), "' (expected shared, per-member or bootstrap)");
}

namespace {
at::Generator make_generator(c10::Device device, uint64_t seed) {
  if (device.is_cuda()) {
    at::Generator g = at::make_generator<at::CUDAGeneratorImpl>(device.index() < 0 ? 0 : device.index());
    g.set_current_seed(seed);
    return g;
  }
  return at::make_generator<at::CPUGeneratorImpl>(seed);
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
  TORCH_CHECK(batch_size <= rows_, "device batcher: batch size ", batch_size, " is larger than the data set (",
              rows_, " rows)");
  if (device_.is_cuda() && device_.index() < 0) device_ = c10::Device(c10::kCUDA, 0);
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  order_indices_ = order_ == BatchOrder::kShared ? at::arange(rows_, longs)
                                                 : at::arange(rows_, longs).expand({members_, rows_}).contiguous();
  counter_ = at::zeros({}, longs);
  batch_offsets_ = at::arange(batch_size_, longs);
  generator_ = make_generator(device_, seed);
}

void DeviceBatcher::reseed(uint64_t seed) { generator_ = make_generator(device_, seed); }

void DeviceBatcher::start_epoch() {
  PACKTRAIN_NVTX_RANGE("shuffle");
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  switch (order_) {
    case BatchOrder::kShared:
      order_indices_.copy_(at::randperm(rows_, generator_, longs));
      break;
    case BatchOrder::kPerMember:
      // Sorting K rows of uniform keys gives K independent uniform permutations.
      order_indices_.copy_(at::rand({members_, rows_}, generator_, at::TensorOptions().device(device_)).argsort(/*dim=*/1, /*descending=*/false));
      break;
    case BatchOrder::kBootstrap:
      order_indices_.copy_(at::randint(rows_, {members_, rows_}, generator_, longs));
      break;
  }
  counter_.zero_();
}

std::vector<at::Tensor> DeviceBatcher::next_batch() {
  PACKTRAIN_NVTX_RANGE("gather");
  // Positions of this batch in the epoch's order; the modulo keeps an overrun in range.
  const at::Tensor positions = counter_.remainder(batches_per_epoch()).mul(batch_size_).add(batch_offsets_);
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
