#include "packtrain/runtime/cli/run_driver.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/distributed/process_group.h"

#include <fmt/format.h>

#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>

namespace packtrain::cli {

namespace {
constexpr const char* kAnnounce = "\npacktrain: stopping after this epoch (Ctrl-C again to stop at once)\n";
}  // namespace

void add_output_options(CLI::App* app, OutputArgs& o) {
  app->add_flag("--json", o.json, "Print the result as JSON on stdout (no progress)")->group("Output");
  app->add_flag("-q,--quiet", o.quiet, "No progress on stderr")->group("Output");
  app->add_option("--log", o.log, "Append plain progress lines (every epoch) to this file")->group("Output");
}

RunDriver::RunDriver(OutputArgs output, CheckpointArgs checkpoint, runtime::distributed::ProcessGroup* group)
    : output_(std::move(output)),
      checkpoint_(std::move(checkpoint)),
      group_(group),
      primary_(group == nullptr || group->rank() == 0),
      tty_(isatty(fileno(stderr)) != 0),
      interrupts_(/*end_after=*/2, primary_ && !output_.json ? kAnnounce : nullptr) {
  if (!primary_) output_ = OutputArgs{.json = false, .quiet = true, .log = ""};
  if (!output_.log.empty()) {
    log_ = std::fopen(output_.log.c_str(), "a");
    if (log_ == nullptr) {
      throw runtime::DataError(output_.log + ": cannot open the log file: " + std::strerror(errno));
    }
  }
}

RunDriver::~RunDriver() {
  end_line();
  if (log_ != nullptr) std::fclose(log_);
}

double RunDriver::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void RunDriver::write_log(const std::string& line) {
  if (log_ == nullptr) return;
  // A full disk is an error, not a silently shorter log.
  errno = 0;
  fmt::print(log_, "{}\n", line);
  if (std::fflush(log_) != 0 || std::ferror(log_) != 0) {
    const std::string why = errno != 0 ? std::strerror(errno) : "write error";
    std::fclose(log_);
    log_ = nullptr;
    throw runtime::DataError(output_.log + ": cannot write the log file: " + why);
  }
}

void RunDriver::note(const std::string& line) {
  write_log(line);
  if (output_.quiet || output_.json) return;
  end_line();
  fmt::print(stderr, "{}\n", line);
}

void RunDriver::progress(const std::string& line, int64_t epoch, int64_t epochs, bool force) {
  write_log(line);
  if (output_.quiet || output_.json) return;
  if (tty_) {
    fmt::print(stderr, "\r\033[K{}", line);
    open_line_ = true;
    return;
  }
  const int64_t every = std::max<int64_t>(1, epochs / 10);
  if (force || epoch == 1 || epoch % every == 0 || epoch == epochs) fmt::print(stderr, "{}\n", line);
}

void RunDriver::end_line() {
  if (open_line_) fmt::print(stderr, "\n");
  open_line_ = false;
}

graphs::GraphLog RunDriver::graph_log() {
  return [this](const std::string& line) {
    if (output_.json) {
      graph_lines_.push_back(line);
    } else {
      note("[packtrain] " + line);
    }
  };
}

bool RunDriver::after_epoch(int64_t epoch, int64_t last_epoch, int64_t step, const std::function<void()>& save) {
  if (checkpoint_.every > 0 && epoch % checkpoint_.every == 0 && epoch < last_epoch) save();
  // Ctrl-C reaches the ranks at different moments: all stop after the same epoch.
  const bool stop = interrupts_.presses() > 0;
  if (group_ == nullptr) return !stop;
  return !group_->any(stop, "interrupt-agreement all-reduce", step);
}

int RunDriver::interrupted(int64_t epoch, const std::string& resume_command) const {
  if (primary_) {
    fmt::print(stderr, "packtrain: interrupted after epoch {}{}\n", epoch,
               checkpoint_.path.empty() ? " (no checkpoint given: nothing saved)"
                                        : "; checkpoint saved: continue with `" + resume_command + "`");
  }
  return kInterruptedStatus;
}

}  // namespace packtrain::cli
