// What the pipeline tests share: the small transformer they split, its AdamW, and
// S ranks in threads, each with its own ProcessGroup over loopback (a TCP store and
// Gloo, as separate processes use them).
#pragma once

// Skips the calling test when this build has no Gloo (a macro: GTEST_SKIP returns
// from the function it is written in).
#define PACKTRAIN_SKIP_WITHOUT_GLOO()                                     \
  if (!::packtrain::runtime::distributed::ProcessGroup::gloo_available()) \
  GTEST_SKIP() << "built without Gloo's headers (Debian libgloo-dev)"

#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_transformer.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "tests/support/test_support.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace packtrain::runtime::pipeline_testing {

using distributed::ProcessGroup;
using distributed::RankInfo;
using ensemble::PackedTransformerOptions;

inline PackedTransformerOptions model_options(c10::ScalarType dtype, int64_t layers = 4) {
  return PackedTransformerOptions().members(2).width(16).layers(layers).heads(2).max_length(16).seed(5).dtype(dtype);
}

inline ensemble::AdamOptions adam() { return ensemble::adamw_options().lr(1e-2); }

// Runs `body(rank, group)` on `world` threads, each joined to one group; returns
// each rank's error message ("" when it returned normally).
inline std::vector<std::string> run_ranks(int64_t world, const std::function<void(int64_t, ProcessGroup&)>& body,
                                          std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const int port = packtrain::testing::free_port();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        RankInfo info;
        info.rank = r;
        info.world_size = world;
        info.local_rank = r;
        info.local_world_size = world;
        info.master_port = port;
        info.source = "test threads";
        auto group = ProcessGroup::join(info, timeout);
        body(r, *group);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        if (errors[static_cast<size_t>(r)].empty()) errors[static_cast<size_t>(r)] = "(empty error)";
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

}  // namespace packtrain::runtime::pipeline_testing
