// MultiTaskTrainer: trains a PackedTransformer on labelled sentences for two tasks
// at once — classification (e.g. CoLA acceptability) and causal language modelling
// — with one trunk forward per distinct input and one backward per step
// (ensemble/multitask_step.h), then scores texts and generates continuations.
//
// Static shapes: sentences are tokenized once (runtime/data/byte_tokenizer.h), grouped
// into length buckets and uploaded to the device; every batch is one bucket's
// padded length, so each bucket has one captured training graph and one eval graph
// (MultiTaskSteps, runtime/trainers/multitask/multitask_steps.h). Texts longer than the
// longest bucket are truncated to it and counted (the stated policy). Losses and
// eval counts accumulate on the device and are read once per epoch. A step that
// runs eagerly (CPU, capture off, a failed capture) says why in options().log().
//
// Generation: the prompt fills a preallocated KV cache, then one decode-and-sample
// step per token — Gumbel-max sampling with noise drawn up front from the seed, so
// the step holds no host state — captured as a CUDA graph on a GPU and replayed.
#pragma once

#include "packtrain/ensemble/multitask_step.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_transformer.h"
#include "packtrain/graphs/graph_log.h"
#include "packtrain/runtime/data/labelled_texts.h"
#include "packtrain/runtime/distributed/pipeline_placement.h"

#include <torch/arg.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace c10 {
struct IValue;
}

namespace packtrain {
template <typename O>
class OptionSchema;
}  // namespace packtrain

namespace packtrain::runtime {

class MultiTaskSteps;
class MultiTaskPipeline;
class TextTokenizer;
namespace distributed {
class ProcessGroup;
struct PipelineGroups;
}  // namespace distributed

struct MultiTaskTrainerOptions {
  /// Example: MultiTaskTrainerOptions().model(PackedTransformerOptions().width(256)).batch_size(32)
  TORCH_ARG(ensemble::PackedTransformerOptions, model) = {};
  // A Hugging Face checkpoint folder as the trunk (pretrained_trunk.h: GPT-2 today):
  // its config sets the model's shape (vocab, width, layers, heads, MLP, positions,
  // GELU, LayerNorm epsilon), its weights every member's trunk and LM head, its
  // tokenizer (text_tokenizer.h) the text's. "": packtrain's own trunk, from scratch.
  TORCH_ARG(std::string, trunk) = "";
  TORCH_ARG(int64_t, batch_size) = 32;
  // Padded lengths in tokens (BOS and EOS included), ascending; the last must not
  // exceed the model's max_length and is where longer texts are cut.
  TORCH_ARG(std::vector<int64_t>, buckets) = std::vector<int64_t>{32, 64, 128};
  TORCH_ARG(double, lr) = 1e-3;
  // One learning rate per member (K values) in place of lr; empty: lr for every member.
  TORCH_ARG(std::vector<double>, member_lrs) = {};
  TORCH_ARG(double, weight_decay) = 0.01;
  TORCH_ARG(int64_t, warmup_steps) = 100;
  TORCH_ARG(double, classification_weight) = 1.0;
  TORCH_ARG(double, lm_weight) = 1.0;
  // Class-balanced classification loss: each row weighted N / (C n_c) by its class's
  // share of the training sentences (set_training_data), so that predicting the
  // majority class alone is no longer the cheapest answer (CoLA's train set is 70%
  // acceptable). The metrics are never weighted.
  TORCH_ARG(bool, balance_classes) = false;
  // true: both tasks read the same sentences (one trunk forward); false: the LM task
  // reads another order of the training sentences (two forwards, still one backward).
  TORCH_ARG(bool, shared_inputs) = true;
  TORCH_ARG(int64_t, eval_batch_size) = 64;
  // Early stopping per member (0: off): after each epoch every member's classification
  // loss on the validation sentences (set_validation_data) is measured; a member with
  // no better loss for this many epochs stops (frozen at its best epoch's weights) and
  // the run ends when none trains. A finished run ends with each member's best weights.
  TORCH_ARG(int64_t, patience) = 0;
  TORCH_ARG(uint64_t, seed) = 0;    // model initialization and batch order
  TORCH_ARG(bool, capture) = true;  // CUDA graphs on a GPU (CPU always runs eagerly)
  // The arithmetic of training, evaluation and generation (ensemble/precision.h):
  // fp32, or bf16-mixed (bfloat16 products; float32 weights, optimizer and losses).
  TORCH_ARG(ensemble::Precision, precision) = ensemble::Precision::kFP32;
  // Pipeline model parallel (runtime/trainers/multitask/multitask_pipeline.h): the model's
  // blocks split over this many ranks, each batch run as micro_batches pieces.
  TORCH_ARG(int64_t, pipeline_stages) = 1;
  TORCH_ARG(int64_t, micro_batches) = 1;
  // How the blocks are placed on the stages: balancing their parameters, or their
  // forward + backward time measured on rank 0's device when the run starts.
  TORCH_ARG(distributed::PlacementBalance, pipeline_balance) = distributed::PlacementBalance::kParameters;
  // The placement itself, as stages 1..S-1's first blocks (S - 1 of them); empty: by
  // pipeline_balance. A pipeline trainer records its placement here, so a checkpoint
  // resumes onto the blocks its stage files hold.
  TORCH_ARG(std::vector<int64_t>, pipeline_boundaries) = {};
  // What times the layers for pipeline_balance "time", on rank 0 when a run starts
  // (runtime/measure/layer_timing.h's measure_layer_times; the CLI passes it):
  // the trainers do not depend on the room that times them. Not serialized; a
  // resumed run has its boundaries and times nothing.
  using LayerTimer = std::function<distributed::LayerTimes(const ensemble::PackedTransformerOptions& model,
                                                           int64_t rows, int64_t tokens)>;
  TORCH_ARG(LayerTimer, layer_timer) = nullptr;
  TORCH_ARG(graphs::GraphLog, log) = graphs::log_to_stderr;  // capture decisions, fallbacks (not serialized)

