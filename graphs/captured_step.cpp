#include "packtrain/graphs/captured_step.h"

#include "packtrain/profiling/nvtx.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace packtrain::graphs {

std::string describe(const at::Tensor& tensor) {
  if (!tensor.defined()) return "an undefined tensor";
  std::ostringstream out;
  out << tensor.sizes() << ' ' << c10::toString(tensor.scalar_type()) << " on " << tensor.device();
  return out.str();
}

namespace {

std::string describe(const StaticInput& spec, c10::Device device) {
  std::ostringstream out;
  out << c10::IntArrayRef(spec.shape) << ' ' << c10::toString(spec.dtype) << " on " << device;
  return out.str();
}

}  // namespace

CapturedStep::CapturedStep(std::string name, c10::Device device, std::vector<StaticInput> inputs, StepFunction step,
                           CaptureOptions options, std::shared_ptr<GraphPool> pool)
    : name_(std::move(name)),
      device_(indexed_device(device)),
      specs_(std::move(inputs)),
      step_(std::move(step)),
      options_(std::move(options)),
      pool_(std::move(pool)) {
  TORCH_CHECK(step_, "step '", name_, "': no step function");
  TORCH_CHECK(device_.is_cpu() || device_.is_cuda(), "step '", name_, "': unsupported device ", device_);
  TORCH_CHECK(options_.warmup_steps() >= 1, "step '", name_, "': warmup_steps must be at least 1, got ",
              options_.warmup_steps());
  if (!options_.log()) options_.log(log_to_stderr);
  for (const StaticInput& spec : specs_) {
    static_inputs_.push_back(at::zeros(spec.shape, at::TensorOptions().dtype(spec.dtype).device(device_)));
  }
  if (!options_.capture()) {
    fall_back("capture is switched off");
  } else if (options_.backend()) {
    mode_ = StepMode::kWarmingUp;
    backend_ = options_.backend()();
  } else if (device_.is_cpu()) {
    fall_back("the device is the CPU (CUDA graphs need a CUDA device)");
  } else {
    mode_ = StepMode::kWarmingUp;
    if (!pool_) pool_ = std::make_shared<GraphPool>(device_);
    TORCH_CHECK(pool_->device() == device_, "step '", name_, "': graph pool is on ", pool_->device(), ", the step on ",
                device_);
    backend_ = make_cuda_graph_backend(device_, pool_);
  }
}

CapturedStep::~CapturedStep() = default;

void CapturedStep::fall_back(std::string reason) {
  mode_ = StepMode::kEager;
  eager_reason_ = std::move(reason);
  fallback_logged_ = false;  // said at the next eager call
}

void CapturedStep::run(const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(inputs.size() == specs_.size(), "step '", name_, "' takes ", specs_.size(), " inputs, got ",
              inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& in = inputs[i];
    const at::Tensor& buffer = static_inputs_[i];
    const bool same = in.defined() && in.sizes() == buffer.sizes() && in.scalar_type() == buffer.scalar_type() &&
                      in.device() == buffer.device();
    TORCH_CHECK(same, "step '", name_, "': input '", specs_[i].name, "' must be ", describe(specs_[i], device_),
                " (its static buffer), got ", describe(in));
    if (in.is_same(buffer)) continue;
    buffer.copy_(in, /*non_blocking=*/true);
  }
  run();
}

void CapturedStep::run() {
  ++calls_;
  switch (mode_) {
    case StepMode::kEager: return run_eager();
    case StepMode::kWarmingUp: return warm_up();
    case StepMode::kGraph: {
      PACKTRAIN_NVTX_RANGE("replay");
      backend_->replay();
      return;
    }
  }
}

void CapturedStep::run_eager() {
  if (!fallback_logged_) {
    fallback_logged_ = true;
    options_.log()("step '" + name_ + "' runs eagerly: " + eager_reason_);
  }
  PACKTRAIN_NVTX_RANGE("step");
  run_step();
}

void CapturedStep::warm_up() {
  if (warmed_up_ == options_.warmup_steps()) return capture_and_replay();
  std::string cannot_capture;
  {
    PACKTRAIN_NVTX_RANGE("warmup");
    cannot_capture = backend_->warm_up([this] { run_step(); });  // ran once, to its end, either way
  }
  ++warmed_up_;
  if (!cannot_capture.empty()) {
    fall_back("it cannot be captured as a CUDA graph: " + cannot_capture);
    options_.log()("step '" + name_ + "' runs eagerly: " + eager_reason_);
    fallback_logged_ = true;
  }
}

void CapturedStep::capture_and_replay() {
  try {
    PACKTRAIN_NVTX_RANGE("capture");
    backend_->capture([this] { run_step(); });
  } catch (const std::exception& e) {
    // Capture performed nothing of the step: this call runs it eagerly, as do the
    // later ones (the reason logged once), instead of retrying a capture that fails.
    const c10::Error* torch_error = dynamic_cast<const c10::Error*>(&e);
    const std::string what = torch_error ? torch_error->what_without_backtrace() : e.what();
    fall_back("its capture failed: " + what.substr(0, what.find('\n')));
    return run_eager();
  }
  graph_nodes_by_kind_ = backend_->nodes_by_kind();
  graph_nodes_ = 0;
  for (const auto& [kind, n] : graph_nodes_by_kind_) graph_nodes_ += n;
  mode_ = StepMode::kGraph;
  ++captures_;
  PACKTRAIN_NVTX_RANGE("replay");
  backend_->replay();  // capture only recorded the step; this call performs it
}

}  // namespace packtrain::graphs
