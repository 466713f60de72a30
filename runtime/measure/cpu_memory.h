// Keeps freed CPU memory inside the process for a training run.
//
// A CPU training step allocates and frees the same few (K, B, H) activation
// buffers every step. glibc returns such blocks (above its mmap/trim thresholds)
// to the kernel and faults them in again on the next step: measured ~900 page
// faults and ~0.8 ms of a 2.9 ms step (64 members, hidden 64, batch 128, this
// project's 2-core CPU). Raising the thresholds once makes the steady state reuse
// the blocks, as the CUDA caching allocator does on a GPU. A CNN pack's blocks pass
// the highest mmap threshold glibc allows, so mmap is switched off as well: MNIST-1D
// K 64's CNN step went 129 -> 178 member-steps/s with the thresholds alone, 194
// without mmap (one thread, 2026-11-27).
#pragma once

namespace packtrain::runtime {

// Sets glibc's M_MMAP_THRESHOLD (32 MiB), M_TRIM_THRESHOLD (1 GiB) and M_MMAP_MAX (0)
// for this process. Idempotent; returns false where the C library has no mallopt.
bool retain_freed_cpu_memory();

}  // namespace packtrain::runtime
