// packtrain multitask train | resume | score | generate: one transformer trunk with an
// acceptability classifier and a causal-LM head (runtime/trainers/multitask/multitask_trainer.h).
//
//   train     with no arguments: the bundled language-identification task (fortune
//             cookies in 5 languages; --task cola: CoLA acceptability), both tasks
//             on the same sentences; a checkpoint after every epoch; dev accuracy
//             (beside the majority class's), Matthews correlation and LM perplexity
//   resume    continue a run from its checkpoint (same files, exact at an epoch boundary)
//   score     class probabilities for texts (arguments, or one per line from a file)
//   generate  a continuation of --prompt (with --score, the prompt's score too)
#include "packtrain/runtime/cli/cli_common.h"
#include "packtrain/runtime/cli/commands.h"
#include "packtrain/runtime/cli/enum_option.h"
#include "packtrain/runtime/cli/output_paths.h"
#include "packtrain/runtime/cli/range_checks.h"
#include "packtrain/runtime/cli/run_driver.h"
#include "packtrain/runtime/cli/schema_flags.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/fingerprint.h"
#include "packtrain/runtime/data/input_file.h"
#include "packtrain/runtime/data/labelled_texts.h"
#include "packtrain/runtime/data/text_tokenizer.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/distributed/rank_info.h"
#include "packtrain/runtime/io/output_folder.h"
#include "packtrain/runtime/measure/layer_timing.h"
#include "packtrain/runtime/trainers/memory_estimate.h"
#include "packtrain/runtime/trainers/multitask/multitask_resume.h"
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"
#include "packtrain/runtime/trainers/multitask/pretrained_trunk.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace packtrain::cli {

