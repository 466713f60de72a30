// MultiTaskTrainer: learns both tasks on a small synthetic corpus; the captured
// step equals the eager step; graph decoding equals eager decoding token for token;
// checkpoints round-trip and resume exactly; bad TSV rows are reported by line;
// eager steps say why in the log; option errors name the field and value; options
// JSON refuses unknown keys and fills missing ones from the defaults; early stopping
// per member stops each at its own best epoch and resumes exactly.
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"
#include "packtrain/graphs/graph_log.h"
#include "packtrain/runtime/data/byte_tokenizer.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/labelled_texts.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace packtrain::runtime {
namespace {

using packtrain::testing::all_close;
using packtrain::testing::ScopedTempDir;

// Label 1 when a sentence starts with "yes", 0 when with "no"; the rest is words
// drawn from a small vocabulary, so the LM task has structure to learn too.
LabelledTexts synthetic(int64_t n, uint64_t seed) {
  const std::vector<std::string> words{"the", "cat", "sat", "on", "a", "mat", "dog", "ran"};
  std::mt19937_64 rng(seed);
  LabelledTexts out;
  out.source = "synthetic";
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = static_cast<int64_t>(rng() % 2);
    std::string text = label == 1 ? "yes" : "no";
    const size_t count = 2 + rng() % 6;
    for (size_t w = 0; w < count; ++w) text += " " + words[rng() % words.size()];
    out.texts.push_back(text);
    out.labels.push_back(label);
  }
  return out;
}

void ignore_log(const std::string&) {}

// Two runs of the same steps agree to within this in the weights. CPU: the same
// kernels in the same order, so float rounding alone (1e-6 leaves room for the
// reduction order of a grouped vs. plain all-reduce of one). CUDA: the attention
// backward (the memory-efficient kernel splits keys and adds with atomics) and the
// embedding gradient (index_add_) add in a run-dependent order, so each step's
// gradient differs in its last bits (~1e-7 relative); over these tests' <= 3 epochs
// of Adam at lr 3e-3 that stays near 1e-6 in the weights. 1e-4 leaves that margin
// and is still 30x below one Adam step's change (lr 3e-3), so a missed, repeated or
// wrong step fails.
double equal_runs_tolerance(const c10::Device& device) { return device.is_cuda() ? 1e-4 : 1e-6; }

