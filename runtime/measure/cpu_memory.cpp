#include "packtrain/runtime/measure/cpu_memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace packtrain::runtime {

bool retain_freed_cpu_memory() {
#if defined(__GLIBC__)
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return mmap_ok && trim_ok;
#else
  return false;
#endif
}

}  // namespace packtrain::runtime
