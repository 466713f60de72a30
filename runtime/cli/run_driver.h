// The run driver shared by `train`, `resume` and `multitask train|resume`: what a
// training command does around its epochs, written once.
//
//  - Output: in a multi-process run rank 0 alone prints; progress and notes go to
//    stderr (none with --quiet or --json), every line also to the --log file; the
//    graph layer's log lines are printed, or collected for the --json result.
//  - Interrupts: one SIGINT handler. The first Ctrl-C asks the run to stop after the
//    current epoch (all ranks agree on the epoch: any rank's Ctrl-C stops them all);
//    a second one ends the process at once. The checkpoint is written, and the
//    command exits with status 130 naming the command that continues it.
//  - Checkpoint cadence: after every `every` epochs (the last epoch's checkpoint is
//    the caller's, after training ends), and on an interrupt.
#pragma once

#include "packtrain/graphs/graph_log.h"
#include "packtrain/runtime/cli/interrupt.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace packtrain::runtime::distributed {
class ProcessGroup;
}

namespace packtrain::cli {

// Where a run's output goes (rank 0's).
struct OutputArgs {
  bool json = false;   // the result as JSON on stdout, no progress
  bool quiet = false;  // no progress on stderr
  std::string log;     // append every progress line to this file ("" none)
};
void add_output_options(CLI::App* app, OutputArgs& output);

// When a run writes its checkpoint.
struct CheckpointArgs {
  std::string path;   // "" none
  int64_t every = 0;  // epochs between checkpoints (0: only at the end and on an interrupt)
};

class RunDriver {
 public:
  static constexpr int kInterruptedStatus = 130;

  // `group`: the run's process group (nullptr: one process). Holds the SIGINT
  // handler (interrupt.h) while it lives.
  RunDriver(OutputArgs output, CheckpointArgs checkpoint, runtime::distributed::ProcessGroup* group);
  ~RunDriver();
  RunDriver(const RunDriver&) = delete;
  RunDriver& operator=(const RunDriver&) = delete;

  bool primary() const { return primary_; }   // rank 0, or the only process
  bool json() const { return output_.json; }  // false on ranks other than 0
  const CheckpointArgs& checkpoint() const { return checkpoint_; }
  double seconds() const;  // since the driver started

  // A message on its own line: stderr (unless quiet or json) and the log.
  void note(const std::string& line);
  // An epoch's progress line: redrawn in place on a terminal, into a pipe every
  // tenth of the run (and `force`d ones), into the log every epoch.
  void progress(const std::string& line, int64_t epoch, int64_t epochs, bool force = false);
  // Ends a redrawn progress line.
  void end_line();
  // The graph layer's log: note()d, or collected for the JSON result (json mode).
  // The driver must outlive whatever holds it.
  graphs::GraphLog graph_log();
  const std::vector<std::string>& graph_log_lines() const { return graph_lines_; }

  // After each epoch, on every rank: calls `save` when a checkpoint is due (not
  // after `last_epoch`), then agrees across ranks whether to stop. True: go on.
  bool after_epoch(int64_t epoch, int64_t last_epoch, int64_t step, const std::function<void()>& save);
  // After an interrupt: rank 0 says which epoch the run stopped after and how to
  // continue it; returns kInterruptedStatus.
  int interrupted(int64_t epoch, const std::string& resume_command) const;

 private:
  // Appends a line to --log; throws DataError naming the file when it cannot.
  void write_log(const std::string& line);
  OutputArgs output_;
  CheckpointArgs checkpoint_;
  runtime::distributed::ProcessGroup* group_;
  bool primary_;
  bool tty_;
  std::FILE* log_ = nullptr;
  bool open_line_ = false;
  std::vector<std::string> graph_lines_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  Interrupts interrupts_;  // the SIGINT handler, while the run lasts
};

}  // namespace packtrain::cli