 public:
  // UserError naming the offending field and value.
  void validate() const;
};

// The one description of the options (packtrain/base/option_schema.h): validate's
// ranges, JSON, `multitask train`'s flags and the Python MultiTaskModel's options
// come from it (multitask_trainer_options.cpp). Version 2 added format_version;
// version 3 trunk and the model's gelu_tanh, norm_eps and Llama fields; version 4 the
// adapters (the model's lora_rank, lora_alpha, first_member) and member_lrs; version 5
// patience; version 6 precision.
const OptionSchema<MultiTaskTrainerOptions>& multitask_option_schema();
inline constexpr int kMultiTaskOptionsFormat = 6;
// `options` with a loaded trunk's shape (options.trunk()'s config.json) in its model
// options; unchanged without a trunk. UserError naming the folder or key.
MultiTaskTrainerOptions with_trunk_shape(MultiTaskTrainerOptions options);

// Every field but `log` and `layer_timer` (and the model's device and seed: the
// device is chosen at load, the seed is the trainer's), and format_version, as a
// JSON object.
std::string to_json(const MultiTaskTrainerOptions& options);
// The inverse: an unknown key, a wrong type or a bad value is a UserError naming
// it; a missing key takes the default.
MultiTaskTrainerOptions multitask_options_from_json(const std::string& json);

// Classification accuracy and Matthews correlation (of the members' mean
// probabilities), LM loss per real token and its perplexity.
struct TaskMetrics {
  double accuracy = 0, mcc = 0, lm_loss = 0, perplexity = 0;
  int64_t examples = 0, tokens = 0;
};

struct MultiTaskEpochReport {
  int64_t epoch = 0;                            // 1-based
  int64_t steps = 0;                            // this epoch
  double classification_loss = 0, lm_loss = 0;  // training means over the epoch (members averaged)
  double seconds = 0;
  // With patience: each member's validation classification loss after this epoch (a
  // member stopped in an earlier epoch reports its best), the members still training,
  // and in words the members that stopped this epoch.
  std::vector<double> member_validation_loss;
  int64_t members_training = 0;
  std::vector<std::string> events;
};

// A member's early-stopping record: its best validation loss and the 1-based epoch of
// it (0: none yet), and whether it has stopped.
struct MemberBest {
  double loss = std::numeric_limits<double>::infinity();
  int64_t epoch = 0;
  bool stopped = false;
};

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 20;        // 0: all tokens
  uint64_t seed = 0;
  bool capture = true;  // decode step as a CUDA graph (on a GPU); eager decoding says why in the log
};

