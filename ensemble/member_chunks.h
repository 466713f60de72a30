// parallel_member_chunks: runs the members [0, K) of a CPU pass over ATen's
// threads, each thread taking the next chunk of members from a shared counter.
//
// Why not at::parallel_for: it splits the range evenly up front, and on a busy
// machine one core is often slower — the other thread then spins at the barrier
// (13% of a K=64 fused step's time before this). Chunks of about K / (8 threads)
// members balance that at the cost of one atomic add per chunk. A member is
// always computed whole by one thread, so results do not depend on the split.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace packtrain::ensemble {

// Hands out [begin, end) chunks of [0, members) to the threads that ask.
class MemberChunks {
 public:
  MemberChunks(int64_t members, int64_t chunk) : members_(members), chunk_(chunk) {}
  // The next chunk, or false when every member has been handed out.
  bool next(int64_t& begin, int64_t& end) {
    begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
    end = std::min(begin + chunk_, members_);
    return begin < members_;
  }

 private:
  std::atomic<int64_t> next_{0};
  const int64_t members_, chunk_;
};

// Calls worker(chunks) once on each thread used (per-thread set-up, such as
// buffers, goes before its loop over chunks.next()). Fewer than `grain` members,
// or a call from inside a parallel region: one thread, the caller's.
template <typename Worker>
void parallel_member_chunks(int64_t members, int64_t grain, const Worker& worker) {
  const int64_t threads =
      members <= std::max<int64_t>(grain, 1) || at::in_parallel_region() ? 1 : at::get_num_threads();
  MemberChunks chunks(members, std::max<int64_t>(1, members / (8 * threads)));
  if (threads == 1) {
    worker(chunks);
  } else {
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) { worker(chunks); });
  }
}

}  // namespace packtrain::ensemble
