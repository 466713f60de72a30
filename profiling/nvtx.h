// NVTX ranges under the `packtrain` domain, so Nsight Systems shows every phase
// of a run by name. Costs one predictable branch when no tool is attached.
#pragma once

namespace packtrain::profiling {

// True when packtrain was built with NVTX (CUDA toolkit's header-only nvtx3).
bool nvtx_compiled_in() noexcept;

// Pushes and pops a range named `name` in the `packtrain` domain on this thread.
// `name` must outlive the range (pass literals).
void nvtx_push(const char* name) noexcept;
void nvtx_pop() noexcept;

// Both also feed the Chrome trace (profiling/trace.h) while one is recording.

// RAII range, in the manner of llm.c's NvtxRange.
/// Example: { NvtxRange range("step"); forward(); backward(); }
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) noexcept { nvtx_push(name); }
  ~NvtxRange() { nvtx_pop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace packtrain::profiling

#define PACKTRAIN_NVTX_CONCAT_INNER(a, b) a##b
#define PACKTRAIN_NVTX_CONCAT(a, b) PACKTRAIN_NVTX_CONCAT_INNER(a, b)
// A range named after the enclosing function.
#define PACKTRAIN_NVTX_RANGE_FN() \
  ::packtrain::profiling::NvtxRange PACKTRAIN_NVTX_CONCAT(packtrain_nvtx_, __LINE__)(__func__)
// A range with a literal name for the rest of the scope.
#define PACKTRAIN_NVTX_RANGE(name) \
  ::packtrain::profiling::NvtxRange PACKTRAIN_NVTX_CONCAT(packtrain_nvtx_, __LINE__)(name)
