#include "packtrain/graphs/async_readback.h"

#include "packtrain/profiling/nvtx.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

namespace packtrain::graphs {

struct AsyncReadback::Pending {
  at::Tensor host;
  std::optional<at::cuda::CUDAEvent> landed;  // none on CPU
};

AsyncReadback::AsyncReadback() = default;
AsyncReadback::~AsyncReadback() = default;
AsyncReadback::AsyncReadback(AsyncReadback&&) noexcept = default;
AsyncReadback& AsyncReadback::operator=(AsyncReadback&&) noexcept = default;

void AsyncReadback::request(const at::Tensor& source) {
  PACKTRAIN_NVTX_RANGE("readback");
  auto p = std::make_unique<Pending>();
  if (source.is_cuda()) {
    p->host = at::empty(source.sizes(), source.options().device(at::kCPU).pinned_memory(true));
    p->host.copy_(source, /*non_blocking=*/true);
    p->landed.emplace();
    p->landed->record(c10::cuda::getCurrentCUDAStream(source.device().index()));
  } else {
    p->host = source.clone();
  }
  pending_.push_back(std::move(p));
}

std::vector<at::Tensor> AsyncReadback::poll() {
  std::vector<at::Tensor> out;
  while (!pending_.empty() && (!pending_.front()->landed || pending_.front()->landed->query())) {
    out.push_back(std::move(pending_.front()->host));
    pending_.pop_front();
  }
  return out;
}

std::vector<at::Tensor> AsyncReadback::wait() {
  std::vector<at::Tensor> out;
  for (auto& p : pending_) {
    if (p->landed) p->landed->synchronize();
    out.push_back(std::move(p->host));
  }
  pending_.clear();
  return out;
}

size_t AsyncReadback::pending() const { return pending_.size(); }

}  // namespace packtrain::graphs