MultiTaskTrainerOptions tiny(c10::Device device) {
  return MultiTaskTrainerOptions()
      .model(ensemble::PackedTransformerOptions().width(32).layers(1).heads(2).max_length(48).device(device))
      .batch_size(8)
      .buckets({24, 48})
      .lr(3e-3)
      .warmup_steps(5)
      .seed(11)
      .log(&ignore_log);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A GraphLog sink that keeps its lines (options are copied, so the lines are shared).
struct LogLines {
  std::shared_ptr<std::vector<std::string>> lines = std::make_shared<std::vector<std::string>>();
  graphs::GraphLog sink() const {
    return [lines = lines](const std::string& message) { lines->push_back(message); };
  }
  // Lines containing every one of `parts`.
  size_t count(const std::vector<std::string>& parts) const {
    size_t n = 0;
    for (const std::string& line : *lines) {
      bool all = true;
      for (const std::string& part : parts) all = all && contains(line, part);
      n += all ? 1 : 0;
    }
    return n;
  }
  std::string text() const {
    std::string out;
    for (const std::string& line : *lines) out += line + "\n";
    return out;
  }
};

// The message of the c10::Error `f` throws, without its backtrace.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

class MultiTaskTrainerTest : public packtrain::testing::DeviceTest {};

TEST_P(MultiTaskTrainerTest, LearnsBothTasks) {
  MultiTaskTrainer trainer(tiny(device()));
  const LabelledTexts train = synthetic(96, 1), dev = synthetic(40, 2);
  EXPECT_EQ(trainer.set_training_data(train), 0);
  const TaskMetrics before = trainer.evaluate(dev);
  for (int e = 0; e < 12; ++e) trainer.train_epoch();
  const TaskMetrics after = trainer.evaluate(dev);
  EXPECT_EQ(after.examples, 40);
  EXPECT_GE(after.accuracy, 0.9) << "MCC " << after.mcc;
  EXPECT_GT(after.mcc, 0.8);
  EXPECT_LT(after.lm_loss, before.lm_loss - 1.0) << "per-token LM loss before " << before.lm_loss;
  EXPECT_NEAR(after.perplexity, std::exp(after.lm_loss), 1e-9);
  EXPECT_EQ(trainer.epochs_done(), 12);
  EXPECT_EQ(trainer.steps_done(), 12 * trainer.steps_per_epoch());
}

TEST_P(MultiTaskTrainerTest, CapturedStepEqualsEagerStep) {
  for (bool shared : {true, false}) {
    MultiTaskTrainer captured(tiny(device()).shared_inputs(shared));
    MultiTaskTrainer eager(tiny(device()).shared_inputs(shared).capture(false));
    const LabelledTexts train = synthetic(40, 3);
    captured.set_training_data(train);
    eager.set_training_data(train);
    for (int e = 0; e < 2; ++e) {
      const MultiTaskEpochReport a = captured.train_epoch(), b = eager.train_epoch();
      EXPECT_NEAR(a.classification_loss, b.classification_loss, std::max(1e-5, equal_runs_tolerance(device())))
          << "shared " << shared;
      EXPECT_NEAR(a.lm_loss, b.lm_loss, std::max(1e-5, equal_runs_tolerance(device()))) << "shared " << shared;
    }
    EXPECT_TRUE(all_close(captured.model().parameters().flat(), eager.model().parameters().flat(),
                          std::max(1e-5, equal_runs_tolerance(device()))))
        << "shared " << shared;
    EXPECT_EQ(captured.training_graphs(), 2u) << "one graph per length bucket";
  }
}

TEST_P(MultiTaskTrainerTest, GroupOfOneEqualsNoGroupWithTheAllReduceInsideTheGraph) {
  // The data-parallel path (gradient all-reduce between backward and the optimizer:
  // Gloo on CPU, NCCL captured in each bucket's graph on a GPU) in a world of one.
  if (!distributed::ProcessGroup::gloo_available()) GTEST_SKIP() << "built without Gloo's headers";
  if (device().is_cuda() && !distributed::ProcessGroup::nccl_available()) GTEST_SKIP() << "built without NCCL";
  auto group = distributed::ProcessGroup::join(distributed::RankInfo{}, std::chrono::seconds(30), device());
  MultiTaskTrainer alone(tiny(device())), grouped(tiny(device()));
  grouped.set_process_group(group.get());
  const LabelledTexts train = synthetic(40, 3);
  alone.set_training_data(train);
  grouped.set_training_data(train);
  for (int e = 0; e < 2; ++e) {
    const MultiTaskEpochReport a = alone.train_epoch(), b = grouped.train_epoch();
    EXPECT_NEAR(b.lm_loss, a.lm_loss, equal_runs_tolerance(device()));
  }
  EXPECT_TRUE(all_close(grouped.model().parameters().flat(), alone.model().parameters().flat(),
                        equal_runs_tolerance(device())));
  EXPECT_GE(group->calls(), 2);  // the broadcast and the recorded all-reduces went through the group
  EXPECT_EQ(grouped.training_graphs(), 2u) << "one graph per length bucket, the all-reduce inside";
}

TEST_P(MultiTaskTrainerTest, EvaluationPadsPartialBatchesWithoutChangingTheMetrics) {
  MultiTaskTrainer padded(tiny(device()).eval_batch_size(16)), exact(tiny(device()).eval_batch_size(1));
  const LabelledTexts train = synthetic(32, 8);
  padded.set_training_data(train);
  exact.set_training_data(train);
  padded.train_epoch();
  exact.train_epoch();
  for (int64_t n : {37, 21}) {  // not multiples of 16: every bucket ends with a padded batch
    const LabelledTexts dev = synthetic(n, 9);
    const TaskMetrics a = padded.evaluate(dev), b = exact.evaluate(dev);
    EXPECT_EQ(a.examples, n);
    EXPECT_EQ(a.examples, b.examples);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_DOUBLE_EQ(a.accuracy, b.accuracy);
    EXPECT_NEAR(a.lm_loss, b.lm_loss, 1e-5);
  }
  EXPECT_LE(padded.evaluation_graphs(), 2u) << "one eval graph per bucket, whatever the data sets' sizes";
}

TEST_P(MultiTaskTrainerTest, GraphDecodingEqualsEagerDecodingTokenForToken) {
  MultiTaskTrainer trainer(tiny(device()).model(
      ensemble::PackedTransformerOptions().members(2).width(32).layers(1).heads(2).max_length(48).device(device())));
  trainer.set_training_data(synthetic(48, 4));
  for (int e = 0; e < 3; ++e) trainer.train_epoch();
  for (const GenerateOptions& g : {GenerateOptions{20, 0.0, 0, 0, true}, GenerateOptions{20, 0.9, 5, 7, true}}) {
    const std::vector<std::string> graph = trainer.generate("yes the", g);
    if (device().is_cuda()) {
      EXPECT_EQ(trainer.last_decode_mode(), "graph");
    }
    GenerateOptions eager_options = g;
    eager_options.capture = false;
    const std::vector<std::string> eager = trainer.generate("yes the", eager_options);
    EXPECT_EQ(trainer.last_decode_mode(), "eager");
    ASSERT_EQ(graph.size(), 2u);
    EXPECT_EQ(graph, eager) << "temperature " << g.temperature;
  }
  // A fixed seed repeats; the prompt must fit the model.
  const GenerateOptions sampled{30, 1.0, 0, 42, true};
  EXPECT_EQ(trainer.generate("no", sampled), trainer.generate("no", sampled));
  EXPECT_THROW(trainer.generate(std::string(60, 'x'), sampled), UserError);
}

TEST_P(MultiTaskTrainerTest, CheckpointRoundTripsAndResumesExactly) {
  ScopedTempDir dir("packtrain-multitask");
  const LabelledTexts train = synthetic(40, 5);
  MultiTaskTrainer straight(tiny(device())), first(tiny(device()));
  straight.set_training_data(train);
  first.set_training_data(train);
  straight.train_epoch();
  first.train_epoch();
  first.save(dir.path() / "mt.ckpt", R"({"note": 1})");
  std::string extra;
  auto resumed = MultiTaskTrainer::load(dir.path() / "mt.ckpt", device(), &extra);
  EXPECT_EQ(extra, R"({"note": 1})");
  EXPECT_EQ(resumed->epochs_done(), 1);
  EXPECT_TRUE(all_close(resumed->model().parameters().flat(), first.model().parameters().flat(), 0));
  const std::vector<std::string> texts{"yes the cat", "no a dog ran"};
  EXPECT_TRUE(all_close(resumed->score(texts), first.score(texts), 0));
  resumed->set_training_data(train);
  straight.train_epoch();
  resumed->train_epoch();
  EXPECT_TRUE(all_close(resumed->model().parameters().flat(), straight.model().parameters().flat(),
                        equal_runs_tolerance(device())));
}

// bf16-mixed (ensemble/precision.h): the trunk's and heads' products in bfloat16,
// the weights, optimizer, losses and metrics float32. It learns both tasks as fp32
// does, differs from fp32 (the precision acts), generates, and a checkpoint keeps
// its precision and resumes exactly; on a GPU the captured step equals the eager one.
TEST_P(MultiTaskTrainerTest, Bf16MixedLearnsBothTasksAndResumesExactly) {
  const auto mixed = tiny(device()).precision(ensemble::Precision::kBF16Mixed);
  MultiTaskTrainer trainer(mixed), fp32(tiny(device()));
  const LabelledTexts train = synthetic(96, 1), dev = synthetic(40, 2);
  trainer.set_training_data(train);
  fp32.set_training_data(train);
  const TaskMetrics before = trainer.evaluate(dev);
  for (int e = 0; e < 12; ++e) {
    trainer.train_epoch();
    fp32.train_epoch();
  }
  const TaskMetrics after = trainer.evaluate(dev), reference = fp32.evaluate(dev);
  EXPECT_EQ(trainer.model().parameters().flat().scalar_type(), at::kFloat) << "master weights stay float32";
  EXPECT_GE(after.accuracy, 0.9) << "MCC " << after.mcc;
  EXPECT_LT(after.lm_loss, before.lm_loss - 1.0) << "per-token LM loss before " << before.lm_loss;
  EXPECT_NEAR(after.lm_loss, reference.lm_loss, 0.1 * reference.lm_loss) << "as fp32 learns";
  EXPECT_NE(after.lm_loss, reference.lm_loss) << "the products ran in bfloat16";
  EXPECT_EQ(trainer.generate("yes the", GenerateOptions{10, 0.0, 0, 0, true}).size(), 1u);

  ScopedTempDir dir("packtrain-multitask-bf16");
  trainer.save(dir.path() / "mt.ckpt");
  auto resumed = MultiTaskTrainer::load(dir.path() / "mt.ckpt", device());
  EXPECT_EQ(resumed->options().precision(), ensemble::Precision::kBF16Mixed);
  resumed->set_training_data(train);
  trainer.train_epoch();
  resumed->train_epoch();
  EXPECT_TRUE(all_close(resumed->model().parameters().flat(), trainer.model().parameters().flat(),
                        equal_runs_tolerance(device())));
  if (device().is_cuda()) {
    MultiTaskTrainer captured(mixed), eager(MultiTaskTrainerOptions(mixed).capture(false));
    captured.set_training_data(train);
    eager.set_training_data(train);
    const MultiTaskEpochReport a = captured.train_epoch(), b = eager.train_epoch();
    EXPECT_NEAR(a.lm_loss, b.lm_loss, 1e-4);
    EXPECT_TRUE(all_close(captured.model().parameters().flat(), eager.model().parameters().flat(), 1e-4));
  }
}

TEST_P(MultiTaskTrainerTest, EagerStepsSayWhyInTheLog) {
  // As the ensemble's steps do (graphs::CapturedStep): a step that runs eagerly logs
  // its reason once, at its first call — one training and one eval step per bucket.
  const LabelledTexts train = synthetic(40, 3), dev = synthetic(20, 9);
  {
    LogLines log;
    MultiTaskTrainer trainer(tiny(device()).capture(false).log(log.sink()));
    trainer.set_training_data(train);
    trainer.train_epoch();
    trainer.train_epoch();
    trainer.evaluate(dev);
    ASSERT_EQ(trainer.training_graphs(), 2u);
    EXPECT_EQ(log.count({"step 'multitask train", "runs eagerly: capture is switched off"}), 2u) << log.text();
    EXPECT_EQ(log.count({"step 'multitask eval", "runs eagerly: capture is switched off"}), trainer.evaluation_graphs())
        << log.text();
    EXPECT_EQ(log.lines->size(), 2u + trainer.evaluation_graphs()) << "each eager step said so once\n" << log.text();
  }
  LogLines log;
  MultiTaskTrainer trainer(tiny(device()).log(log.sink()));
  trainer.set_training_data(train);
  trainer.train_epoch();
  trainer.evaluate(dev);
  if (device().is_cuda()) {
    EXPECT_EQ(log.count({"runs eagerly"}), 0u) << "every step captured\n" << log.text();
  } else {
    EXPECT_EQ(log.count({"step 'multitask train", "runs eagerly: the device is the CPU"}), 2u) << log.text();
    EXPECT_EQ(log.count({"step 'multitask eval", "runs eagerly: the device is the CPU"}), trainer.evaluation_graphs())
        << log.text();
  }
}

TEST_P(MultiTaskTrainerTest, EagerDecodingSaysWhyInTheLog) {
  LogLines log;
  MultiTaskTrainer trainer(tiny(device()).log(log.sink()));
  ASSERT_TRUE(log.lines->empty()) << "nothing ran yet\n" << log.text();
  trainer.generate("yes the", GenerateOptions{6, 0.0, 0, 0, false});
  EXPECT_EQ(trainer.last_decode_mode(), "eager");
  EXPECT_EQ(log.count({"step 'decode' runs eagerly: capture is switched off"}), 1u) << log.text();
  trainer.generate("yes the", GenerateOptions{6, 0.0, 0, 0, true});
  if (device().is_cuda()) {
    EXPECT_EQ(trainer.last_decode_mode(), "graph");
    EXPECT_EQ(log.lines->size(), 1u) << "a captured decode logs nothing\n" << log.text();
    // The graph is kept: a short call replays it at once.
    trainer.generate("yes the", GenerateOptions{2, 0.0, 0, 0, true});
    EXPECT_EQ(trainer.last_decode_mode(), "graph");
    // A first call of fewer tokens than warm-up and capture take: no graph yet, and
    // the log says so.
    trainer.generate("yes the", GenerateOptions{2, 0.7, 3, 1, true});
    EXPECT_EQ(trainer.last_decode_mode(), "warming up");
    EXPECT_EQ(log.count({"step 'decode' ran eagerly: 2 new tokens are fewer than"}), 1u) << log.text();
  } else {
    EXPECT_EQ(trainer.last_decode_mode(), "eager");
    EXPECT_EQ(log.count({"step 'decode' runs eagerly: the device is the CPU"}), 1u) << log.text();
  }
}

// generate() keeps its decode step per decoding kind: later calls replay the graph
// captured by the first (no warm-up, no capture), with their own prompt,
// temperature and noise, and still equal eager decoding token for token.
TEST_P(MultiTaskTrainerTest, TheDecodeGraphIsCapturedOncePerKindAndReused) {
  MultiTaskTrainer trainer(tiny(device()));
  trainer.set_training_data(synthetic(32, 4));
  trainer.train_epoch();
  const std::vector<std::pair<std::string, GenerateOptions>> calls{{"yes the", {12, 0.0, 0, 0, true}},
                                                                   {"no a", {9, 0.0, 0, 0, true}},
                                                                   {"yes", {10, 0.8, 4, 3, true}},
                                                                   {"the cat", {10, 1.3, 4, 5, true}}};
  for (const auto& [prompt, g] : calls) {
    const std::vector<std::string> captured = trainer.generate(prompt, g);
    GenerateOptions eager = g;
    eager.capture = false;
    EXPECT_EQ(captured, trainer.generate(prompt, eager)) << prompt << ", temperature " << g.temperature;
  }
  // Training between calls: the graph reads the weights in place.
  trainer.train_epoch();
  GenerateOptions greedy{12, 0.0, 0, 0, true}, eager = greedy;
  eager.capture = false;
  EXPECT_EQ(trainer.generate("yes the", greedy), trainer.generate("yes the", eager)) << "after more training";
  EXPECT_EQ(trainer.decode_graphs_captured(), device().is_cuda() ? 2 : 0)
      << "one graph for greedy, one for sampled with top-k 4, across 5 captured calls";
}

TEST_P(MultiTaskTrainerTest, ALoadedTrainerLogsWhereLoadIsTold) {
  ScopedTempDir dir("packtrain-multitask-log");
  MultiTaskTrainer(tiny(device())).save(dir.path() / "mt.ckpt");
  LogLines log;
  auto loaded = MultiTaskTrainer::load(dir.path() / "mt.ckpt", device(), nullptr, log.sink());
  loaded->generate("yes", GenerateOptions{3, 0.0, 0, 0, false});
  EXPECT_EQ(log.count({"step 'decode' runs eagerly: capture is switched off"}), 1u) << log.text();
}

// Each member's classification loss on `dev` (K), computed here from its own
// probabilities: the figure early stopping must watch.
std::vector<double> member_dev_losses(MultiTaskTrainer& trainer, const LabelledTexts& dev) {
  const at::Tensor p = trainer.member_scores(dev.texts);  // (K, N, C) float64
  std::vector<double> out;
  for (int64_t k = 0; k < p.size(0); ++k) {
    double sum = 0;
    constexpr double eps = std::numeric_limits<double>::epsilon();  // scikit-learn's log_loss clip
    for (size_t i = 0; i < dev.size(); ++i) {
      sum -= std::log(std::clamp(p[k][static_cast<int64_t>(i)][dev.labels[i]].item<double>(), eps, 1 - eps));
    }
    out.push_back(sum / static_cast<double>(dev.size()));
  }
  return out;
}

at::Tensor member_rows(MultiTaskTrainer& trainer) {
  std::vector<at::Tensor> rows;
  for (int64_t k = 0; k < trainer.model().members(); ++k) rows.push_back(trainer.model().parameters().member_row(k));
  return at::stack(rows).clone();
}

// Patience 1 on a pack whose members learn at 3e-3, 3e-2 and 1.0: this test keeps its
// own books (each member's dev loss after every epoch, its best epoch and the weights
// then) and the trainer must agree: the losses it reports, who stops when, a stopped
// member frozen at its best weights from then on, and at the end every member at its
// own best epoch's weights. The fast members stop early; the run ends when all have.
TEST_P(MultiTaskTrainerTest, EachMemberStopsAtItsOwnBestEpochWithThatEpochsWeights) {
  const int64_t K = 3, patience = 1;
  MultiTaskTrainerOptions options = tiny(device()).patience(patience).member_lrs({3e-3, 3e-2, 1.0});
  options.model().members(K);
  MultiTaskTrainer trainer(options);
  const LabelledTexts train = synthetic(40, 5), dev = synthetic(24, 6);
  trainer.set_training_data(train);
  trainer.set_validation_data(dev);
  std::vector<double> best_loss(K, std::numeric_limits<double>::infinity());
  std::vector<int64_t> best_epoch(K, 0), stopped_at(K, 0);
  at::Tensor best_rows = member_rows(trainer);
  for (int64_t epoch = 1; epoch <= 20 && trainer.members_training() > 0; ++epoch) {
    const MultiTaskEpochReport r = trainer.train_epoch();
    const std::vector<double> loss = member_dev_losses(trainer, dev);
    const at::Tensor rows = member_rows(trainer);
    ASSERT_EQ(r.member_validation_loss.size(), static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) {
      if (stopped_at[k] > 0) {  // frozen at its best weights since it stopped
        EXPECT_TRUE(all_close(rows[k], best_rows[k], 0)) << "member " << k << " moved after stopping";
        continue;
      }
      if (trainer.member_best()[k].stopped) {
        // Stopped now: measured on this epoch's weights (no better), then its best restored.
        stopped_at[k] = epoch;
        EXPECT_GE(r.member_validation_loss[k], best_loss[k]) << "member " << k;
        EXPECT_GE(epoch - best_epoch[k], patience) << "member " << k << " stopped too soon";
        EXPECT_TRUE(all_close(rows[k], best_rows[k], 0)) << "member " << k << " stopped without its best weights";
        EXPECT_NEAR(loss[k], best_loss[k], 1e-12 * std::max(1.0, loss[k])) << "member " << k;
        continue;
      }
      EXPECT_NEAR(r.member_validation_loss[k], loss[k], 1e-9 * std::max(1.0, loss[k])) << "member " << k;
      if (loss[k] < best_loss[k]) {
        best_loss[k] = loss[k];
        best_epoch[k] = epoch;
        best_rows[k].copy_(rows[k]);
      } else {
        EXPECT_LT(epoch - best_epoch[k], patience) << "member " << k << " should have stopped at epoch " << epoch;
      }
      EXPECT_EQ(trainer.member_best()[k].epoch, best_epoch[k]) << "member " << k << " at epoch " << epoch;
    }
    EXPECT_EQ(r.members_training, std::count(stopped_at.begin(), stopped_at.end(), 0));
    EXPECT_EQ(r.events.size(), static_cast<size_t>(std::count(stopped_at.begin(), stopped_at.end(), epoch)));
  }
  EXPECT_GT(stopped_at[2], 0) << "the member at lr 1.0 never stopped: the test exercises nothing";
  trainer.restore_best_members();
  EXPECT_TRUE(all_close(member_rows(trainer), best_rows, 0)) << "every member ends at its best epoch's weights";
}

// A run with patience saved mid-way and resumed stops as the uninterrupted one does
// (the records and best weights are in the checkpoint); without validation sentences
// it is refused before any step.
TEST_P(MultiTaskTrainerTest, EarlyStoppingResumesExactlyAndNeedsValidationSentences) {
  ScopedTempDir dir("packtrain-multitask-patience");
  MultiTaskTrainerOptions options = tiny(device()).patience(1).member_lrs({3e-3, 1.0});
  options.model().members(2);
  const LabelledTexts train = synthetic(40, 5), dev = synthetic(24, 6);
  MultiTaskTrainer straight(options), first(options);
  for (MultiTaskTrainer* t : {&straight, &first}) {
    t->set_training_data(train);
    t->set_validation_data(dev);
  }
  for (int e = 0; e < 3; ++e) {
    straight.train_epoch();
    first.train_epoch();
  }
  first.save(dir.path() / "mt.ckpt");
  auto resumed = MultiTaskTrainer::load(dir.path() / "mt.ckpt", device());
  ASSERT_EQ(resumed->member_best().size(), 2u);
  resumed->set_training_data(train);
  resumed->set_validation_data(dev);
  for (int e = 0; e < 3; ++e) {
    straight.train_epoch();
    resumed->train_epoch();
  }
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(resumed->member_best()[k].epoch, straight.member_best()[k].epoch) << "member " << k;
    EXPECT_EQ(resumed->member_best()[k].stopped, straight.member_best()[k].stopped) << "member " << k;
  }
  straight.restore_best_members();
  resumed->restore_best_members();
  EXPECT_TRUE(all_close(resumed->model().parameters().flat(), straight.model().parameters().flat(),
                        equal_runs_tolerance(device())));

  MultiTaskTrainer without(options);
  without.set_training_data(train);
  EXPECT_TRUE(
      contains(error_of([&] { without.train_epoch(); }), "early stopping (patience=1) watches the members' loss"));
  EXPECT_EQ(without.steps_done(), 0);
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(MultiTaskTrainerTest);

TEST(MultiTaskTrainerOptionsTest, ValidateNamesTheFieldAndValue) {
  const MultiTaskTrainerOptions t = tiny(c10::Device(c10::kCPU));
  EXPECT_NO_THROW(t.validate());
  const struct {
    MultiTaskTrainerOptions options;
    std::vector<std::string> expected;
  } cases[] = {
      {MultiTaskTrainerOptions(t).batch_size(0), {"batch_size must be > 0, got 0"}},
      {MultiTaskTrainerOptions(t).eval_batch_size(-2), {"eval_batch_size must be > 0, got -2"}},
      {MultiTaskTrainerOptions(t).buckets({}), {"buckets=[]"}},
      {MultiTaskTrainerOptions(t).buckets({2, 48}), {"buckets must be >= 3, got 2"}},
      {MultiTaskTrainerOptions(t).buckets({24, 16}), {"strictly ascending", "buckets[0]=24", "buckets[1]=16"}},
      {MultiTaskTrainerOptions(t).buckets({24, 64}),
       {"exceeds the model's max_length", "buckets[1]=64", "model.max_length=48"}},
      {MultiTaskTrainerOptions(t).lr(-1), {"lr must be >= 0 and finite, got -1"}},
      {MultiTaskTrainerOptions(t).weight_decay(-0.5), {"weight_decay must be >= 0 and finite, got -0.5"}},
      {MultiTaskTrainerOptions(t).warmup_steps(-3), {"warmup_steps must be >= 0, got -3"}},
      {MultiTaskTrainerOptions(t).classification_weight(0).lm_weight(0),
       {"task weights", "classification_weight=0", "lm_weight=0"}},
      {MultiTaskTrainerOptions(t).model(ensemble::PackedTransformerOptions(t.model()).heads(3)), {"multiple of heads"}},
      {MultiTaskTrainerOptions(t).patience(-1), {"patience must be >= 0, got -1"}},
      {MultiTaskTrainerOptions(t).patience(2).pipeline_stages(2).model(
           ensemble::PackedTransformerOptions(t.model()).layers(2)),
       {"early stopping (patience=2)", "pipeline_stages must be 1, got 2"}},
  };
  for (const auto& c : cases) {
    const std::string message = error_of([&] { c.options.validate(); });
    for (const std::string& part : c.expected) EXPECT_TRUE(contains(message, part)) << part << " in: " << message;
  }
  EXPECT_THROW(MultiTaskTrainer(MultiTaskTrainerOptions(t).batch_size(0)), UserError);
}

TEST(MultiTaskTrainerOptionsTest, JsonRoundTripsRefusesUnknownKeysAndFillsMissingOnesFromTheDefaults) {
  const MultiTaskTrainerOptions o =
      tiny(c10::Device(c10::kCPU))
          .shared_inputs(false)
          .classification_weight(0.5)
          .eval_batch_size(16)
          .capture(false)
          .model(ensemble::PackedTransformerOptions().members(3).width(32).layers(1).heads(2).max_length(48).dtype(
              at::kDouble));
  const std::string json = to_json(o);
  EXPECT_EQ(to_json(multitask_options_from_json(json)), json);
  EXPECT_EQ(to_json(multitask_options_from_json("{}")), to_json(MultiTaskTrainerOptions()));

  std::string bogus = json;
  bogus.insert(1, "\"bogus\": 1, ");
  EXPECT_THROW(multitask_options_from_json(bogus), UserError);
  EXPECT_TRUE(contains(error_of([&] { multitask_options_from_json(bogus); }), "unknown key 'bogus'"));

  // Missing keys take the defaults.
  const MultiTaskTrainerOptions partial =
      multitask_options_from_json(R"({"max_length": 48, "buckets": [24, 48], "eval_batch_size": 16})");
  const MultiTaskTrainerOptions defaults;
  EXPECT_EQ(partial.model().max_length(), 48);
  EXPECT_EQ(partial.buckets(), (std::vector<int64_t>{24, 48}));
  EXPECT_EQ(partial.eval_batch_size(), 16);
  EXPECT_EQ(partial.batch_size(), defaults.batch_size());
  EXPECT_EQ(partial.lr(), defaults.lr());
  EXPECT_EQ(partial.lm_weight(), defaults.lm_weight());
  EXPECT_EQ(partial.shared_inputs(), defaults.shared_inputs());
  EXPECT_EQ(partial.model().width(), defaults.model().width());
  EXPECT_EQ(partial.model().dtype(), defaults.model().dtype());

  // Wrong types and bad values are named too.
  EXPECT_TRUE(contains(error_of([] { multitask_options_from_json(R"({"batch_size": "eight"})"); }),
                       "key 'batch_size' has the wrong type"));
  EXPECT_TRUE(contains(error_of([] { multitask_options_from_json(R"({"batch_size": 2.5})"); }),
                       "key 'batch_size' has the wrong type"));
  EXPECT_TRUE(
      contains(error_of([] { multitask_options_from_json(R"({"batch_size": 0})"); }), "batch_size must be > 0, got 0"));
  EXPECT_TRUE(contains(error_of([] { multitask_options_from_json(R"({"dtype": "float16"})"); }),
                       "unknown dtype 'float16' (expected float32 or float64)"));
  // The trainer's own format version is written, and a newer one refused.
  EXPECT_TRUE(
      contains(to_json(MultiTaskTrainerOptions()), "\"format_version\":" + std::to_string(kMultiTaskOptionsFormat)));
  EXPECT_TRUE(contains(error_of([] {
                         multitask_options_from_json(R"({"format_version": )" +
                                                     std::to_string(kMultiTaskOptionsFormat + 1) + "}");
                       }),
                       "written by a newer packtrain"));
  EXPECT_TRUE(contains(error_of([] { multitask_options_from_json("[1, 2]"); }), "not a JSON object"));
}

TEST(MultiTaskData, BadRowsAreReportedByLine) {
  ScopedTempDir dir("packtrain-multitask-data");
  const auto write = [&](const std::string& name, const std::string& body) {
    std::ofstream(dir.path() / name) << body;
    return dir.path() / name;
  };
  const auto message = [](const std::filesystem::path& p) {
    try {
      read_labelled_tsv(p);
    } catch (const DataError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(write("cols.tsv", "a\t1\t\tfine.\nb\t1\tonly three\n")).find("cols.tsv:2: expected 4"),
            std::string::npos);
  EXPECT_NE(message(write("label.tsv", "a\t1\t\tfine.\nb\t2\t\tbad label.\n")).find("label.tsv:2: unknown label '2'"),
            std::string::npos);
  EXPECT_NE(message(write("empty.tsv", "a\t1\t\tfine.\n\nb\t0\t*\t  \n")).find("empty.tsv:3: the sentence is empty"),
            std::string::npos);
  EXPECT_NE(message(write("none.tsv", "\n\n")).find("no labelled sentences"), std::string::npos);
  EXPECT_NE(message(dir.path() / "missing.tsv").find("cannot open"), std::string::npos);
  const LabelledTexts two = read_labelled_tsv(write("two.tsv", "1\tA two-column row.\r\n0\tAnother one.\n"));
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two.texts[0], "A two-column row.");
  EXPECT_EQ(two.labels[1], 0);
}

TEST(MultiTaskData, LongTextsAreTruncatedToTheLongestBucketAndCounted) {
  MultiTaskTrainer trainer(tiny(c10::Device(c10::kCPU)));
  LabelledTexts data = synthetic(10, 6);
  data.texts[3] = std::string(100, 'z');
  data.texts[7] = std::string(47, 'z');  // 47 bytes + BOS + EOS = 49 > 48
  EXPECT_EQ(trainer.set_training_data(data), 2);
  const ByteTokenizer tokenizer;
  bool cut = false;
  EXPECT_EQ(tokenizer.encode(std::string(100, 'z'), 48, &cut).size(), 48u);
  EXPECT_TRUE(cut);
  EXPECT_EQ(tokenizer.decode(tokenizer.encode("héllo", 48)), "héllo");
}

TEST(MultiTaskData, CoLAIsBundledAndReadable) {
  const LabelledTexts dev = read_labelled_tsv(bundled_cola_dir() / "in_domain_dev.tsv");
  EXPECT_EQ(dev.size(), 527u);
  const LabelledTexts train = read_labelled_tsv(bundled_cola_dir() / "in_domain_train.tsv");
  EXPECT_EQ(train.size(), 8551u);
}

// Every bundled task reads with its own class count; the default one's classes are
// balanced (so the majority class scores 1/C) and its dev sentences are not in train.
TEST(MultiTaskData, BundledTasksAreReadableAndTheDefaultIsBalanced) {
  for (const BundledTextTask& listed : bundled_text_tasks()) {
    const BundledTextTask task = bundled_text_task(listed.name);
    const auto classes = static_cast<int64_t>(task.class_names.size());
    const LabelledTexts train = read_labelled_tsv(task.train, classes);
    const LabelledTexts dev = read_labelled_tsv(task.dev, classes);
    EXPECT_EQ(classes_in(train), classes) << task.name << ": every class has training sentences";
    EXPECT_GT(dev.size(), 0u) << task.name;
  }
  const BundledTextTask languages = bundled_text_task("languages");
  EXPECT_EQ(languages.class_names, (std::vector<std::string>{"English", "German", "Spanish", "Italian", "Portuguese"}));
  const LabelledTexts train = read_labelled_tsv(languages.train, 5);
  const LabelledTexts dev = read_labelled_tsv(languages.dev, 5);
  std::vector<int64_t> train_counts(5), dev_counts(5);
  for (const int64_t label : train.labels) ++train_counts[static_cast<size_t>(label)];
  for (const int64_t label : dev.labels) ++dev_counts[static_cast<size_t>(label)];
  EXPECT_EQ(train_counts, std::vector<int64_t>(5, 1600));
  EXPECT_EQ(dev_counts, std::vector<int64_t>(5, 200));
  const std::set<std::string> seen(train.texts.begin(), train.texts.end());
  for (const std::string& text : dev.texts) EXPECT_EQ(seen.count(text), 0u) << "in train and dev: " << text;

  try {
    bundled_text_task("sst2");
    ADD_FAILURE() << "an unknown task was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("no bundled text task 'sst2' (there are: languages, cola)"), std::string::npos)
        << e.what();
  }
}

TEST(MultiTaskData, ClassNamesFilesAreChecked) {
  ScopedTempDir dir("packtrain-class-names");
  const auto message = [&](const std::string& body) {
    std::ofstream(dir.path() / "names.txt") << body;
    try {
      read_class_names(dir.path() / "names.txt");
    } catch (const DataError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("red\ngreen\nred\n").find("names.txt:3: the class name 'red' is given twice"), std::string::npos);
  EXPECT_NE(message("only\n\n").find("1 class name(s); a classifier needs at least 2"), std::string::npos);
  std::ofstream(dir.path() / "ok.txt") << "\xEF\xBB\xBFred\r\n\ngreen\n";
  EXPECT_EQ(read_class_names(dir.path() / "ok.txt"), (std::vector<std::string>{"red", "green"}));
  LabelledTexts texts;
  texts.labels = {0, 0};
  EXPECT_EQ(classes_in(texts), 2) << "one class still makes a binary classifier";
  texts.labels = {4, 1};
  EXPECT_EQ(classes_in(texts), 5);
}

}  // namespace
}  // namespace packtrain::runtime
