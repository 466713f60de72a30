#include "packtrain/runtime/measure/cpu_memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace packtrain::runtime {

bool retain_freed_cpu_memory() {
#if defined(__GLIBC__)
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  // 32 MiB is glibc's ceiling for the threshold, and a CNN pack's activations pass it
  // (MNIST-1D, K 64: 42 MB per block): no block is mmapped at all then. A heap that
  // cannot grow still falls back to mmap inside glibc.
  const bool no_mmap_ok = mallopt(M_MMAP_MAX, 0) == 1;
  return mmap_ok && trim_ok && no_mmap_ok;
#else
  return false;
#endif
}

}  // namespace packtrain::runtime