// A multi-task checkpoint read and checked before any trainer is built, so that
// every rank of a launched run refuses a damaged one alike, before any collective:
// a whole model's file, or a pipeline manifest and its stage files, each a plain
// name in the manifest's directory, present, and the very file the manifest
// committed (by the checksum it records of each, since this version; older
// manifests record none, and a stage file's own record of its stage and stage
// count, checked when it is loaded, still catches one copied over another).
class MultiTaskCheckpoint {
 public:
  // DataError naming the file for each problem above (and a missing or damaged file).
  static MultiTaskCheckpoint read(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  // A pipeline checkpoint's stage files, stage s at index s; empty for a whole model.
  const std::vector<std::filesystem::path>& stage_files() const { return stage_files_; }
  // The caller's `extra` JSON the save recorded (a manifest of an earlier version
  // records none: then stage 0's file is read for it).
  std::string extra() const;
  // The trunk folder the run's options name ("" for packtrain's own trunk).
  std::string trunk() const;

 private:
  friend class MultiTaskTrainer;
  MultiTaskCheckpoint() = default;  // read() makes them
  std::filesystem::path path_;
  std::shared_ptr<const c10::IValue> payload_;  // the file's dict (a manifest's: small)
  std::vector<std::filesystem::path> stage_files_;
};

class MultiTaskTrainer {
 public:
  // With options.pipeline_stages() = S > 1, `pipeline` is the run's group of S x R
  // ranks: R replicas of an S-stage pipeline (distributed::split_pipeline_groups:
  // rank r holds stage r % S of distributed::place_pipeline's placement, in replica
  // r / S; R = 1 is a plain pipeline). DataError when it is missing, its size is no
  // multiple of S or the batch does not split into R x micro_batches equal parts.
  explicit MultiTaskTrainer(MultiTaskTrainerOptions options, distributed::ProcessGroup* pipeline = nullptr);
  ~MultiTaskTrainer();

  // Pipeline runs: this rank's stage of the model, and every stage's placement.
  bool pipelined() const { return pipeline_ != nullptr; }
  int64_t pipeline_replicas() const;  // R (1 without a pipeline)
  const std::vector<distributed::StagePlacement>& placement() const { return placement_; }

  const MultiTaskTrainerOptions& options() const { return options_; }
  const TextTokenizer& tokenizer() const { return *tokenizer_; }
  ensemble::PackedTransformer& model() { return *model_; }
  ensemble::PackedAdam& optimizer() { return *optimizer_; }
  int64_t epochs_done() const { return epochs_done_; }
  int64_t steps_done() const { return steps_done_; }

  // Data parallel (call before training): batch_size() is the global batch, each
  // rank trains on its equal share of every batch, the flat gradients are averaged
  // across ranks before each update (Gloo on CPU; NCCL inside the captured step on
  // CUDA, the group joined on this device), rank 0's weights are broadcast now.
  // The group must outlive the trainer.
  void set_process_group(distributed::ProcessGroup* group);

  // Tokenizes and uploads the training sentences (once); returns how many were
  // truncated to the longest bucket.
  int64_t set_training_data(const LabelledTexts& train);
  int64_t training_examples() const { return training_examples_; }
  int64_t steps_per_epoch() const;