namespace {

// The flags of `multitask train`, bound onto the trainer's options (their defaults
// are the options' own), plus what belongs to the run rather than the trainer.
struct MultiTaskTrainArgs {
  runtime::MultiTaskTrainerOptions options;
  std::string task = "languages", train, dev, class_names, device = "auto";
  int64_t epochs = 6;
  OutputArgs output;
  CheckpointArgs checkpoint{.path = "multitask.ckpt", .every = 1};  // after every epoch
};

nlohmann::json metrics_json(const runtime::TaskMetrics& m) {
  return {{"accuracy", m.accuracy},     {"mcc", m.mcc},           {"lm_loss", m.lm_loss},
          {"perplexity", m.perplexity}, {"examples", m.examples}, {"tokens", m.tokens}};
}

using RunFiles = runtime::MultiTaskRunFiles;  // the checkpoint's run description (multitask_resume.h)

// A multitask session: the trainer, its files and dev set, and the driver around it.
struct Session {
  runtime::MultiTaskTrainer& trainer;
  const RunFiles& files;
  const runtime::LabelledTexts& dev;
  int64_t truncated;
  runtime::distributed::ProcessGroup* group;
};

void describe(const Session& s, RunDriver& driver) {
  const runtime::MultiTaskTrainerOptions& options = s.trainer.options();
  const auto& m = options.model();
  driver.note(fmt::format(
      "multitask: {} ({} train / {} dev sentences, {} classes), {} member(s), width {}, {} layers, "
      "{} heads, buckets {}, batch {} per step, {} steps per epoch, {} on {}{}",
      s.files.train.filename().string(), s.trainer.training_examples(), s.dev.size(), m.classes(), m.members(),
      m.width(), m.layers(), m.heads(), fmt::join(options.buckets(), "/"), options.batch_size(),
      s.trainer.steps_per_epoch(),
      options.shared_inputs() ? "one trunk forward per step" : "two trunk forwards per step (separate LM texts)",
      m.device().str(), options.capture() && m.device().is_cuda() ? ", captured" : ""));
  if (!options.trunk().empty()) {
    // What a loaded model costs, before the first step: the estimate the run was checked against.
    const runtime::MemoryEstimate e =
        runtime::estimate_multitask_run(options, s.trainer.training_examples(), !driver.checkpoint().path.empty());
    std::string parts;
    for (const runtime::MemoryPart& p : e.parts) {
      parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", runtime::format_bytes(p.bytes), p.what);
    }
    const std::string members =
        m.lora_rank() > 0
            ? fmt::format("{} adapter(s) of rank {} on it, {:.3f} M trained parameters each (a full copy: {:.1f} M)",
                          m.members(), m.lora_rank(), runtime::trained_parameters_per_member(options) / 1e6,
                          runtime::transformer_parameters_per_member(options) / 1e6)
            : fmt::format("{:.1f} M parameters per member", runtime::transformer_parameters_per_member(options) / 1e6);
    driver.note(fmt::format(
        "multitask: trunk {} ({}, {}; its tokenizer: {} tokens); this run needs about {} ({}) of {} available",
        options.trunk(), m.rms_norm() ? "Llama" : "GPT-2", members, s.trainer.tokenizer().vocab(),
        runtime::format_bytes(e.bytes(runtime::MemoryPlace::kHost)), parts,
        runtime::format_bytes(runtime::available_memory(m.device()).host)));
  }
  if (s.group != nullptr && !s.trainer.pipelined()) {
    driver.note(
        fmt::format("multitask: data parallel over {} ranks ({}), global batch {} = {} per rank; gradients "
                    "averaged over {} every step",
                    s.group->world_size(), s.group->info().source, options.batch_size(),
                    options.batch_size() / s.group->world_size(), s.group->backends()));
  }
  if (s.truncated > 0) {
    driver.note(fmt::format("multitask: {} sentence(s) longer than {} tokens truncated to it (policy: cut, then EOS)",
                            s.truncated, options.buckets().back()));
  }
  if (s.trainer.pipelined()) {
    const int64_t S = options.pipeline_stages(), M = options.micro_batches(), R = s.trainer.pipeline_replicas();
    driver.note(
        fmt::format("multitask: pipeline of {} stages over {} ranks ({}), {} micro-batches of {} sentences "
                    "per step, {} schedule; modelled idle (bubble) fraction (S-1)/(M+S-1) = {:.2f}",
                    S, s.group->world_size(), s.group->info().source, M, options.batch_size() / (R * M),
                    m.device().is_cuda() ? "GPipe" : "1F1B", runtime::distributed::bubble_fraction(S, M)));
    if (m.device().is_cuda()) {
      driver.note(
          fmt::format("multitask: each stage's micro-batch steps {} (static buffers; the backward recomputes "
                      "the stage's forward, the last stage runs forward and backward as one step)",
                      options.capture() ? "captured as CUDA graphs" : "run eagerly (--no-capture)"));
    }
    if (R > 1) {
      driver.note(
          fmt::format("multitask: {} replicas of the pipeline (ranks = {} stages x {} replicas; rank r: stage "
                      "r % {} of replica r / {}), each on {} of the batch's {} sentences; each stage's "
                      "gradients summed over its {} replicas every step",
                      R, S, R, S, S, options.batch_size() / R, options.batch_size(), R));
    }
    for (const std::string& line : runtime::distributed::describe_placement(s.trainer.placement(), R)) {
      driver.note("multitask: " + line);
    }
    if (m.tie_lm_head()) {
      driver.note(
          fmt::format("multitask: the LM head is tied to the token embedding: stages 0 and {} each hold a "
                      "copy, their gradients are summed every step",
                      S - 1));
    }
  }
  if (s.trainer.epochs_done() > 0)
    driver.note(fmt::format("multitask: resuming after epoch {}", s.trainer.epochs_done()));
}

// Class k's name, or its number when the run has no names.
std::string class_name(const std::vector<std::string>& names, int64_t k) {
  return k < static_cast<int64_t>(names.size()) ? names[static_cast<size_t>(k)] : std::to_string(k);
}

// The baseline a classifier must beat: always answering the dev set's most frequent
// class (its accuracy; its Matthews correlation is 0).
std::pair<int64_t, double> majority_class(const runtime::LabelledTexts& dev) {
  std::map<int64_t, int64_t> counts;
  for (const int64_t label : dev.labels) ++counts[label];
  const auto most =
      std::max_element(counts.begin(), counts.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return {most->first, static_cast<double>(most->second) / static_cast<double>(dev.size())};
}

// Dev metrics and the run's summary (`saved`: whether the final checkpoint was written).
void report(const Session& s, const RunDriver& driver, const nlohmann::json& epochs, double seconds, bool saved) {
  const runtime::TaskMetrics metrics = s.trainer.evaluate(s.dev);
  const auto [majority, majority_accuracy] = majority_class(s.dev);
  if (!driver.primary()) return;
  const std::string checkpoint = saved ? driver.checkpoint().path : "";
  const c10::Device device = s.trainer.options().model().device();
  if (driver.json()) {
    const nlohmann::json out = {
        {"train", s.files.train.string()},
        {"dev", s.files.dev.string()},
        {"device", device.str()},
        {"options", nlohmann::json::parse(runtime::to_json(s.trainer.options()))},
        {"truncated", s.truncated},
        {"epochs", epochs},
        {"seconds", seconds},
        {"dev_metrics", metrics_json(metrics)},
        {"majority_class",
         {{"class", class_name(s.files.class_names, majority)}, {"accuracy", majority_accuracy}, {"mcc", 0.0}}},
        {"class_names", s.files.class_names},
        {"checkpoint", checkpoint},
        {"log", driver.graph_log_lines()}};
    fmt::print("{}\n", out.dump(1));
    return;
  }
  fmt::print(
      "Dev ({}, {} sentences): accuracy {:.4f}, Matthews correlation {:.4f}, LM loss {:.4f} per {}, "
      "perplexity {:.3f}\n",
      s.files.dev.filename().string(), metrics.examples, metrics.accuracy, metrics.mcc, metrics.lm_loss,
      s.trainer.tokenizer().unit(), metrics.perplexity);
  fmt::print("Majority class ('{}') on dev: accuracy {:.4f}, Matthews correlation 0: the classifier {} it\n",
             class_name(s.files.class_names, majority), majority_accuracy,
             metrics.mcc > 0 && metrics.accuracy > majority_accuracy ? "beats" : "does not beat");
  fmt::print("Trained to epoch {} ({} steps in all), {:.1f} s in this run on {}{}\n", s.trainer.epochs_done(),
             s.trainer.steps_done(), seconds, device.str(), saved ? "; checkpoint " + checkpoint : "");
}

// A non-finite training loss means weights that diverged: stop before the epoch's
// checkpoint would replace the last good one, saying when and what to change (exit 2).
void stop_if_diverged(const Session& s, const RunDriver& driver, const runtime::MultiTaskEpochReport& r) {
  if (std::isfinite(r.classification_loss) && std::isfinite(r.lm_loss)) return;
  const std::string& path = driver.checkpoint().path;
  throw runtime::DataError(fmt::format(
      "the training loss became non-finite in epoch {} (classification {}, LM {}): the weights diverged; nothing was "
      "saved{}; try a smaller --lr (this run: {})",
      r.epoch, r.classification_loss, r.lm_loss, path.empty() ? "" : ", " + path + " is as it was",
      s.trainer.options().lr()));
}

// Trains epochs until `files.epochs` are done through the run driver (a checkpoint
// after each, Ctrl-C ends after the current one), then reports dev metrics.
// Returns 0, or 130 if interrupted.
int run_session(const Session& s, RunDriver& driver) {
  describe(s, driver);
  const std::string extra = s.files.to_json();
  const auto save = [&] {  // a pipeline run saves collectively: each rank its stage
    if (driver.primary() || s.trainer.pipelined()) s.trainer.save(driver.checkpoint().path, extra);
  };
  nlohmann::json epochs = nlohmann::json::array();
  const auto start = std::chrono::steady_clock::now();
  const int64_t first = s.trainer.epochs_done();
  bool go_on = true;
  while (go_on && s.trainer.epochs_done() < s.files.epochs && s.trainer.members_training() > 0) {
    const runtime::MultiTaskEpochReport r = s.trainer.train_epoch();
    stop_if_diverged(s, driver, r);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double eta = elapsed / static_cast<double>(r.epoch - first) * static_cast<double>(s.files.epochs - r.epoch);
    driver.note(fmt::format(
        "epoch {}/{}: classification loss {:.4f}, LM loss {:.4f} per token, {:.1f} steps/s, "
        "ETA {:.0f} s",
        r.epoch, s.files.epochs, r.classification_loss, r.lm_loss, static_cast<double>(r.steps) / r.seconds, eta));
    for (const std::string& event : r.events) driver.note("multitask: " + event);
    nlohmann::json epoch = {{"epoch", r.epoch},
                            {"classification_loss", r.classification_loss},
                            {"lm_loss", r.lm_loss},
                            {"seconds", r.seconds},
                            {"steps", r.steps}};
    if (!r.member_validation_loss.empty()) {
      epoch["member_validation_loss"] = r.member_validation_loss;
      epoch["members_training"] = r.members_training;
      epoch["events"] = r.events;
    }
    epochs.push_back(std::move(epoch));
    go_on = driver.after_epoch(r.epoch, s.files.epochs, s.trainer.steps_done(), save);
  }
  if (go_on && s.trainer.options().patience() > 0) {
    // Finished (not interrupted: that one resumes exactly): each member at its best epoch.
    s.trainer.restore_best_members();
    if (s.trainer.members_training() == 0 && s.trainer.epochs_done() < s.files.epochs) {
      driver.note(fmt::format("multitask: every member stopped early; the run ends after epoch {} of {}",
                              s.trainer.epochs_done(), s.files.epochs));
    }
  }
  DeferredWriteError writes;                // the dev metrics are printed before a failed final write ends the run
  const bool saved = writes.attempt(save);  // the last epoch done, also when interrupted
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!go_on) {
    writes.rethrow_or(0);
    return driver.interrupted(s.trainer.epochs_done(), "packtrain multitask resume " + driver.checkpoint().path);
  }
  report(s, driver, epochs, seconds, saved);
  return writes.rethrow_or(0);
}

// Each file of a --trunk folder (weights, shards, config, tokenizer) is an input: no
// output may replace one.
void add_trunk_inputs(const std::string& trunk, std::vector<NamedPath>& inputs) {
  if (trunk.empty()) return;
  for (const std::filesystem::path& file : runtime::pretrained_trunk_files(trunk)) {
    inputs.push_back({"--trunk", file.string()});
  }
}

// A pipeline run writes more than `-o`: each save's stage files beside it. Those it
// would write over that already exist must not be inputs either.
void check_stage_outputs(const runtime::MultiTaskTrainer& trainer, const std::string& checkpoint, int64_t epochs,
                         const std::vector<NamedPath>& inputs) {
  if (checkpoint.empty()) return;
  std::vector<NamedPath> outputs;
  for (const std::filesystem::path& file : trainer.stage_files_to_write(checkpoint, epochs)) {
    outputs.push_back({"-o " + checkpoint + "'s stage file", file.string()});
  }
  check_outputs(outputs, inputs);
}

// The pipeline flags' constraints, in the flags' words (the options' own check names
// their fields: model.layers, micro_batches).
void check_pipeline_flags(const runtime::MultiTaskTrainerOptions& o) {
  if (o.pipeline_stages() > o.model().layers()) {
    throw UsageError(
        fmt::format("--pipeline-stages {} exceeds --layers {}: each stage holds at least one block; give "
                    "at most {} stages or more layers",
                    o.pipeline_stages(), o.model().layers(), o.model().layers()));
  }
  if (o.batch_size() % o.micro_batches() != 0) {
    throw UsageError(fmt::format("--micro-batches {} does not divide --batch {}: give a divisor of the batch",
                                 o.micro_batches(), o.batch_size()));
  }
  if (o.pipeline_stages() > 1 && !o.shared_inputs()) {
    throw UsageError(
        fmt::format("--separate-lm-texts cannot be used with --pipeline-stages {}: a pipeline run reads "
                    "the same sentences for both tasks",
                    o.pipeline_stages()));
  }
}

// Labels of files without class names may run up to this (a guard, not a limit users meet).
constexpr int64_t kMaxClasses = 1000;

int run_train(const MultiTaskTrainArgs& a) {
  const runtime::BundledTextTask task = runtime::bundled_text_task(a.task);
  RunFiles files;
  files.train = a.train.empty() ? task.train : std::filesystem::path(a.train);
  files.dev = a.dev.empty() ? task.dev : std::filesystem::path(a.dev);
  files.epochs = a.epochs;
  std::vector<NamedPath> inputs = {
      {"--train", files.train.string()}, {"--dev", files.dev.string()}, {"--class-names", a.class_names}};
  add_trunk_inputs(a.options.trunk(), inputs);
  check_outputs({{"-o", a.checkpoint.path, a.options.pipeline_stages() > 1}, {"--log", a.output.log}}, inputs);
  // Classes: the names given (or the bundled task's, for its own files), else what the
  // training labels imply.
  if (!a.class_names.empty()) {
    files.class_names = runtime::read_class_names(a.class_names);
  } else if (a.train.empty()) {
    files.class_names = task.class_names;
  }
  const runtime::LabelledTexts train = runtime::read_labelled_tsv(
      files.train, files.class_names.empty() ? kMaxClasses : static_cast<int64_t>(files.class_names.size()));
  const int64_t classes =
      files.class_names.empty() ? runtime::classes_in(train) : static_cast<int64_t>(files.class_names.size());
  const runtime::LabelledTexts dev = runtime::read_labelled_tsv(files.dev, classes);
  files.train_fingerprint = runtime::fingerprint_hex(runtime::fingerprint(train));
  files.dev_fingerprint = runtime::fingerprint_hex(runtime::fingerprint(dev));
  runtime::MultiTaskTrainerOptions options = a.options;
  options.layer_timer([](const ensemble::PackedTransformerOptions& model, int64_t rows, int64_t tokens) {
    return runtime::measure_layer_times(model, rows, tokens);
  });
  options.model().classes(classes);
  options.model().device(pick_device(a.device));
  options = runtime::with_trunk_shape(options);  // a --trunk's shape, before the memory estimate
  check_pipeline_flags(options);
  options.validate();  // a UserError: exit 2 with its message
  if (options.batch_size() > static_cast<int64_t>(train.size())) {
    throw UsageError(
        fmt::format("batch {} is larger than the training set ({} sentences)", options.batch_size(), train.size()));
  }
  runtime::check_memory(
      runtime::estimate_multitask_run(options, static_cast<int64_t>(train.size()), !a.checkpoint.path.empty()),
      "lower --members, --width, --layers, --max-length, --buckets or --batch (or run where more "
      "memory is free)");
  // The group before the trainer: the trainer's captured steps (which hold NCCL
  // kernels on a GPU) must be destroyed before the communicator.
  const auto group = join_if_launched(options.model().device());
  RunDriver driver(a.output, a.checkpoint, group.get());  // outlives the trainer's log
  options.log(driver.graph_log());
  const int64_t S = options.pipeline_stages();
  if (S > 1 && (group == nullptr || group->world_size() % S != 0)) {
    throw UsageError(
        fmt::format("--pipeline-stages {} needs {} processes, one per stage (or a multiple: stages x "
                    "replicas): packtrain launch --nproc {} -- multitask train --pipeline-stages {} ... "
                    "(this run has {})",
                    S, S, S, S, group == nullptr ? 1 : group->world_size()));
  }
  if (S > 1 && options.batch_size() % (group->world_size() / S * options.micro_batches()) != 0) {
    throw UsageError(fmt::format("--batch {} does not split into {} replica(s) x {} micro-batches of equal size",
                                 options.batch_size(), group->world_size() / S, options.micro_batches()));
  }
  runtime::MultiTaskTrainer trainer(options, options.pipeline_stages() > 1 ? group.get() : nullptr);
  if (!trainer.pipelined()) trainer.set_process_group(group.get());
  const int64_t truncated = trainer.set_training_data(train);
  trainer.set_validation_data(dev);  // early stopping's (--patience)
  check_stage_outputs(trainer, a.checkpoint.path, files.epochs, inputs);
  return run_session({trainer, files, dev, truncated, group.get()}, driver);
}

struct MultiTaskResumeArgs {
  std::string checkpoint;
  int64_t epochs = 0;  // 0: the run's own
  std::string device = "auto";
  OutputArgs output;
  CheckpointArgs out{.path = "", .every = 1};  // "": the checkpoint resumed
};

// Continues a run from its checkpoint: the same files, until --epochs (default: the
// run's own) are done; an epoch boundary resumes exactly.
int run_resume(MultiTaskResumeArgs a) {
  if (a.out.path.empty()) a.out.path = a.checkpoint;
  // Every rank reads the checkpoint and checks each stage file (there, the one the
  // manifest committed) before any rendezvous: a damaged one stops every rank alike.
  const runtime::MultiTaskCheckpoint checkpoint = runtime::MultiTaskCheckpoint::read(a.checkpoint);
  const RunFiles files = RunFiles::from_json(checkpoint.extra(), a.checkpoint);
  // The checkpoint itself is replaced by default (resume's policy); its stage files
  // and the sentence files it names are inputs (the config is one for every command).
  std::vector<NamedPath> inputs = {{"training file", files.train.string()}, {"dev file", files.dev.string()}};
  for (const std::filesystem::path& file : checkpoint.stage_files()) inputs.push_back({"stage file", file.string()});
  add_trunk_inputs(checkpoint.trunk(), inputs);
  const bool stages_beside = !checkpoint.stage_files().empty() &&
                             runtime::distributed::rank_info_from_environment().launched();  // resumed as a pipeline
  check_outputs({{"-o", a.out.path, stages_beside}, {"--log", a.output.log}}, inputs);
  check_outputs({{"--log", a.output.log}}, {{"checkpoint", a.checkpoint}});  // only -o may replace it
  const c10::Device device = pick_device(a.device);
  const auto group = join_if_launched(device);     // before the trainer: destroyed after it
  RunDriver driver(a.output, a.out, group.get());  // outlives the trainer's log
  // A pipeline checkpoint resumes each rank's stage (on as many ranks as stages).
  runtime::ResumedMultiTask run =
      runtime::resume_multitask(checkpoint, {.epochs = a.epochs,
                                             .device = device,
                                             .log = driver.graph_log(),
                                             .note = [&driver](const std::string& line) { driver.note(line); },
                                             .group = group.get()});
  check_stage_outputs(*run.trainer, a.out.path, run.files.epochs, inputs);
  return run_session({*run.trainer, run.files, run.dev, run.truncated, group.get()}, driver);
}

// A trained model and the class names its run recorded (none from earlier versions).
struct Loaded {
  std::unique_ptr<runtime::MultiTaskTrainer> trainer;
  std::vector<std::string> class_names;
};

Loaded load(const runtime::MultiTaskCheckpoint& checkpoint, const std::string& device) {
  std::string extra;
  Loaded out{runtime::MultiTaskTrainer::load(checkpoint, pick_device(device), &extra), {}};
  // The library's MultiTaskModel.save writes no run description: classes numbered.
  const nlohmann::json run = nlohmann::json::parse(extra, nullptr, /*allow_exceptions=*/false);
  if (run.is_object()) out.class_names = run.value("class_names", std::vector<std::string>{});
  return out;
}
Loaded load(const std::string& checkpoint, const std::string& device) {
  return load(runtime::MultiTaskCheckpoint::read(checkpoint), device);
}

// The likeliest class of a row of probabilities: its name (or number) and probability.
std::pair<std::string, double> likeliest(const std::vector<std::string>& names, const at::Tensor& probabilities) {
  const int64_t k = probabilities.argmax().item<int64_t>();
  return {class_name(names, k), probabilities[k].item<double>()};
}

std::vector<std::string> read_texts(const std::vector<std::string>& args, const std::string& file) {
  std::vector<std::string> texts = args;
  if (!file.empty()) {
    runtime::check_input_file(file, "text file");
    std::ifstream in(file);
    if (!in) throw runtime::DataError(file + ": cannot open");
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      runtime::check_line_length(file, n, line.size());
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) {
        throw runtime::DataError(fmt::format("{}:{}: the text is empty", file, n));
      }
      texts.push_back(line);
    }
  }
  if (texts.empty()) throw UsageError("no texts to score: give them as arguments or with --file");
  for (size_t i = 0; i < texts.size(); ++i) {
    if (texts[i].find_first_not_of(" \t") == std::string::npos) {
      throw UsageError(fmt::format("text {} is empty", i + 1));
    }
  }
  return texts;
}

