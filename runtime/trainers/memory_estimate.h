// The memory a run will hold at its peak, estimated from its sizes before anything
// large is allocated, and the check that refuses a run that cannot fit: an absurd
// --members or --hidden ends at once with the estimate and what is available
// (DataError, exit 2), not with an allocator error halfway in or the OOM killer.
//
// An estimate, honest rather than safe: it counts what the trainers really hold
// (weights, gradients, optimizer moments, best-weight copies, activations, data,
// batch orders, checkpoint copies), each part with the factor stated where it is
// computed, and compares with what the machine has free now. Sizes are doubles, so
// no product of absurd sizes overflows.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace packtrain::runtime {

struct EnsembleTrainerOptions;
struct ActiveLearningOptions;
struct MultiTaskTrainerOptions;
struct SplitData;

// Where a part of a run's memory lives: on the training device (the host itself on
// a CPU run) or on the host (staging, checkpoints, bookkeeping).
enum class MemoryPlace { kDevice, kHost };

struct MemoryPart {
  std::string what;  // "weights, gradients and adamw moments"
  double bytes = 0;
  MemoryPlace place = MemoryPlace::kDevice;
};

struct MemoryEstimate {
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  std::string sizes;  // what drives it, in the message: "16 members, hidden 64, depth 2, batch 64"
  std::vector<MemoryPart> parts;

  // The parts in `place`; on a CPU run the device is the host, so kHost counts all.
  double bytes(MemoryPlace place) const;
};

// --- ensembles (EnsembleTrainer, and the pack active learning trains)

// The data sizes an ensemble run's estimate needs besides its options.
struct EnsembleRunSizes {
  int64_t features = 1;         // I
  int64_t classes = 0;          // distinct targets, for a classification head
  int64_t rows = 0;             // training rows (all on the device)
  int64_t validation_rows = 0;  // 0: no validation (no best-weight copies)
  int64_t predict_rows = 0;     // the largest set predicted in one call (the test rows)
  bool checkpoints = false;     // writes checkpoints (host copies while saving)
};
// From loaded, split data (classes counted in the training targets).
EnsembleRunSizes ensemble_run_sizes(const EnsembleTrainerOptions& options, const SplitData& data, bool checkpoints);

// Scalars per member of the packed MLP: I*H + H, (depth-1) * (H*H + H), H*O + O,
// and 2H per hidden layer with layer norm (depth 0: I*O + O).
double ensemble_parameters_per_member(const EnsembleTrainerOptions& options, int64_t features, int64_t outputs);

MemoryEstimate estimate_ensemble_run(const EnsembleTrainerOptions& options, const EnsembleRunSizes& sizes);
// The active-learning pack: strategies x runs x members in one trainer, trained on
// `sizes.rows` pool rows, predicting the pool and the test rows, plus every run's
// labelled set.
MemoryEstimate estimate_active_learning(const EnsembleTrainerOptions& options, const ActiveLearningOptions& loop,
                                        const EnsembleRunSizes& sizes);

// --- the multi-task transformer

// Scalars of one full copy of the PackedTransformer the options describe (adapters
// aside), and what each member trains: the same, or with adapters (lora_rank > 0) its
// adapters and classifier only, on the one frozen trunk the members share.
double transformer_parameters_per_member(const MultiTaskTrainerOptions& options);
double trained_parameters_per_member(const MultiTaskTrainerOptions& options);
MemoryEstimate estimate_multitask_run(const MultiTaskTrainerOptions& options, int64_t training_examples,
                                      bool checkpoints);

// --- what is available, and the check

struct AvailableMemory {
  double device = 0;  // free on the training device (on a CPU run: the same as host)
  double host = 0;    // MemAvailable, lowered to what a cgroup limit leaves
};
// Now, for a run on `device`. Where the host cannot say (no /proc/meminfo), host is
// infinite: nothing is refused for want of a number.
AvailableMemory available_memory(c10::Device device);

// DataError when the estimate exceeds what is available: "this run needs about
// 3.1 TiB (16 members, hidden 100000000, ...: 2.9 TiB of weights, gradients and
// adamw moments, ...) but 21.4 GiB are available on cpu; <advice>".
void check_memory(const MemoryEstimate& estimate, const AvailableMemory& available, const std::string& advice);
inline void check_memory(const MemoryEstimate& estimate, const std::string& advice) {
  check_memory(estimate, available_memory(estimate.device), advice);
}

// "21.4 GiB", "512 B", "3.1e+21 B".
std::string format_bytes(double bytes);

}  // namespace packtrain::runtime
