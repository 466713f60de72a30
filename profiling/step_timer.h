// Device time of training steps: a pair of CUDA events on the current stream
// around each timed interval, read back once per epoch (one wait per read, none
// per step). On CPU a step is synchronous and the host clock is the device clock.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

namespace packtrain::profiling {

struct StepTiming {
  double device_us = 0;  // total over the intervals read
  int64_t steps = 0;
  double us_per_step() const { return steps > 0 ? device_us / static_cast<double>(steps) : 0.0; }
};

class StepTimer {
 public:
  explicit StepTimer(c10::Device device);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  // Marks the start of an interval on the current stream; end() closes it after
  // `steps` steps. Neither waits for the device.
  /// Example: timer.begin(); for (...) step(); timer.end(steps); ... auto t = timer.read();
  void begin();
  void end(int64_t steps);
  // Waits for the closed intervals, returns their total and forgets them.
  StepTiming read();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace packtrain::profiling
