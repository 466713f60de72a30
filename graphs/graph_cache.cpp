#include "packtrain/graphs/graph_cache.h"

#include "packtrain/profiling/nvtx.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace packtrain::graphs {

namespace {
std::string shape_text(const std::vector<std::vector<int64_t>>& shapes) {
  std::ostringstream out;
  for (size_t i = 0; i < shapes.size(); ++i) out << (i ? ", " : "") << c10::IntArrayRef(shapes[i]);
  return out.str();
}
}  // namespace

GraphCache::GraphCache(std::string name, c10::Device device, std::vector<InputKind> inputs, StepFunction step,
                       CaptureOptions options, std::shared_ptr<GraphPool> pool, size_t capacity)
    : name_(std::move(name)),
      device_(indexed_device(device)),
      kinds_(std::move(inputs)),
      step_(std::move(step)),
      options_(std::move(options)),
      pool_(std::move(pool)),
      capacity_(capacity) {
  TORCH_CHECK(capacity_ >= 1, "graph cache '", name_, "': capacity must be at least 1");
  if (!options_.log()) options_.log(log_to_stderr);
  if (!pool_ && device_.is_cuda()) pool_ = std::make_shared<GraphPool>(device_);
}

const CapturedStep* GraphCache::find(const std::vector<std::vector<int64_t>>& shapes) const {
  const auto it = steps_.find(shapes);
  return it == steps_.end() ? nullptr : it->second.get();
}

void GraphCache::run(const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(inputs.size() == kinds_.size(), "step '", name_, "' takes ", kinds_.size(), " inputs, got ",
              inputs.size());
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& in = inputs[i];
    const InputKind& kind = kinds_[i];
    TORCH_CHECK(in.defined() && in.dim() == kind.rank && in.scalar_type() == kind.dtype && in.device() == device_,
                "step '", name_, "': input '", kind.name, "' must be a ", kind.rank, "-d ", c10::toString(kind.dtype),
                " tensor on ", device_, ", got ", describe(in));
    shapes.push_back(in.sizes().vec());
  }
  if (auto it = steps_.find(shapes); it != steps_.end()) return it->second->run(inputs);
  if (steps_.size() < capacity_) {
    std::vector<StaticInput> specs;
    for (size_t i = 0; i < inputs.size(); ++i) specs.push_back({kinds_[i].name, shapes[i], kinds_[i].dtype});
    auto step = std::make_unique<CapturedStep>(name_ + " " + shape_text(shapes), device_, std::move(specs), step_,
                                               options_, pool_);
    CapturedStep& ref = *step;
    steps_.emplace(shapes, std::move(step));
    return ref.run(inputs);
  }
  if (!overflow_logged_[shapes]) {
    overflow_logged_[shapes] = true;
    options_.log()("step '" + name_ + "' runs eagerly for shapes " + shape_text(shapes) + ": its graph cache holds " +
                   std::to_string(capacity_) + " shapes already");
  }
  ++overflow_calls_;
  PACKTRAIN_NVTX_RANGE("step");
  step_(inputs);
}

}  // namespace packtrain::graphs
