// What every packtrain subcommand shares: the error that means "bad usage" (exit
// status 2), device selection, joining a launched run's process group, and final
// writes that fail without taking the run's results with them.
#pragma once

#include "packtrain/runtime/io/checkpoint_file.h"

#include <c10/core/Device.h>

#include <exception>
#include <memory>
#include <stdexcept>
#include <string>

namespace packtrain::runtime {
namespace distributed {
class ProcessGroup;
}
}

namespace packtrain::cli {

// A bad argument the parser could not catch (exit status 2, like DataError).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "auto" (CUDA when present, else CPU), "cpu", "cuda" or "cuda:N". In a
// multi-process run (torchrun, srun, packtrain launch) "auto" and "cuda" mean this
// rank's GPU, cuda:LOCAL_RANK: one GPU per process.
c10::Device pick_device(const std::string& name);

// Under torchrun, srun or packtrain launch (any number of processes, one too):
// joins the run's process group (Gloo, and NCCL on `device` when it is a GPU);
// started alone: nullptr.
std::unique_ptr<runtime::distributed::ProcessGroup> join_if_launched(c10::Device device);

// A run's last writes (the final checkpoint, an export, a learning curve) can
// still fail after the checks made before training (the disk filled up meanwhile):
// the results are printed first, then the first failure ends the command.
//   DeferredWriteError writes;
//   writes.attempt([&] { save(); });
//   print_metrics(...);
//   return writes.rethrow_or(0);
class DeferredWriteError {
 public:
  // Whether the write succeeded.
  template <typename Write>
  bool attempt(Write&& write) {
    try {
      write();
      return true;
    } catch (const runtime::WriteError&) {
      if (!error_) error_ = std::current_exception();
      return false;
    }
  }
  int rethrow_or(int status) const {
    if (error_) std::rethrow_exception(error_);
    return status;
  }

 private:
  std::exception_ptr error_;
};

}  // namespace packtrain::cli
