// What every packtrain subcommand shares: the error that means "bad usage" (exit
// status 2), device selection, joining a launched run's process group, and final
// writes that fail without taking the run's results with them.
#pragma once

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/io/checkpoint_file.h"

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

namespace packtrain::runtime {
namespace distributed {
class ProcessGroup;
}
}  // namespace packtrain::runtime

namespace packtrain::cli {

// A bad argument the parser could not catch: a UserError (exit status 2, like DataError).
class UsageError : public UserError {
 public:
  using UserError::UserError;
};

// Whether `e` is an allocation that failed: c10::OutOfMemoryError (a GPU), or the
// CPU allocator's "DefaultCPUAllocator: can't allocate memory" (a plain c10::Error).
bool is_allocation_failure(const c10::Error& e);

// Runs `work`, which allocates as much as the user asked for (a table's rows, a
// sweep's members): an allocation that fails there is the size asked for, not a
// fault, and becomes UsageError "<what> does not fit in memory: <advice>".
//   within_memory("the pool pool.csv", "acquire from fewer rows", [&] { return score(pool); });
template <typename Work>
auto within_memory(const std::string& what, const std::string& advice, Work&& work) -> decltype(work()) {
  try {
    return work();
  } catch (const std::bad_alloc&) {
  } catch (const c10::Error& e) {
    if (!is_allocation_failure(e)) throw;
  }
  throw UsageError(what + " does not fit in memory: " + advice);
}

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