  // The sentences early stopping (options.patience()) watches; kept, tokenized at
  // each epoch's end. A run with patience needs them before its first epoch.
  void set_validation_data(const LabelledTexts& validation);
  // One epoch over the training data in a seeded order (only the members still
  // training update), then, with patience, the members' validation losses.
  MultiTaskEpochReport train_epoch();
  // Members still training: all without patience; the run is over at 0.
  int64_t members_training() const;
  const std::vector<MemberBest>& member_best() const { return member_best_; }
  // Each member that has a best epoch gets that epoch's weights back (a finished run
  // calls it; an interrupted one does not, so that it resumes exactly).
  void restore_best_members();
  TaskMetrics evaluate(const LabelledTexts& data);

  // (N, C) class probabilities, the mean over members (float64, CPU).
  at::Tensor score(const std::vector<std::string>& texts);
  // (K, N, C) each member's class probabilities (float64, CPU): the ensemble's
  // predictive distribution, whose spread the acquisition functions (BALD) read.
  at::Tensor member_scores(const std::vector<std::string>& texts);
  // One continuation per member (without the prompt), cut at EOS.
  std::vector<std::string> generate(const std::string& prompt, const GenerateOptions& options);
  // The call a user asked for: score `text` and generate a response to it.
  struct ScoredGeneration {
    at::Tensor probabilities;                // (C) float64: the members' mean
    std::vector<std::string> continuations;  // one per member
  };
  ScoredGeneration score_and_generate(const std::string& text, const GenerateOptions& options);
  // The decode step of the last generate(): graph or eager (for tests and reports).
  std::string last_decode_mode() const { return last_decode_mode_; }
  // Decode graphs captured so far: one per decoding kind (greedy, or sampled with a
  // given top-k) however many generate() calls replay it.
  int64_t decode_graphs_captured() const;
  // Step graphs made so far (one per bucket seen) for training and for evaluation.
  size_t training_graphs() const;
  size_t evaluation_graphs() const;

  // Checkpoint: options, parameters, optimizer state, epochs and steps, and the
  // caller's `extra` JSON; atomic and checksummed (runtime/io/checkpoint_file.h).
  // load() rebuilds the trainer on `device`, its graph decisions going to `log` (the
  // log is not stored).
  //
  // A pipeline run saves collectively: each rank writes its stage's file
  // (`path`.stage<s>-of-<S>.step<N>), then rank 0 commits the manifest at `path`
  // naming them, then each rank deletes the files of its previous save — a crash at
  // any point leaves a manifest whose files are all there. load() of a manifest with
  // `pipeline`, a group of S ranks, resumes each rank's stage (another S is a
  // DataError); without it, it assembles the whole model (parameters and optimizer
  // state, by name) in this process, for score, generate or a one-process resume.
  // The manifest records each stage file's checksum; each stage file records its stage
  // and the stage count, and load() refuses a file whose record is not the manifest's.
  void save(const std::filesystem::path& path, const std::string& extra = "{}") const;
  // Member `member` as a Hugging Face GPT-2 checkpoint folder (pretrained_trunk.h's
  // save_pretrained_trunk) with the trunk's tokenizer files copied beside it, so
  // transformers loads the trained trunk and LM head again. A whole model of a GPT-2
  // shape (a run with a trunk, or packtrain's own trunk, whose byte tokenizer has no
  // files: the folder then holds the weights and config only). UserError otherwise.
  void save_pretrained(const std::filesystem::path& dir, int64_t member = 0) const;
  static std::unique_ptr<MultiTaskTrainer> load(const std::filesystem::path& path, c10::Device device,
                                                std::string* extra = nullptr,
                                                graphs::GraphLog log = graphs::log_to_stderr,
                                                distributed::ProcessGroup* pipeline = nullptr);
  static std::unique_ptr<MultiTaskTrainer> load(const MultiTaskCheckpoint& checkpoint, c10::Device device,
                                                std::string* extra = nullptr,
                                                graphs::GraphLog log = graphs::log_to_stderr,
                                                distributed::ProcessGroup* pipeline = nullptr);

