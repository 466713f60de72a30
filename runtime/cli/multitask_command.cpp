// packtrain multitask train | resume | score | generate: one transformer trunk with an
// acceptability classifier and a causal-LM head (runtime/multitask_trainer.h).
//
//   train     with no arguments: the bundled CoLA corpus (train / in-domain dev),
//             both tasks on the same sentences; a checkpoint after every epoch;
//             dev accuracy, Matthews correlation and LM perplexity at the end
//   resume    continue a run from its checkpoint (same files, exact at an epoch boundary)
//   score     class probabilities for texts (arguments, or one per line from a file)
//   generate  a continuation of --prompt (with --score, the prompt's score too)
#include "runtime/cli/cli_common.h"
#include "runtime/cli/commands.h"
#include "runtime/data_error.h"
#include "runtime/distributed/process_group.h"
#include "runtime/labelled_texts.h"
#include "runtime/multitask_trainer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

namespace packtrain::cli {

namespace {

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_sigint_multitask(int) {
  g_stop = 1;
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

struct MultiTaskTrainArgs {
  std::string train, dev, out = "multitask.ckpt", device = "auto", log;
  int64_t epochs = 6, members = 1, width = 128, layers = 2, heads = 4, max_length = 128, batch = 32;
  std::vector<int64_t> buckets{32, 64, 128};
  double lr = 1e-3, weight_decay = 0.01, cls_weight = 1.0, lm_weight = 1.0;
  int64_t warmup = 100;
  bool separate_lm_texts = false, no_capture = false, json = false, quiet = false;
  uint64_t seed = 0;
};

nlohmann::json metrics_json(const runtime::TaskMetrics& m) {
  return {{"accuracy", m.accuracy}, {"mcc", m.mcc}, {"lm_loss", m.lm_loss}, {"perplexity", m.perplexity},
          {"examples", m.examples}, {"tokens", m.tokens}};
}

// Where a run's sentences come from and how long it trains: the checkpoint's
// `extra`, so `multitask resume` reloads the same files.
struct RunFiles {
  std::filesystem::path train, dev;
  int64_t epochs = 0;
};

// Trains epochs until `files.epochs` are done (a checkpoint after each, Ctrl-C ends
// after the current one), then reports dev metrics. Returns 0, or 130 if interrupted.
int train_loop(runtime::MultiTaskTrainer& trainer, const RunFiles& files, const runtime::LabelledTexts& dev,
               int64_t truncated, MultiTaskTrainArgs a, runtime::distributed::ProcessGroup* group) {
  // In a data-parallel run every rank trains; rank 0 alone reports and writes files.
  const bool primary = group == nullptr || group->rank() == 0;
  if (!primary) {
    a.quiet = true;
    a.json = false;
    a.log.clear();
  }
  std::FILE* log = a.log.empty() ? nullptr : std::fopen(a.log.c_str(), "a");
  if (!a.log.empty() && log == nullptr) throw UsageError("cannot open log file " + a.log);
  const auto say = [&](const std::string& line) {
    if (!a.quiet) fmt::print(stderr, "{}\n", line);
    if (log != nullptr) fmt::print(log, "{}\n", line);
  };
  const runtime::MultiTaskTrainerOptions& options = trainer.options();
  const auto& m = options.model();
  const c10::Device device = m.device();
  say(fmt::format("multitask: {} ({} train / {} dev sentences), {} member(s), width {}, {} layers, {} heads, "
                  "buckets {}, batch {} per step, {} steps per epoch, {} on {}{}",
                  files.train.filename().string(), trainer.training_examples(), dev.size(), m.members(), m.width(),
                  m.layers(), m.heads(), fmt::join(options.buckets(), "/"), options.batch_size(),
                  trainer.steps_per_epoch(),
                  options.shared_inputs() ? "one trunk forward per step" : "two trunk forwards per step (separate LM texts)",
                  device.str(), options.capture() && device.is_cuda() ? ", captured" : ""));
  if (group != nullptr) {
    say(fmt::format("multitask: data parallel over {} ranks ({}), global batch {} = {} per rank; gradients "
                    "averaged over {} every step",
                    group->world_size(), group->info().source, options.batch_size(),
                    options.batch_size() / group->world_size(), group->backends()));
  }
  if (truncated > 0) {
    say(fmt::format("multitask: {} sentence(s) longer than {} tokens truncated to it (policy: cut, then EOS)", truncated,
                    options.buckets().back()));
  }
  if (trainer.epochs_done() > 0) say(fmt::format("multitask: resuming after epoch {}", trainer.epochs_done()));
  const std::string extra =
      nlohmann::json{{"train", files.train.string()}, {"dev", files.dev.string()}, {"epochs", files.epochs}}.dump();
  nlohmann::json epochs = nlohmann::json::array();
  g_stop = 0;
  const auto previous = std::signal(SIGINT, on_sigint_multitask);
  const auto start = std::chrono::steady_clock::now();
  const int64_t first = trainer.epochs_done();
  int status = 0;
  while (trainer.epochs_done() < files.epochs) {
    const runtime::MultiTaskEpochReport r = trainer.train_epoch();
    if (primary) trainer.save(a.out, extra);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double eta = elapsed / static_cast<double>(r.epoch - first) * static_cast<double>(files.epochs - r.epoch);
    say(fmt::format("epoch {}/{}: classification loss {:.4f}, LM loss {:.4f} per token, {:.1f} steps/s, "
                    "ETA {:.0f} s; checkpoint {}",
                    r.epoch, files.epochs, r.classification_loss, r.lm_loss, static_cast<double>(r.steps) / r.seconds,
                    eta, a.out));
    epochs.push_back({{"epoch", r.epoch}, {"classification_loss", r.classification_loss}, {"lm_loss", r.lm_loss},
                      {"seconds", r.seconds}, {"steps", r.steps}});
    // Ctrl-C reaches the ranks at different moments: all stop after the same epoch.
    const bool stop = group == nullptr ? g_stop != 0
                                       : group->any(g_stop != 0, "interrupt-agreement all-reduce", trainer.steps_done());
    if (stop) {
      say(fmt::format("multitask: interrupted after epoch {}; checkpoint {} holds it", r.epoch, a.out));
      status = 130;
      break;
    }
  }
  std::signal(SIGINT, previous);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const runtime::TaskMetrics metrics = trainer.evaluate(dev);
  if (log != nullptr) std::fclose(log);
  if (!primary) return status;
  if (a.json) {
    const nlohmann::json out = {{"train", files.train.string()}, {"dev", files.dev.string()},
                                {"device", device.str()}, {"options", nlohmann::json::parse(runtime::to_json(options))},
                                {"truncated", truncated}, {"epochs", epochs}, {"seconds", seconds},
                                {"dev_metrics", metrics_json(metrics)}, {"checkpoint", a.out}};
    fmt::print("{}\n", out.dump(1));
  } else {
    fmt::print("Dev ({}, {} sentences): accuracy {:.4f}, Matthews correlation {:.4f}, LM loss {:.4f} per byte, "
               "perplexity {:.3f}\n",
               files.dev.filename().string(), metrics.examples, metrics.accuracy, metrics.mcc, metrics.lm_loss,
               metrics.perplexity);
    fmt::print("Trained to epoch {} ({} steps in all), {:.1f} s in this run on {}; checkpoint {}\n",
               trainer.epochs_done(), trainer.steps_done(), seconds, device.str(), a.out);
  }
  return status;
}

int run_train(const MultiTaskTrainArgs& a) {
  RunFiles files{a.train.empty() ? runtime::bundled_cola_dir() / "in_domain_train.tsv" : std::filesystem::path(a.train),
                 a.dev.empty() ? runtime::bundled_cola_dir() / "in_domain_dev.tsv" : std::filesystem::path(a.dev),
                 a.epochs};
  const runtime::LabelledTexts train = runtime::read_labelled_tsv(files.train);
  const runtime::LabelledTexts dev = runtime::read_labelled_tsv(files.dev);
  const c10::Device device = pick_device(a.device);
  runtime::MultiTaskTrainerOptions options;
  options.model(ensemble::PackedTransformerOptions()
                    .members(a.members)
                    .width(a.width)
                    .layers(a.layers)
                    .heads(a.heads)
                    .max_length(a.max_length)
                    .device(device))
      .batch_size(a.batch)
      .buckets(a.buckets)
      .lr(a.lr)
      .weight_decay(a.weight_decay)
      .warmup_steps(a.warmup)
      .classification_weight(a.cls_weight)
      .lm_weight(a.lm_weight)
      .shared_inputs(!a.separate_lm_texts)
      .seed(a.seed)
      .capture(!a.no_capture);
  try {
    options.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (a.batch > static_cast<int64_t>(train.size())) {
    throw UsageError(fmt::format("batch {} is larger than the training set ({} sentences)", a.batch, train.size()));
  }
  // The group before the trainer: the trainer's captured steps (which hold NCCL
  // kernels on a GPU) must be destroyed before the communicator.
  const auto group = join_if_launched(device);
  runtime::MultiTaskTrainer trainer(options);
  trainer.set_process_group(group.get());
  const int64_t truncated = trainer.set_training_data(train);
  return train_loop(trainer, files, dev, truncated, a, group.get());
}

// Continues a run from its checkpoint: the same files, until --epochs (default: the
// run's own) are done; an epoch boundary resumes exactly.
int run_resume(const std::string& checkpoint, int64_t epochs, MultiTaskTrainArgs a) {
  std::string extra;
  const c10::Device device = pick_device(a.device);
  const auto group = join_if_launched(device);  // before the trainer: destroyed after it
  auto trainer = runtime::MultiTaskTrainer::load(checkpoint, device, &extra);
  RunFiles files;
  try {
    const nlohmann::json j = nlohmann::json::parse(extra);
    files = {j.at("train").get<std::string>(), j.at("dev").get<std::string>(), j.at("epochs").get<int64_t>()};
  } catch (const std::exception& e) {
    throw runtime::DataError(checkpoint + ": no run description to resume from (" + e.what() + ")");
  }
  if (epochs > 0) files.epochs = epochs;
  if (files.epochs <= trainer->epochs_done()) {
    throw UsageError(fmt::format("{} is at epoch {}; give --epochs above it to train further", checkpoint,
                                 trainer->epochs_done()));
  }
  if (a.out.empty()) a.out = checkpoint;
  const runtime::LabelledTexts train = runtime::read_labelled_tsv(files.train);
  const runtime::LabelledTexts dev = runtime::read_labelled_tsv(files.dev);
  trainer->set_process_group(group.get());  // every rank loaded the same checkpoint
  const int64_t truncated = trainer->set_training_data(train);
  return train_loop(*trainer, files, dev, truncated, a, group.get());
}

std::unique_ptr<runtime::MultiTaskTrainer> load(const std::string& checkpoint, const std::string& device) {
  return runtime::MultiTaskTrainer::load(checkpoint, pick_device(device));
}

std::vector<std::string> read_texts(const std::vector<std::string>& args, const std::string& file) {
  std::vector<std::string> texts = args;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) throw runtime::DataError(file + ": cannot open");
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
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
  auto trainer = load(checkpoint, device);
  const at::Tensor p = trainer->score(texts);
  const int64_t limit = trainer->options().buckets().back() - 2;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < texts.size(); ++i) {
    const at::Tensor row = p[static_cast<int64_t>(i)];
    std::vector<double> probabilities(row.data_ptr<double>(), row.data_ptr<double>() + row.numel());
    const bool cut = static_cast<int64_t>(texts[i].size()) > limit;
    if (json) {
      rows.push_back({{"text", texts[i]}, {"probabilities", probabilities}, {"truncated", cut}});
    } else {
      fmt::print("{:.4f}\t{}{}\n", probabilities.back(), texts[i], cut ? "\t(truncated)" : "");
    }
  }
  if (json) fmt::print("{}\n", rows.dump(1, ' ', false, nlohmann::json::error_handler_t::replace));
  return 0;
}

int run_generate(const std::string& checkpoint, const std::string& prompt, const runtime::GenerateOptions& g,
                 const std::string& device, bool with_score, bool json) {
  if (prompt.empty()) throw UsageError("--prompt is empty");
  auto trainer = load(checkpoint, device);
  if (static_cast<int64_t>(prompt.size()) + 1 > trainer->options().model().max_length()) {
    throw UsageError(fmt::format("the prompt has {} bytes; the model has {} positions (BOS included)", prompt.size(),
                                 trainer->options().model().max_length()));
  }
  const runtime::MultiTaskTrainer::ScoredGeneration out =
      with_score ? trainer->score_and_generate(prompt, g)
                 : runtime::MultiTaskTrainer::ScoredGeneration{at::Tensor(), trainer->generate(prompt, g)};
  if (json) {
    nlohmann::json j = {{"prompt", prompt}, {"continuations", out.continuations},
                        {"decode", trainer->last_decode_mode()}};
    if (with_score) {
      const at::Tensor p = out.probabilities.contiguous();
      j["probabilities"] = std::vector<double>(p.data_ptr<double>(), p.data_ptr<double>() + p.numel());
    }
    // Generated bytes need not be valid UTF-8: invalid ones print as U+FFFD.
    fmt::print("{}\n", j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  if (with_score) fmt::print("score\t{:.4f}\n", out.probabilities[-1].item<double>());
  for (size_t k = 0; k < out.continuations.size(); ++k) {
    fmt::print("{}{}{}\n", out.continuations.size() > 1 ? fmt::format("member {}\t", k) : "", prompt,
               out.continuations[k]);
  }
  return 0;
}

}  // namespace

void add_multitask_commands(CLI::App& app, int& status) {
  CLI::App* mt = app.add_subcommand(
      "multitask", "One transformer trunk, a classification head and a causal-LM head, trained in one step.");
  mt->require_subcommand(1);

  auto a = std::make_shared<MultiTaskTrainArgs>();
  CLI::App* train = mt->add_subcommand(
      "train",
      "Train on labelled sentences (default: the bundled CoLA corpus, acceptability + language modelling on the same "
      "sentences); report dev accuracy, Matthews correlation and LM perplexity. A checkpoint is written after every "
      "epoch; Ctrl-C stops after the current epoch. Sentences longer than the longest bucket are truncated to it "
      "and counted.");
  train->add_option("--train", a->train, "TSV: CoLA's 4 columns or (label, sentence) (default: bundled CoLA train)");
  train->add_option("--dev", a->dev, "TSV for the dev metrics (default: bundled CoLA in-domain dev)");
  train->add_option("--epochs", a->epochs, "Passes over the training sentences")->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--members", a->members, "Models trained as one pack (1: an ordinary model)")->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--width", a->width, "Model width")->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--layers", a->layers, "Transformer blocks")->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--heads", a->heads, "Attention heads (width must be a multiple)")->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--max-length", a->max_length, "Positions (tokens, BOS/EOS included)")->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--buckets", a->buckets, "Padded lengths, ascending; one captured graph each")->delimiter(',')->capture_default_str();
  train->add_option("--batch", a->batch, "Sentences per step")->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--lr", a->lr, "AdamW learning rate")->check(CLI::NonNegativeNumber)->capture_default_str();
  train->add_option("--weight-decay", a->weight_decay, "AdamW weight decay")->check(CLI::NonNegativeNumber)->capture_default_str();
  train->add_option("--warmup", a->warmup, "Linear warm-up steps")->check(CLI::NonNegativeNumber)->capture_default_str();
  train->add_option("--cls-weight", a->cls_weight, "Weight of the classification loss")->check(CLI::NonNegativeNumber)->capture_default_str();
  train->add_option("--lm-weight", a->lm_weight, "Weight of the LM loss")->check(CLI::NonNegativeNumber)->capture_default_str();
  train->add_flag("--separate-lm-texts", a->separate_lm_texts,
                  "The LM task reads another order of the sentences (two trunk forwards, still one backward)");
  train->add_option("--seed", a->seed, "Initialization and batch order")->capture_default_str();
  train->add_option("--device", a->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  train->add_flag("--no-capture", a->no_capture, "Run the steps eagerly on a GPU too");
  train->add_option("-o,--out", a->out, "Checkpoint to write")->capture_default_str();
  train->add_option("--log", a->log, "Also append the progress lines to this file");
  train->add_flag("--json", a->json, "Print the report as JSON on stdout");
  train->add_flag("-q,--quiet", a->quiet, "No progress lines");
  train->callback([a, &status] { status = run_train(*a); });

  auto r = std::make_shared<MultiTaskTrainArgs>();
  r->out.clear();
  auto resume_checkpoint = std::make_shared<std::string>();
  auto resume_epochs = std::make_shared<int64_t>(0);
  CLI::App* resume = mt->add_subcommand(
      "resume", "Continue a multitask run from its checkpoint with the same sentence files, exactly as if it had not "
                "stopped (from an epoch boundary).");
  resume->add_option("checkpoint", *resume_checkpoint, "multitask checkpoint")->required()->check(CLI::ExistingFile);
  resume->add_option("--epochs", *resume_epochs, "Train until this many epochs are done (default: the run's own)")
      ->check(CLI::PositiveNumber);
  resume->add_option("--device", r->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  resume->add_option("-o,--out", r->out, "Checkpoint to write (default: the one resumed)");
  resume->add_option("--log", r->log, "Also append the progress lines to this file");
  resume->add_flag("--json", r->json, "Print the report as JSON on stdout");
  resume->add_flag("-q,--quiet", r->quiet, "No progress lines");
  resume->callback([=, &status] { status = run_resume(*resume_checkpoint, *resume_epochs, *r); });

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
  score->callback([=, &status] {
    status = run_score(*score_checkpoint, *score_texts, *score_file, *score_device, *score_json);
  });

  auto gen_checkpoint = std::make_shared<std::string>();
  auto prompt = std::make_shared<std::string>();
  auto g = std::make_shared<runtime::GenerateOptions>();
  g->temperature = 0.8;
  g->top_k = 20;
  auto gen_device = std::make_shared<std::string>("auto");
  auto with_score = std::make_shared<bool>(false);
  auto no_capture = std::make_shared<bool>(false);
  auto gen_json = std::make_shared<bool>(false);
  CLI::App* generate = mt->add_subcommand(
      "generate", "Continue --prompt with the LM head (KV cache; the decode step is a CUDA graph on a GPU).");
  generate->add_option("checkpoint", *gen_checkpoint, "multitask checkpoint")->required()->check(CLI::ExistingFile);
  generate->add_option("--prompt", *prompt, "Text to continue")->required();
  generate->add_option("--max-new-tokens", g->max_new_tokens, "Bytes to generate at most")->check(CLI::PositiveNumber)->capture_default_str();
  generate->add_option("--temperature", g->temperature, "Sampling temperature (0: greedy)")->check(CLI::NonNegativeNumber)->capture_default_str();
  generate->add_option("--top-k", g->top_k, "Sample among the k likeliest tokens (0: all)")->check(CLI::NonNegativeNumber)->capture_default_str();
  generate->add_option("--seed", g->seed, "Sampling seed (the same seed gives the same text)")->capture_default_str();
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

}  // namespace packtrain::cli
