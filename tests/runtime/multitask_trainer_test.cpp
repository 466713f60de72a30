// MultiTaskTrainer: learns both tasks on a small synthetic corpus; the captured
// step equals the eager step; graph decoding equals eager decoding token for token;
// checkpoints round-trip and resume exactly; bad TSV rows are reported by line.
#include "runtime/byte_tokenizer.h"
#include "runtime/data_error.h"
#include "runtime/distributed/process_group.h"
#include "runtime/labelled_texts.h"
#include "runtime/multitask_trainer.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>

#include <chrono>
#include <fstream>
#include <random>

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

MultiTaskTrainerOptions tiny(c10::Device device) {
  return MultiTaskTrainerOptions()
      .model(ensemble::PackedTransformerOptions().width(32).layers(1).heads(2).max_length(48).device(device))
      .batch_size(8)
      .buckets({24, 48})
      .lr(3e-3)
      .warmup_steps(5)
      .seed(11);
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
      EXPECT_NEAR(a.classification_loss, b.classification_loss, 1e-5) << "shared " << shared;
      EXPECT_NEAR(a.lm_loss, b.lm_loss, 1e-5) << "shared " << shared;
    }
    EXPECT_TRUE(all_close(captured.model().parameters().flat(), eager.model().parameters().flat(), 1e-5))
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
    EXPECT_NEAR(b.lm_loss, a.lm_loss, 1e-6);
  }
  EXPECT_TRUE(all_close(grouped.model().parameters().flat(), alone.model().parameters().flat(), 1e-6));
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
  MultiTaskTrainer trainer(tiny(device()).model(ensemble::PackedTransformerOptions()
                                                    .members(2)
                                                    .width(32)
                                                    .layers(1)
                                                    .heads(2)
                                                    .max_length(48)
                                                    .device(device())));
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
  EXPECT_THROW(trainer.generate(std::string(60, 'x'), sampled), std::invalid_argument);
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
  EXPECT_TRUE(all_close(resumed->model().parameters().flat(), straight.model().parameters().flat(), 1e-6));
}

PACKTRAIN_INSTANTIATE_DEVICE_TESTS(MultiTaskTrainerTest);

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

}  // namespace
}  // namespace packtrain::runtime
