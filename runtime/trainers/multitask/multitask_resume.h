// Resuming a multi-task run from its checkpoint, as `packtrain multitask resume`
// does: the run's sentence files (named in the checkpoint's run description, with
// their fingerprints) reloaded and checked to be the ones it was trained on, the
// trainer rebuilt on a chosen device — a pipeline checkpoint as this rank's stage
// when given the run's group of as many ranks as stages — ready for train_epoch()
// until the run's (or a new) total epoch count.
#pragma once

#include "packtrain/graphs/graph_log.h"
#include "packtrain/runtime/data/labelled_texts.h"
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace packtrain::runtime {

namespace distributed {
class ProcessGroup;
}

// Where a multi-task run's sentences come from and how long it trains: the
// checkpoint's `extra`, so a resume reloads the same files; with each file's
// fingerprint (of its sentences and labels), so a resume on files edited since is
// refused; with the class names, so `score` can name what it predicts.
struct MultiTaskRunFiles {
  std::filesystem::path train, dev;
  int64_t epochs = 0;
  std::string train_fingerprint, dev_fingerprint;  // empty in checkpoints from earlier versions
  std::vector<std::string> class_names;            // empty: classes are numbered

  std::string to_json() const;
  // DataError naming `checkpoint` when the text is no run description.
  static MultiTaskRunFiles from_json(const std::string& text, const std::string& checkpoint);
};

// How a multi-task run continues besides its checkpoint.
struct MultiTaskResumeOptions {
  int64_t epochs = 0;  // train until this many epochs are done (0: the run's own); must be above the checkpoint's
  c10::Device device = c10::kCPU;
  graphs::GraphLog log = graphs::log_to_stderr;   // the trainer's capture and fallback notes
  graphs::GraphLog note = graphs::log_to_stderr;  // what the caller should tell the user (a file not checkable)
  // Data parallel (a whole-model checkpoint), or the pipeline's ranks (a pipeline
  // checkpoint resumes this rank's stage; without a group, the whole model here).
  distributed::ProcessGroup* group = nullptr;
};

// A resumed multi-task run: the trainer with its training data set, the run's files
// (epochs: the total to reach) and its sentences.
struct ResumedMultiTask {
  std::unique_ptr<MultiTaskTrainer> trainer;
  MultiTaskRunFiles files;
  LabelledTexts train, dev;
  int64_t truncated = 0;  // training sentences cut to the longest bucket
};

// DataError when the checkpoint records no run description or a file changed since;
// UserError when options.epochs is not above its epoch or its memory estimate is not
// available.
ResumedMultiTask resume_multitask(const MultiTaskCheckpoint& checkpoint, const MultiTaskResumeOptions& options);

}  // namespace packtrain::runtime
