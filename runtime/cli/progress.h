// The ensemble commands' per-epoch progress line: loss, validation loss, active
// members, member-steps/s and ETA, printed through the run driver (which decides
// where it goes), with the members that stopped or diverged as notes.
#pragma once

#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"

#include <chrono>
#include <cstdint>

namespace packtrain::cli {

class RunDriver;

class Progress {
 public:
  explicit Progress(RunDriver& driver) : driver_(&driver) {}

  // After each epoch; `members` is the pack's size.
  void epoch(const runtime::EpochReport& report, int64_t members);

  double seconds() const;  // since the first epoch began
  double member_steps_per_second() const { return rate_; }

 private:
  RunDriver* driver_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  int64_t first_epoch_ = -1;
  int64_t member_steps_ = 0;
  int64_t active_ = -1;  // members training during the last epoch
  double rate_ = 0;
};

}  // namespace packtrain::cli
