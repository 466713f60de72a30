#include "packtrain/profiling/step_timer.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <vector>

namespace packtrain::profiling {

struct StepTimer::Impl {
  struct Interval {
    at::cuda::CUDAEvent start{cudaEventDefault};  // timing enabled
    at::cuda::CUDAEvent stop{cudaEventDefault};
    int64_t steps = 0;
  };
  explicit Impl(c10::Device d) : device(d) {}
  c10::Device device;
  bool open = false;
  // CUDA: intervals [0, used) are pending; their events are reused after read().
  std::vector<Interval> intervals;
  size_t used = 0;
  // CPU: host clock.
  std::chrono::steady_clock::time_point cpu_start;
  StepTiming cpu_total;
};

StepTimer::StepTimer(c10::Device device) : impl_(std::make_unique<Impl>(device)) {
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "StepTimer: unsupported device ", device);
}

StepTimer::~StepTimer() = default;

void StepTimer::begin() {
  TORCH_CHECK(!impl_->open, "StepTimer::begin: the previous interval was not ended");
  impl_->open = true;
  if (impl_->device.is_cpu()) {
    impl_->cpu_start = std::chrono::steady_clock::now();
    return;
  }
  if (impl_->used == impl_->intervals.size()) impl_->intervals.emplace_back();
  impl_->intervals[impl_->used].start.record(c10::cuda::getCurrentCUDAStream(impl_->device.index()));
}

void StepTimer::end(int64_t steps) {
  TORCH_CHECK(impl_->open, "StepTimer::end without begin");
  impl_->open = false;
  if (impl_->device.is_cpu()) {
    impl_->cpu_total.device_us +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - impl_->cpu_start).count();
    impl_->cpu_total.steps += steps;
    return;
  }
  Impl::Interval& interval = impl_->intervals[impl_->used++];
  interval.stop.record(c10::cuda::getCurrentCUDAStream(impl_->device.index()));
  interval.steps = steps;
}

StepTiming StepTimer::read() {
  TORCH_CHECK(!impl_->open, "StepTimer::read inside an open interval");
  if (impl_->device.is_cpu()) return std::exchange(impl_->cpu_total, StepTiming{});
  StepTiming total;
  for (size_t i = 0; i < impl_->used; ++i) {
    Impl::Interval& interval = impl_->intervals[i];
    interval.stop.synchronize();
    total.device_us += 1000.0 * interval.start.elapsed_time(interval.stop);
    total.steps += interval.steps;
  }
  impl_->used = 0;
  return total;
}

}  // namespace packtrain::profiling
