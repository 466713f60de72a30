// AsyncReadback: device values (accumulated losses, metrics) copied to the host
// without stalling the device. request() enqueues a copy into pinned memory and
// records an event; poll() hands back the copies that have landed, wait() all.
// On CPU the copy is immediate and the same calls work.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <memory>
#include <vector>

namespace packtrain::graphs {

class AsyncReadback {
 public:
  AsyncReadback();
  ~AsyncReadback();
  AsyncReadback(AsyncReadback&&) noexcept;
  AsyncReadback& operator=(AsyncReadback&&) noexcept;

  // Enqueues a copy of `source` (as it will be once the work already issued on
  // the current stream is done). The caller may overwrite `source` afterwards on
  // the same stream.
  void request(const at::Tensor& source);
  // Copies that have landed, oldest first, without waiting.
  std::vector<at::Tensor> poll();
  // Waits for every pending copy and returns them, oldest first.
  std::vector<at::Tensor> wait();
  size_t pending() const;

 private:
  struct Pending;
  std::deque<std::unique_ptr<Pending>> pending_;
};

}  // namespace packtrain::graphs
