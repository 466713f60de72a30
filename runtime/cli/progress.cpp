#include "runtime/cli/progress.h"

#include "runtime/data_error.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <unistd.h>

namespace packtrain::cli {

Progress::Progress(bool enabled, const std::string& log_path)
    : enabled_(enabled), tty_(isatty(fileno(stderr)) != 0) {
  if (log_path.empty()) return;
  log_ = std::fopen(log_path.c_str(), "a");
  if (log_ == nullptr) throw runtime::DataError(log_path + ": cannot open the log file: " + std::strerror(errno));
}

Progress::~Progress() {
  if (log_ != nullptr) std::fclose(log_);
}

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
  const std::string text = fmt::format("epoch {:>4}/{}  train {:8.4f}{}  active {:>3}/{}  {:>9.0f} member-steps/s  ETA {:5.1f}s",
                                       r.epoch, r.epochs, r.train_loss, val, r.active, members, rate_, eta);
  if (log_ != nullptr) {
    fmt::print(log_, "{}\n", text);
    std::fflush(log_);
  }
  for (const std::string& event : r.events) note(event);
  if (!enabled_) return;
  if (tty_) {
    fmt::print(stderr, "\r\033[K{}", text);
    open_line_ = true;
    return;
  }
  const int64_t every = std::max<int64_t>(1, r.epochs / 10);
  if (r.epoch == 1 || r.epoch % every == 0 || r.epoch == r.epochs || r.active == 0) fmt::print(stderr, "{}\n", text);
}

void Progress::note(const std::string& text) {
  if (log_ != nullptr) {
    fmt::print(log_, "{}\n", text);
    std::fflush(log_);
  }
  if (!enabled_) return;
  finish();
  fmt::print(stderr, "{}\n", text);
}

void Progress::finish() {
  if (open_line_) fmt::print(stderr, "\n");
  open_line_ = false;
}

}  // namespace packtrain::cli
