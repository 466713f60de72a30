#include "packtrain/runtime/cli/cli_common.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/distributed/rank_info.h"

#include <ATen/Context.h>
#include <fmt/format.h>

namespace packtrain::cli {

bool is_allocation_failure(const c10::Error& e) {
  return dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
         e.msg().find("DefaultCPUAllocator") != std::string::npos;
}

c10::Device pick_device(const std::string& name) {
  c10::Device device(c10::kCPU);
  if (name == "auto") {
    if (!at::hasCUDA()) return device;
    device = c10::Device(c10::kCUDA);
  }
  try {
    if (name != "auto") device = c10::Device(name);
  } catch (const c10::Error&) {
    throw UsageError("unknown device '" + name + "' (expected auto, cpu, cuda or cuda:N)");
  }
  if (device.is_cuda() && !at::hasCUDA())
    throw UsageError("device '" + name + "' requested but no CUDA device is available");
  if (!device.is_cuda() && !device.is_cpu()) throw UsageError("device '" + name + "' is not supported (cpu or cuda)");
  // "cuda" means the first device (graphs and pools compare devices with their
  // index), or this rank's in a multi-process run.
  if (device.is_cuda() && device.index() < 0) {
    const runtime::distributed::RankInfo rank = runtime::distributed::rank_info_from_environment();
    const int64_t gpus = static_cast<int64_t>(at::getNumGPUs());
    if (rank.launched() && rank.local_rank >= gpus) {
      throw UsageError(
          fmt::format("rank {} (local rank {}) has no GPU of its own: this machine has {}; packtrain "
                      "runs one GPU per process (start at most {} processes per machine, or use --device "
                      "cpu)",
                      rank.rank, rank.local_rank, gpus, gpus));
    }
    device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(rank.launched() ? rank.local_rank : 0));
  }
  return device;
}

std::unique_ptr<runtime::distributed::ProcessGroup> join_if_launched(c10::Device device) {
  const runtime::distributed::RankInfo rank = runtime::distributed::rank_info_from_environment();
  if (!rank.launched()) return nullptr;
  return runtime::distributed::ProcessGroup::join(rank, runtime::distributed::collective_timeout(), device);
}

}  // namespace packtrain::cli
