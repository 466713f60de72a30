// retain_freed_cpu_memory: after it, a block larger than glibc's highest mmap
// threshold (32 MiB) comes from the heap, and stays in the process when freed, so
// the next step's same-sized block costs no page faults.
#include "packtrain/runtime/measure/cpu_memory.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace packtrain::runtime {
namespace {

#if defined(__GLIBC__)
TEST(RetainFreedCpuMemory, ABlockPastTheMmapCeilingComesFromTheHeapAndStaysWhenFreed) {
  ASSERT_TRUE(retain_freed_cpu_memory());
  constexpr size_t kBytes = size_t{64} << 20;  // twice glibc's highest mmap threshold
  const struct mallinfo2 before = mallinfo2();
  void* block = std::malloc(kBytes);
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  const struct mallinfo2 held = mallinfo2();
  EXPECT_EQ(held.hblkhd, before.hblkhd) << "the 64 MiB block was mmapped, so freeing it unmaps it";
  EXPECT_GE(held.uordblks, before.uordblks + kBytes) << "the block is not in the heap";
  std::free(block);
  const struct mallinfo2 after = mallinfo2();
  EXPECT_EQ(after.arena, held.arena) << "freeing the block shrank the heap (trimmed it)";
}
#else
TEST(RetainFreedCpuMemory, IsAbsentWithoutGlibc) { EXPECT_FALSE(retain_freed_cpu_memory()); }
#endif

}  // namespace
}  // namespace packtrain::runtime