  // Pipeline runs (after set_training_data): the stage files that saving `path` after
  // each epoch up to `epochs` would write over and that exist now, for the check that
  // no output is an input. Empty without a pipeline.
  std::vector<std::filesystem::path> stage_files_to_write(const std::filesystem::path& path, int64_t epochs) const;

 private:
  struct Bucket;
  struct DecodeSession;
  DecodeSession& decode_session(const GenerateOptions& options);
  std::vector<Bucket> tokenize(const LabelledTexts& data, int64_t* truncated) const;
  // The pipeline's placement (micro-batches of `rows`): as options record it, else by
  // their balance (measured on `run`'s rank 0 for time), then recorded in options_.
  std::vector<distributed::StagePlacement> place_stages(const ensemble::PackedTransformerOptions& model,
                                                        distributed::ProcessGroup& run, int64_t rows);
  MultiTaskEpochReport train_pipelined(const std::vector<std::pair<size_t, std::vector<int64_t>>>& plan);
  TaskMetrics evaluate_pipelined(const std::vector<Bucket>& buckets);
  MultiTaskEpochReport run_epoch();  // train_epoch's steps
  // Patience: the members' validation losses after an epoch, who improved (their
  // weights kept in best_rows_), who stopped (restored and masked).
  void watch_validation(MultiTaskEpochReport& report);
  // The best epoch's weights back into those of `members` that have one.
  void write_best_rows(const std::vector<int64_t>& members);
  void save_stage(const std::filesystem::path& path, const std::string& extra) const;
  // Early stopping's records from a checkpoint's dict (read from `file`), if it has them.
  void restore_member_best(const c10::IValue& payload, const std::filesystem::path& file);

  MultiTaskTrainerOptions options_;
  c10::Device device_;
  std::unique_ptr<TextTokenizer> tokenizer_;  // the trunk's (the byte tokenizer without one)
  // The trunk folder's files as this trainer read them (pretrained_trunk.h's
  // trunk_record_json; "" without a trunk): saved, and compared on load.
  std::string trunk_record_;
  std::unique_ptr<ensemble::PackedTransformer> model_;
  std::unique_ptr<ensemble::PackedAdam> optimizer_;
  std::unique_ptr<MultiTaskSteps> steps_;  // graph pool, training and eval graph caches, accumulators
  std::vector<Bucket> train_buckets_;
  int64_t training_examples_ = 0;
  int64_t epochs_done_ = 0, steps_done_ = 0;
  std::string last_decode_mode_;
  // (sampled, top_k, capture) -> the decode step and its buffers, kept across calls.
  std::map<std::tuple<bool, int64_t, bool>, std::unique_ptr<DecodeSession>> decode_sessions_;
  distributed::ProcessGroup* group_ = nullptr;
  // Pipeline runs: the stages' group (this replica's) and this stage's replicas
  // group (R > 1), the step, the placement, and the stage file of the last committed
  // save (deleted once the next one is committed).
  std::unique_ptr<distributed::PipelineGroups> pipeline_groups_;
  distributed::ProcessGroup* pipeline_group_ = nullptr;
  distributed::ProcessGroup* replicas_group_ = nullptr;
  std::unique_ptr<MultiTaskPipeline> pipeline_;
  // (C) the classification loss's class weights on the device with balance_classes
  // (undefined without: unweighted), read in place by the steps, captured or not.
  at::Tensor class_weights_;
  // Early stopping: the validation sentences, each member's record and its best
  // epoch's weights, (K, P) on the device (member_row's layout; undefined until the
  // first epoch with patience).
  LabelledTexts validation_;
  std::vector<MemberBest> member_best_;
  at::Tensor best_rows_;
  std::vector<distributed::StagePlacement> placement_;
  mutable std::filesystem::path committed_stage_file_, committed_manifest_;
};

}  // namespace packtrain::runtime
