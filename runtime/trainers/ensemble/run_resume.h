// Resuming an ensemble run from its checkpoint, as `packtrain resume` and the
// Python package's resume() do: the checkpoint's options (on a chosen device, to a
// new total epoch count), the run's data reloaded from the description the
// checkpoint records and checked to be the rows it was trained on, the trainer
// prepared on them and restored, ready for train(). One process (or data parallel),
// or a member-parallel run's shards from its manifest on any number of ranks
// (re-sharded when that number is not the run's).
#pragma once

#include "packtrain/graphs/graph_log.h"
#include "packtrain/runtime/data/run_data.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "packtrain/runtime/trainers/ensemble/member_parallel.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace packtrain::runtime {

namespace distributed {
class ProcessGroup;
}

// A checkpoint opened to resume: read and checked, no data loaded, no process joined.
struct ResumeSource {
  std::string path;                                               // the checkpoint or manifest
  std::shared_ptr<const EnsembleTrainer::Checkpoint> checkpoint;  // member parallel: this rank's members
  RunDescription run;                                             // its data and their fingerprint
  std::optional<ShardManifest> manifest;                          // a member-parallel run's
  MemberShard shard;  // the members this process resumes (of manifest->members when member parallel)
  bool member_parallel() const { return manifest.has_value(); }
};

// An ensemble checkpoint, or a member-parallel manifest resumed whole in this one
// process (its shards gathered). DataError for a missing, damaged or foreign file.
ResumeSource open_resume(const std::string& path);
// Rank `rank` of `ranks`' members of a member-parallel run: its own shard when the
// run had `ranks` ranks, else gathered from the shards that hold them. UserError
// when the members cannot be split over `ranks`.
ResumeSource open_resume(const ShardManifest& manifest, int64_t rank, int64_t ranks);

// How a run continues besides its checkpoint.
struct ResumeOptions {
  int64_t epochs = 0;  // train until this many epochs in all (0: the run's own); must be above the checkpoint's
  c10::Device device = c10::kCPU;
  graphs::GraphLog log = graphs::log_to_stderr;  // the trainer's capture and fallback notes
  // Data parallel: every rank resumes the same checkpoint in the group (set before
  // prepare). Member parallel: the group the run's ranks share (not the trainer's).
  distributed::ProcessGroup* group = nullptr;
  int64_t rank_check_every = 0;  // data parallel: EnsembleTrainer::set_process_group
};

// The checkpoint's options as the run continues with them: on options.device, to
// options.epochs when given (UserError when that is not above the checkpoint's epoch).
EnsembleTrainerOptions resumed_options(const ResumeSource& source, const ResumeOptions& options);

// A resumed run: the trainer, restored and ready for train(), and the data it reloaded.
struct ResumedRun {
  std::unique_ptr<EnsembleTrainer> trainer;
  SplitData data;
};

// Resumes a run whose checkpoint describes its data (`packtrain train`): reloads
// them, refuses a run whose memory estimate is not available, prepares, checks the
// rows are the run's (DataError naming the change) and restores. UserError when the
// checkpoint's data were given from Python (resume_with_data), or options.epochs is
// not above its epoch.
ResumedRun resume(const ResumeSource& source, const ResumeOptions& options);
// Resumes a run whose rows are not on disk (fitted from Python): prepared on the
// training and validation rows given, which must be the ones it was trained on
// (DataError otherwise).
std::unique_ptr<EnsembleTrainer> resume_with_data(const ResumeSource& source, const ResumeOptions& options,
                                                  const at::Tensor& x, const at::Tensor& y,
                                                  const at::Tensor& val_x = {}, const at::Tensor& val_y = {});

// Whether a checkpoint's run description names data to reload (not "python").
bool describes_its_data(const RunDescription& run);

}  // namespace packtrain::runtime
