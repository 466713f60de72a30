// What every packtrain subcommand shares: the error that means "bad usage" (exit
// status 2), device selection and joining a launched run's process group.
#pragma once

#include <c10/core/Device.h>

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

}  // namespace packtrain::cli
