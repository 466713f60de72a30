// The per-epoch progress line of the training commands: loss, validation loss,
// active members, member-steps/s and ETA. On a terminal it redraws in place; into
// a pipe it prints a plain line every few epochs; a log file gets every epoch.
#pragma once

#include "runtime/ensemble_trainer.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

namespace packtrain::cli {

class Progress {
 public:
  // `enabled`: print to stderr; `log_path`: also append plain lines there ("" none).
  Progress(bool enabled, const std::string& log_path);
  ~Progress();

  // After each epoch; `members` is the pack's size.
  void epoch(const runtime::EpochReport& report, int64_t members);
  // A message on its own line (also logged).
  void note(const std::string& text);
  // Ends a redrawn line.
  void finish();

  double seconds() const;
  double member_steps_per_second() const { return rate_; }

 private:
  bool enabled_;
  bool tty_;
  std::FILE* log_ = nullptr;
  bool open_line_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  int64_t first_epoch_ = -1;
  int64_t member_steps_ = 0;
  int64_t active_ = -1;  // members training during the last epoch
  double rate_ = 0;
};

}  // namespace packtrain::cli
