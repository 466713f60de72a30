#include "packtrain/runtime/cli/progress.h"

#include "packtrain/runtime/cli/run_driver.h"

#include <fmt/format.h>

#include <cmath>

namespace packtrain::cli {

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::epoch(const runtime::EpochReport& r, int64_t members) {
  if (first_epoch_ < 0) first_epoch_ = r.epoch - 1;
  // Members that trained this epoch: those active after the previous one.
  member_steps_ += r.steps * (active_ < 0 ? members : active_);
  active_ = r.active;
  const double elapsed = seconds();
  rate_ = elapsed > 0 ? static_cast<double>(member_steps_) / elapsed : 0;
  const double per_epoch = elapsed / static_cast<double>(r.epoch - first_epoch_);
  const double eta = r.active == 0 ? 0 : per_epoch * static_cast<double>(r.epochs - r.epoch);
  const std::string val = std::isnan(r.val_loss) ? "" : fmt::format("  val {:8.4f}", r.val_loss);
  driver_->progress(
      fmt::format("epoch {:>4}/{}  train {:8.4f}{}  active {:>3}/{}  {:>9.0f} member-steps/s  ETA {:5.1f}s", r.epoch,
                  r.epochs, r.train_loss, val, r.active, members, rate_, eta),
      r.epoch, r.epochs, /*force=*/r.active == 0);
  for (const std::string& event : r.events) driver_->note(event);
}

}  // namespace packtrain::cli
