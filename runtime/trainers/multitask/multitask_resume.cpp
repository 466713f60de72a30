// Resuming a multi-task run: see multitask_resume.h.
#include "packtrain/runtime/trainers/multitask/multitask_resume.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/fingerprint.h"
#include "packtrain/runtime/trainers/memory_estimate.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace packtrain::runtime {

std::string MultiTaskRunFiles::to_json() const {
  return nlohmann::json{{"train", train.string()},
                        {"dev", dev.string()},
                        {"epochs", epochs},
                        {"train_fingerprint", train_fingerprint},
                        {"dev_fingerprint", dev_fingerprint},
                        {"class_names", class_names}}
      .dump();
}

MultiTaskRunFiles MultiTaskRunFiles::from_json(const std::string& text, const std::string& checkpoint) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    return {j.at("train").get<std::string>(), j.at("dev").get<std::string>(),
            j.at("epochs").get<int64_t>(),    j.value("train_fingerprint", ""),
            j.value("dev_fingerprint", ""),   j.value("class_names", std::vector<std::string>{})};
  } catch (const std::exception& e) {
    throw DataError(checkpoint + ": no run description to resume from (" + e.what() + ")");
  }
}

namespace {

// The sentences a resumed run reads must be the ones it was trained on: DataError
// naming the file that changed; a note when the checkpoint records no fingerprint.
void check_same_texts(const std::string& recorded, const LabelledTexts& texts, const char* role,
                      const graphs::GraphLog& note) {
  const std::string now = fingerprint_hex(fingerprint(texts));
  if (recorded.empty()) {
    note(
        fmt::format("multitask resume: note: the checkpoint records no fingerprint of its {} file (an earlier "
                    "version wrote it): cannot check that {} is unchanged",
                    role, texts.source));
  } else if (recorded != now) {
    throw DataError(
        fmt::format("{}: the {} sentences changed since this run was trained (fingerprint {}, now {}; {} "
                    "sentences now); multitask resume continues a run on its own data only",
                    texts.source, role, recorded, now, texts.size()));
  }
}

}  // namespace

ResumedMultiTask resume_multitask(const MultiTaskCheckpoint& checkpoint, const MultiTaskResumeOptions& options) {
  const std::string path = checkpoint.path().string();
  ResumedMultiTask out;
  out.files = MultiTaskRunFiles::from_json(checkpoint.extra(), path);
  out.trainer = MultiTaskTrainer::load(checkpoint, options.device, nullptr, options.log, options.group);
  MultiTaskTrainer& trainer = *out.trainer;
  if (options.epochs > 0) out.files.epochs = options.epochs;
  if (out.files.epochs <= trainer.epochs_done()) {
    throw DataError(
        fmt::format("{} is at epoch {}; give --epochs above it to train further", path, trainer.epochs_done()));
  }
  const int64_t classes = trainer.options().model().classes();
  out.train = read_labelled_tsv(out.files.train, classes);
  out.dev = read_labelled_tsv(out.files.dev, classes);
  check_same_texts(out.files.train_fingerprint, out.train, "training", options.note);
  check_same_texts(out.files.dev_fingerprint, out.dev, "dev", options.note);
  check_memory(estimate_multitask_run(trainer.options(), static_cast<int64_t>(out.train.size()), true),
               "resume it where more memory is free");
  if (!trainer.pipelined()) trainer.set_process_group(options.group);  // every rank loaded the same checkpoint
  out.truncated = trainer.set_training_data(out.train);
  trainer.set_validation_data(out.dev);  // early stopping watches the dev sentences, as when it was trained
  return out;
}

}  // namespace packtrain::runtime