int run_score(const std::string& checkpoint, const std::vector<std::string>& args, const std::string& file,
              const std::string& device, bool json) {
  const std::vector<std::string> texts = read_texts(args, file);
  const auto [trainer, names] = load(checkpoint, device);
  const at::Tensor p = trainer->score(texts);
  const bool binary = p.size(1) == 2;  // prints P(class 1), as CoLA's acceptability
  const int64_t limit = trainer->options().buckets().back() - 2;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < texts.size(); ++i) {
    const at::Tensor row = p[static_cast<int64_t>(i)];
    std::vector<double> probabilities(row.data_ptr<double>(), row.data_ptr<double>() + row.numel());
    const bool cut = static_cast<int64_t>(texts[i].size()) > limit;
    const auto [predicted, probability] = likeliest(names, row);
    if (json) {
      rows.push_back({{"text", texts[i]}, {"probabilities", probabilities}, {"class", predicted}, {"truncated", cut}});
    } else if (binary) {
      fmt::print("{:.4f}\t{}{}\n", probabilities.back(), texts[i], cut ? "\t(truncated)" : "");
    } else {
      fmt::print("{}\t{:.4f}\t{}{}\n", predicted, probability, texts[i], cut ? "\t(truncated)" : "");
    }
  }
  if (json) fmt::print("{}\n", rows.dump(1, ' ', false, nlohmann::json::error_handler_t::replace));
  return 0;
}

