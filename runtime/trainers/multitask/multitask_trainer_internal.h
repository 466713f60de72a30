// MultiTaskTrainer's private types, shared by the .cpp files that define the
// trainer by concern (multitask_trainer.cpp: construction and training;
// multitask_trainer_evaluation.cpp, multitask_trainer_decoding.cpp,
// multitask_trainer_checkpoint.cpp). Not a public header: included only by them.
#pragma once

#include "packtrain/graphs/captured_step.h"
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace packtrain::runtime {

struct MultiTaskTrainer::Bucket {
  int64_t length = 0;
  at::Tensor tokens, lengths, labels;  // (N, length), (N), (N) int64 on the device
  std::vector<int64_t> index;          // row i is example index[i] of the source
  int64_t size() const { return static_cast<int64_t>(index.size()); }
};

// The captured decode step and the buffers it reads and writes, kept across
// generate() calls: one per decoding kind (greedy, or sampled with a given top-k;
// captured or not), so a later call replays its graph at once — the prompt, the
// temperature and the noise are written into the buffers, never into the graph.
struct MultiTaskTrainer::DecodeSession {
  bool sampled = false;
  ensemble::KvCache cache;
  at::Tensor token, position, step_index;  // (K, 1), (1), (1) int64
  at::Tensor generated;                    // (max_length, K) int64: the tokens drawn
  at::Tensor noise, temperature;           // sampled: (max_length, K, V) Gumbel noise, () temperature
  std::unique_ptr<graphs::CapturedStep> step;
};

}  // namespace packtrain::runtime