int run_generate(const std::string& checkpoint, const std::string& prompt, const runtime::GenerateOptions& g,
                 const std::string& device, bool with_score, bool json) {
  if (prompt.empty()) throw UsageError("--prompt is empty");
  const auto [trainer, names] = load(checkpoint, device);
  if (trainer->options().trunk().empty() &&
      static_cast<int64_t>(prompt.size()) + 1 > trainer->options().model().max_length()) {
    throw UsageError(fmt::format("the prompt has {} bytes; the model has {} positions (BOS included)", prompt.size(),
                                 trainer->options().model().max_length()));
  }
  const runtime::MultiTaskTrainer::ScoredGeneration out =
      with_score ? trainer->score_and_generate(prompt, g)
                 : runtime::MultiTaskTrainer::ScoredGeneration{at::Tensor(), trainer->generate(prompt, g)};
  if (json) {
    nlohmann::json j = {
        {"prompt", prompt}, {"continuations", out.continuations}, {"decode", trainer->last_decode_mode()}};
    if (with_score) {
      const at::Tensor p = out.probabilities.contiguous();
      j["probabilities"] = std::vector<double>(p.data_ptr<double>(), p.data_ptr<double>() + p.numel());
      j["class"] = likeliest(names, p).first;
    }
    // Generated bytes need not be valid UTF-8: invalid ones print as U+FFFD.
    fmt::print("{}\n", j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  if (with_score && out.probabilities.numel() == 2) {
    fmt::print("score\t{:.4f}\n", out.probabilities[-1].item<double>());
  } else if (with_score) {
    const auto [predicted, probability] = likeliest(names, out.probabilities);
    fmt::print("class\t{}\t{:.4f}\n", predicted, probability);
  }
  for (size_t k = 0; k < out.continuations.size(); ++k) {
    fmt::print("{}{}{}\n", out.continuations.size() > 1 ? fmt::format("member {}\t", k) : "", prompt,
               out.continuations[k]);
  }
  return 0;
}

// multitask train: its flags bind onto MultiTaskTrainerOptions.
void add_multitask_train(CLI::App* mt, int& status) {
  auto a = std::make_shared<MultiTaskTrainArgs>();
  runtime::MultiTaskTrainerOptions& o = a->options;
  CLI::App* train = mt->add_subcommand(
      "train",
      "Train on labelled sentences (default: the bundled language-identification task, --task; classification + "
      "language modelling on the same sentences); report dev accuracy beside the majority class's, Matthews "
      "correlation and LM perplexity. A checkpoint is written after every "
      "epoch; Ctrl-C stops after the current epoch (a second Ctrl-C stops at once). Sentences longer than the longest "
      "bucket are truncated to it and counted.");
  std::string tasks;
  std::vector<std::string> task_names;
  for (const runtime::BundledTextTask& t : runtime::bundled_text_tasks()) {
    tasks += "\n  " + t.name + ": " + t.description;
    task_names.push_back(t.name);
  }
  train->add_option("--task", a->task, "A bundled labelled-text task (its train and dev files):" + tasks)
      ->check(CLI::IsMember(task_names))
      ->capture_default_str();
  train->add_option("--train", a->train,
                    "TSV: CoLA's 4 columns or (label, sentence), labels 0..C-1 (default: the "
                    "task's train file)");
  train->add_option("--dev", a->dev, "TSV for the dev metrics (default: the task's dev file)");
  train->add_option("--class-names", a->class_names,
                    "File naming class k on line k; their count is C (default: the "
                    "task's names; with --train, C = 1 + the largest label)");
  train->add_option("--epochs", a->epochs, "Passes over the training sentences")
      ->check(positive())
      ->capture_default_str();
  add_schema_flags(train, runtime::multitask_option_schema(), o);
  train->add_option("--device", a->device, "auto, cpu, cuda or cuda:N")->capture_default_str()->group("Training");
  train->add_option("-o,--out", a->checkpoint.path, "Checkpoint to write (after every epoch)")->capture_default_str();
  add_output_options(train, a->output);
  train->callback([a, &status] { status = run_train(*a); });
}

// multitask resume CHECKPOINT.
void add_multitask_resume(CLI::App* mt, int& status) {
  auto r = std::make_shared<MultiTaskResumeArgs>();
  CLI::App* resume = mt->add_subcommand(
      "resume",
      "Continue a multitask run from its checkpoint with the same sentence files, exactly as if it had not "
      "stopped (from an epoch boundary).");
  resume->add_option("checkpoint", r->checkpoint, "multitask checkpoint")->required()->check(CLI::ExistingFile);
  resume->add_option("--epochs", r->epochs, "Train until this many epochs are done (default: the run's own)")
      ->check(positive());
  resume->add_option("--device", r->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  resume->add_option("-o,--out", r->out.path, "Checkpoint to write (default: the one resumed)");
  add_output_options(resume, r->output);
  resume->callback([r, &status] { status = run_resume(*r); });
}

// multitask score CHECKPOINT [TEXTS] [--file F].
void add_multitask_score(CLI::App* mt, int& status) {
  auto score_checkpoint = std::make_shared<std::string>();
  auto score_texts = std::make_shared<std::vector<std::string>>();
  auto score_file = std::make_shared<std::string>();
  auto score_device = std::make_shared<std::string>("auto");
  auto score_json = std::make_shared<bool>(false);
  CLI::App* score = mt->add_subcommand(
      "score", "Class probabilities for texts from a checkpoint: prints p(last class) and the text, one per line.");
  score->add_option("checkpoint", *score_checkpoint, "multitask checkpoint")->required()->check(CLI::ExistingFile);
  score->add_option("texts", *score_texts, "Texts to score");
  score->add_option("--file", *score_file, "Also score every line of this file");
  score->add_option("--device", *score_device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  score->add_flag("--json", *score_json, "All probabilities as JSON");
  score->callback(
      [=, &status] { status = run_score(*score_checkpoint, *score_texts, *score_file, *score_device, *score_json); });
}

// multitask generate CHECKPOINT --prompt P: sampling flags bind onto GenerateOptions.
void add_multitask_generate(CLI::App* mt, int& status) {
  auto gen_checkpoint = std::make_shared<std::string>();
  auto prompt = std::make_shared<std::string>();
  auto g = std::make_shared<runtime::GenerateOptions>();
  auto gen_device = std::make_shared<std::string>("auto");
  auto with_score = std::make_shared<bool>(false);
  auto no_capture = std::make_shared<bool>(false);
  auto gen_json = std::make_shared<bool>(false);
  CLI::App* generate = mt->add_subcommand(
      "generate", "Continue --prompt with the LM head (KV cache; the decode step is a CUDA graph on a GPU).");
  generate->add_option("checkpoint", *gen_checkpoint, "multitask checkpoint")->required()->check(CLI::ExistingFile);
  generate->add_option("--prompt", *prompt, "Text to continue")->required();
  generate
      ->add_option("--max-new-tokens", g->max_new_tokens,
                   "Tokens to generate at most (bytes with packtrain's own trunk)")
      ->check(positive())
      ->capture_default_str();
  generate->add_option("--temperature", g->temperature, "Sampling temperature (0: greedy; finite)")
      ->check(finite_non_negative())
      ->capture_default_str();
  generate->add_option("--top-k", g->top_k, "Sample among the k likeliest tokens (0: all)")
      ->check(non_negative())
      ->capture_default_str();
  generate->add_option("--seed", g->seed, "Sampling seed (the same seed gives the same text)")
      ->capture_default_str()
      ->check(non_negative());
  generate->add_flag("--score", *with_score, "Also score the prompt with the classification head");
  generate->add_flag("--no-capture", *no_capture, "Decode eagerly on a GPU too");
  generate->add_option("--device", *gen_device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  generate->add_flag("--json", *gen_json, "Print the result as JSON");
  generate->callback([=, &status] {
    runtime::GenerateOptions options = *g;
    options.capture = !*no_capture;
    status = run_generate(*gen_checkpoint, *prompt, options, *gen_device, *with_score, *gen_json);
  });
}

// multitask export CHECKPOINT DIR: a Hugging Face GPT-2 folder transformers loads.
void add_multitask_export(CLI::App* mt, int& status) {
  auto checkpoint = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto member = std::make_shared<int64_t>(0);
  CLI::App* exported = mt->add_subcommand(
      "export",
      "Write a checkpoint's model as a Hugging Face GPT-2 folder (config.json, model.safetensors, the --trunk's "
      "tokenizer files) that transformers' from_pretrained loads.");
  exported->add_option("checkpoint", *checkpoint, "multitask checkpoint")->required()->check(CLI::ExistingFile);
  exported
      ->add_option("dir", *out,
                   "Folder to write: new, or an earlier export's (replaced as a whole: written beside it, then "
                   "renamed into place); never the trunk's folder or one holding other files")
      ->required();
  exported->add_option("--member", *member, "Which member of a pack")->check(non_negative())->capture_default_str();
  exported->callback([=, &status] {
    // Before any work: the checkpoint, its stage files and its trunk's files are inputs.
    const runtime::MultiTaskCheckpoint read = runtime::MultiTaskCheckpoint::read(*checkpoint);
    std::vector<std::filesystem::path> inputs{*checkpoint};
    inputs.insert(inputs.end(), read.stage_files().begin(), read.stage_files().end());
    if (const std::string trunk = read.trunk(); !trunk.empty()) {
      for (const std::filesystem::path& file : runtime::pretrained_trunk_files(trunk)) inputs.push_back(file);
    }
    runtime::check_output_folder(*out, runtime::pretrained_folder_names(), inputs);
    const auto [trainer, names] = load(read, "cpu");
    trainer->save_pretrained(*out, *member);
    fmt::print("wrote {} (member {}, {} blocks of width {})\n", *out, *member, trainer->options().model().layers(),
               trainer->options().model().width());
    status = 0;
  });
}

}  // namespace

void add_multitask_commands(CLI::App& app, int& status) {
  CLI::App* mt = app.add_subcommand(
      "multitask", "One transformer trunk, a classification head and a causal-LM head, trained in one step.");
  mt->require_subcommand(1);
  add_multitask_train(mt, status);
  add_multitask_resume(mt, status);
  add_multitask_score(mt, status);
  add_multitask_generate(mt, status);
  add_multitask_export(mt, status);
}

}  // namespace packtrain::cli
