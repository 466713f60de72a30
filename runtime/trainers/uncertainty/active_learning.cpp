#include "packtrain/runtime/trainers/uncertainty/active_learning.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/io/svg_plot.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace packtrain::runtime {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Independent-looking seeds for (seed, stream) pairs: the initial set, each random
// run's draws and each round's member weights never share a stream.
uint64_t mix(uint64_t seed, uint64_t stream) { return splitmix64(seed ^ splitmix64(stream)); }

constexpr uint64_t kInitialStream = 0x1A17;
constexpr uint64_t kRandomStream = 0x2B00;
constexpr uint64_t kRoundStream = 0x3C00;

void require(bool ok, const std::string& message) {
  if (!ok) throw UserError("active learning: " + message);
}

// Partial Fisher-Yates: the first `count` of `items` become a uniform sample.
template <typename T>
void shuffle_prefix(std::vector<T>& items, int64_t count, std::mt19937_64& rng) {
  for (size_t i = 0; i < static_cast<size_t>(count); ++i) {
    std::uniform_int_distribution<size_t> pick(i, items.size() - 1);
    std::swap(items[i], items[pick(rng)]);
  }
}

std::vector<int64_t> initial_rows(int64_t pool_rows, int64_t count, uint64_t seed) {
  std::vector<int64_t> rows(static_cast<size_t>(pool_rows));
  std::iota(rows.begin(), rows.end(), 0);
  std::mt19937_64 rng(mix(seed, kInitialStream));
  shuffle_prefix(rows, count, rng);
  rows.resize(static_cast<size_t>(count));
  return rows;
}

// The pack's options: S * G * M members, and an order that lets members train on
// different rows.
EnsembleTrainerOptions pack_options(EnsembleTrainerOptions o, int64_t runs, const AcquisitionOptions& acquisition) {
  try {
    check_acquisition_options(acquisition, o.head() == Head::kClassification);
  } catch (const UserError& e) {
    require(false, e.what());
  }
  require(o.patience().value_or(0) == 0, "there is no validation data to stop early on: patience must be 0, got " +
                                             std::to_string(o.patience().value_or(0)));
  require(o.members() >= 2,
          "an ensemble's disagreement needs at least 2 members per ensemble, got " + std::to_string(o.members()));
  // The cosine length is fixed (in steps) when the step is captured, but an epoch
  // grows with the labelled set: the decay would end at the wrong time.
  require(o.schedule() != ensemble::LrScheduleKind::kCosine,
          "the cosine schedule is not supported (its length in steps would be wrong as the labelled set grows); "
          "use constant or warmup");
  if (o.order() == graphs::BatchOrder::kShared) {
    if (o.log()) {
      o.log()("active learning: batch order 'shared' cannot give the runs different rows; using 'per-member'");
    }
    o.order(graphs::BatchOrder::kPerMember);
  }
  return o.members(o.members() * runs);
}

void check_sizes(const ActiveLearningOptions& o, int64_t batch_size, int64_t pool_rows) {
  if (o.initial() < batch_size) {
    throw DataError("active learning: the initial labelled set (" + std::to_string(o.initial()) +
                    " rows) is smaller than the batch size " + std::to_string(batch_size));
  }
  const int64_t needed = o.initial() + (o.rounds() - 1) * o.acquire();
  if (needed > pool_rows) {
    throw DataError("active learning: " + std::to_string(o.initial()) + " initial + " + std::to_string(o.rounds() - 1) +
                    " x " + std::to_string(o.acquire()) + " acquired = " + std::to_string(needed) +
                    " rows, but the pool has only " + std::to_string(pool_rows));
  }
}

double mean(const std::vector<double>& v) {
  return v.empty() ? std::nan("") : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// Sample standard deviation; 0 for a single run.
double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return v.empty() ? std::nan("") : 0.0;
  const double m = mean(v);
  double sum = 0;
  for (const double x : v) sum += (x - m) * (x - m);
  return std::sqrt(sum / static_cast<double>(v.size() - 1));
}

}  // namespace

const OptionSchema<ActiveLearningOptions>& active_learning_option_schema() {
  static const OptionSchema<ActiveLearningOptions> schema = [] {
    OptionSchema<ActiveLearningOptions> s("active-learning options", /*format_version=*/1);
    const std::string group = "Active learning";
    s.option(PACKTRAIN_OPTION(initial)).help_text("Labelled rows at the start").in_group(group).above(0);
    s.option(PACKTRAIN_OPTION(acquire)).help_text("Rows labelled per round").in_group(group).above(0);
    s.option(PACKTRAIN_OPTION(rounds))
        .help_text("Trainings (acquisitions happen between them)")
        .in_group(group)
        .above(0);
    s.option(PACKTRAIN_OPTION(ensembles))
        .flag_name("--runs")
        .help_text("Independent runs (ensembles) per strategy, all in one pack")
        .in_group(group)
        .above(0);
    s.option(PACKTRAIN_OPTION(random_baseline))
        .flag_name("--no-random-baseline")
        .sets_false()
        .help_text("Leave out the random-acquisition baseline (its runs and its column)")
        .in_group(group);
    s.option(PACKTRAIN_OPTION(seed))
        .flag_name("--al-seed")
        .help_text("Seed of the initial labelled set, random acquisition and the rounds' re-initializations")
        .in_group(group);
    describe_acquisition_options(
        s, [](auto& o) -> auto& { return o.acquisition(); }, group, "acquisition_seed", "");
    return s;
  }();
  return schema;
}

void ActiveLearningOptions::validate() const {
  for (const OptionField<ActiveLearningOptions>& f : active_learning_option_schema().fields()) {
    const std::string problem = f.problem(*this);  // "initial must be > 0, got 0"
    require(problem.empty(), problem);
  }
}

// --- PoolPartition ---------------------------------------------------------------

PoolPartition::PoolPartition(int64_t pool_rows, const std::vector<int64_t>& initial) {
  std::vector<char> taken(static_cast<size_t>(std::max<int64_t>(pool_rows, 0)), 0);
  for (const int64_t row : initial) {
    require(row >= 0 && row < pool_rows,
            "initial row " + std::to_string(row) + " is outside the pool [0, " + std::to_string(pool_rows) + ")");
    require(!taken[static_cast<size_t>(row)], "initial row " + std::to_string(row) + " is repeated");
    taken[static_cast<size_t>(row)] = 1;
    labelled_.push_back(row);
  }
  for (int64_t row = 0; row < pool_rows; ++row) {
    if (!taken[static_cast<size_t>(row)]) unlabelled_.push_back(row);
  }
}

void PoolPartition::acquire_top(const at::Tensor& scores, int64_t count) {
  const int64_t rows = static_cast<int64_t>(labelled_.size() + unlabelled_.size());
  TORCH_CHECK(scores.dim() == 1 && scores.size(0) == rows, "acquire_top: expected one score per pool row (", rows,
              "), got ", scores.sizes());
  TORCH_CHECK(count >= 0 && count <= static_cast<int64_t>(unlabelled_.size()), "acquire_top: cannot move ", count,
              " of ", unlabelled_.size(), " unlabelled rows");
  const at::Tensor s = scores.to(at::kDouble).cpu().contiguous();
  const double* score = s.data_ptr<double>();
  // A NaN score ranks last rather than breaking the ordering.
  const auto key = [&](size_t p) {
    const double v = score[unlabelled_[p]];
    return std::isnan(v) ? -std::numeric_limits<double>::infinity() : v;
  };
  std::vector<size_t> positions(unlabelled_.size());
  std::iota(positions.begin(), positions.end(), size_t{0});
  std::partial_sort(positions.begin(), positions.begin() + count, positions.end(), [&](size_t a, size_t b) {
    return key(a) > key(b) || (key(a) == key(b) && unlabelled_[a] < unlabelled_[b]);
  });
  positions.resize(static_cast<size_t>(count));
  move(positions);
}

void PoolPartition::acquire_random(std::mt19937_64& rng, int64_t count) {
  TORCH_CHECK(count >= 0 && count <= static_cast<int64_t>(unlabelled_.size()), "acquire_random: cannot move ", count,
              " of ", unlabelled_.size(), " unlabelled rows");
  std::vector<size_t> positions(unlabelled_.size());
  std::iota(positions.begin(), positions.end(), size_t{0});
  shuffle_prefix(positions, count, rng);
  positions.resize(static_cast<size_t>(count));
  move(positions);
}

void PoolPartition::acquire_by(const at::Tensor& scores, int64_t count, const AcquisitionOptions& options) {
  if (options.selection == BatchSelection::kTop) return acquire_top(scores, count);
  const int64_t rows = static_cast<int64_t>(labelled_.size() + unlabelled_.size());
  TORCH_CHECK(scores.dim() == 1 && scores.size(0) == rows, "acquire_by: expected one score per pool row (", rows,
              "), got ", scores.sizes());
  const at::Tensor unlabelled = scores.to(at::kDouble).cpu().index_select(0, at::tensor(unlabelled_, at::kLong));
  std::vector<size_t> positions;
  for (const int64_t p : select_batch(unlabelled, count, options)) positions.push_back(static_cast<size_t>(p));
  move(positions);
}

void PoolPartition::acquire_batchbald(const at::Tensor& member_probabilities, int64_t count,
                                      const AcquisitionOptions& options) {
  const int64_t rows = static_cast<int64_t>(labelled_.size() + unlabelled_.size());
  TORCH_CHECK(member_probabilities.dim() == 3 && member_probabilities.size(1) == rows,
              "acquire_batchbald: expected member probabilities (K, ", rows, ", C), got ",
              member_probabilities.sizes());
  const at::Tensor unlabelled = member_probabilities.index_select(1, at::tensor(unlabelled_, at::kLong));
  std::vector<size_t> positions;
  for (const int64_t p : batchbald_select(unlabelled, count, kDefaultBatchBaldSamples, options.seed).rows) {
    positions.push_back(static_cast<size_t>(p));
  }
  move(positions);
}

void PoolPartition::move(const std::vector<size_t>& positions) {
  std::vector<char> moved(unlabelled_.size(), 0);
  for (const size_t p : positions) {
    labelled_.push_back(unlabelled_[p]);
    moved[p] = 1;
  }
  size_t kept = 0;
  for (size_t p = 0; p < unlabelled_.size(); ++p) {
    if (!moved[p]) unlabelled_[kept++] = unlabelled_[p];
  }
  unlabelled_.resize(kept);
}

// --- ActiveLearningLoop ----------------------------------------------------------

ActiveLearningLoop::ActiveLearningLoop(const EnsembleTrainerOptions& trainer_options, const at::Tensor& pool_x,
                                       const at::Tensor& pool_y, const at::Tensor& test_x, const at::Tensor& test_y,
                                       const ActiveLearningOptions& options)
    : options_(options), members_per_run_(trainer_options.members()) {
  options_.validate();
  const int64_t runs = strategies() * options_.ensembles();
  const EnsembleTrainerOptions pack = pack_options(trainer_options, runs, options_.acquisition());
  TORCH_CHECK(pool_x.dim() == 2 && test_x.dim() == 2 && test_y.dim() == 2 && test_y.size(1) == 1 &&
                  test_x.size(0) == test_y.size(0) && test_x.size(1) == pool_x.size(1),
              "active learning: expected pool x (N, I) and test x (T, I), y (T, 1), got ", pool_x.sizes(), ", ",
              test_x.sizes(), ", ", test_y.sizes());
  check_sizes(options_, pack.batch_size(), pool_x.size(0));
  pool_x_ = pool_x.to(at::kDouble).cpu();
  test_x_ = test_x.to(at::kDouble).cpu();
  test_y_ = test_y.to(at::kDouble).cpu().reshape({1, -1});
  const std::vector<int64_t> initial = initial_rows(pool_x_.size(0), options_.initial(), options_.seed());
  runs_.assign(static_cast<size_t>(runs), PoolPartition(pool_x_.size(0), initial));
  for (int64_t g = 0; g < options_.ensembles(); ++g) random_rngs_.emplace_back(mix(options_.seed(), kRandomStream + g));
  trainer_ = std::make_unique<EnsembleTrainer>(pack);
  trainer_->prepare(pool_x_, pool_y.to(at::kDouble).cpu(), {}, {}, at::tensor(initial, at::kLong));
}

ActiveLearningLoop::~ActiveLearningLoop() = default;

uint64_t ActiveLearningLoop::round_seed() const {
  return mix(trainer_->options().seed(), mix(options_.seed(), kRoundStream + static_cast<uint64_t>(round_)));
}

at::Tensor ActiveLearningLoop::member_rows() const {
  std::vector<at::Tensor> per_run;
  for (const PoolPartition& run : runs_) per_run.push_back(at::tensor(run.labelled(), at::kLong));
  return at::stack(per_run).repeat_interleave(members_per_run_, 0);  // (K, n): member k gets run k / M's rows
}

void ActiveLearningLoop::train_round() {
  const auto start = std::chrono::steady_clock::now();
  // The random runs start each round from their acquired twin's weights (runs
  // [G, 2G) from [0, G)): the two curves differ only in which rows were labelled.
  const int64_t paired = options_.random_baseline() ? options_.ensembles() * members_per_run_ : 0;
  trainer_->reinitialize(round_seed(), paired);
  trainer_->set_training_rows(member_rows());
  trainer_->train();
  train_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Each run's mean over its usable members (a diverged member is left out, as in
// EnsembleTrainer::predict) of per-member values (K, ...): (runs, ...).
at::Tensor ActiveLearningLoop::run_means(const at::Tensor& member_values) const {
  const int64_t runs = static_cast<int64_t>(runs_.size()), M = members_per_run_;
  std::vector<double> usable;
  for (const MemberState& m : trainer_->member_states()) usable.push_back(m.usable ? 1.0 : 0.0);
  std::vector<int64_t> shape{runs, M};
  for (int64_t d = 1; d < member_values.dim(); ++d) shape.push_back(1);
  const at::Tensor w = at::tensor(usable, at::kDouble).view(shape);
  const at::Tensor count = w.sum(1);  // (runs, 1...)
  for (int64_t r = 0; r < runs; ++r) {
    if (count[r].sum().item<double>() == 0) {
      throw std::runtime_error("active learning: every member of run " + std::to_string(r) +
                               " diverged; lower the learning rate");
    }
  }
  std::vector<int64_t> grouped{runs, M};
  for (int64_t d = 1; d < member_values.dim(); ++d) grouped.push_back(member_values.size(d));
  const at::Tensor values = at::where(w > 0, member_values.to(at::kDouble).view(grouped), 0.0);  // (runs, M, ...)
  return (values * w).sum(1) / count;
}

// Run `run`'s members of a whole-pack prediction, as the prediction of that run's
// ensemble (its usable members included).
EnsemblePrediction ActiveLearningLoop::run_prediction(const EnsemblePrediction& all, int64_t run) const {
  try {
    return member_range(all, run * members_per_run_, members_per_run_, trainer_->options().head(), trainer_->classes());
  } catch (const std::runtime_error&) {
    throw std::runtime_error("active learning: every member of run " + std::to_string(run) +
                             " diverged; lower the learning rate");
  }
}

std::vector<double> ActiveLearningLoop::test_metric() const {
  const EnsemblePrediction p = trainer_->predict(test_x_);
  at::Tensor metric;
  if (classification()) {
    const at::Tensor probabilities = run_means(p.member_probabilities);  // (runs, T, C)
    const at::Tensor target = class_indices(test_y_.reshape({-1}), trainer_->classes(), "active learning test");
    metric = probabilities.argmax(2).eq(target.unsqueeze(0)).to(at::kDouble).mean(1);
  } else {
    metric = (run_means(p.member_mean) - test_y_).square().mean(1).sqrt();
  }
  metric = metric.contiguous();
  return {metric.data_ptr<double>(), metric.data_ptr<double>() + metric.numel()};
}

void ActiveLearningLoop::acquire() {
  const EnsemblePrediction all = trainer_->predict(pool_x_);
  const int64_t G = options_.ensembles();
  for (int64_t g = 0; g < G; ++g) {
    AcquisitionOptions o = options_.acquisition();
    o.seed = mix(o.seed, mix(static_cast<uint64_t>(round_), static_cast<uint64_t>(g)));  // fresh draws per round, run
    const EnsemblePrediction run = run_prediction(all, g);
    if (o.strategy == AcquisitionStrategy::kBatchBald) {  // from the run's usable members' probabilities
      const at::Tensor included = at::tensor(run.included, at::kLong);
      runs_[static_cast<size_t>(g)].acquire_batchbald(run.member_probabilities.index_select(0, included),
                                                      options_.acquire(), o);
    } else {
      runs_[static_cast<size_t>(g)].acquire_by(acquisition_scores(run, o), options_.acquire(), o);
    }
  }
  if (!options_.random_baseline()) return;
  for (int64_t g = 0; g < G; ++g) {
    runs_[static_cast<size_t>(G + g)].acquire_random(random_rngs_[static_cast<size_t>(g)], options_.acquire());
  }
}

LearningCurvePoint ActiveLearningLoop::next_round() {
  TORCH_CHECK(!done(), "active learning: all ", options_.rounds(), " rounds are done");
  train_round();
  LearningCurvePoint point;
  point.round = round_;
  point.labelled = static_cast<int64_t>(runs_.front().labelled().size());
  const std::vector<double> metric = test_metric();
  const auto G = static_cast<std::ptrdiff_t>(options_.ensembles());
  point.acquired_runs.assign(metric.begin(), metric.begin() + G);
  point.random_runs.assign(metric.begin() + G, metric.end());
  point.acquired = mean(point.acquired_runs);
  point.random = mean(point.random_runs);
  ++round_;
  if (!done()) acquire();
  return point;
}

ActiveLearningResult run_active_learning(const EnsembleTrainerOptions& trainer_options, const at::Tensor& pool_x,
                                         const at::Tensor& pool_y, const at::Tensor& test_x, const at::Tensor& test_y,
                                         const ActiveLearningOptions& options, const RoundCallback& on_round) {
  ActiveLearningLoop loop(trainer_options, pool_x, pool_y, test_x, test_y, options);
  ActiveLearningResult result;
  result.strategy = std::string(kAcquisitionStrategyNames.name(options.acquisition().strategy));
  result.metric = loop.classification() ? "accuracy" : "rmse";
  result.pack_members = loop.trainer().options().members();
  while (!loop.done()) {
    result.curve.push_back(loop.next_round());
    if (on_round) on_round(result.curve.back());
  }
  result.train_seconds = loop.train_seconds();
  for (const PoolPartition& run : loop.runs()) result.labelled.push_back(run.labelled());
  return result;
}

// --- output ------------------------------------------------------------------------

namespace {
std::string cell(double v) {
  if (std::isnan(v)) return "";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.8g", v);
  return buffer;
}
}  // namespace

void write_learning_curve_csv(const std::filesystem::path& path, const ActiveLearningResult& result) {
  const std::string& s = result.strategy;
  const std::string& m = result.metric;
  std::string csv = "round,labelled," + s + "_" + m + ",random_" + m + "," + s + "_std,random_std\n";
  for (const LearningCurvePoint& p : result.curve) {
    csv += std::to_string(p.round) + "," + std::to_string(p.labelled) + "," + cell(p.acquired) + "," + cell(p.random) +
           "," + cell(stddev(p.acquired_runs)) + "," + cell(stddev(p.random_runs)) + "\n";
  }
  write_file_atomically(path, csv);
}

void write_learning_curve_svg(const std::filesystem::path& path, const ActiveLearningResult& result,
                              const std::string& title) {
  PlotSeries acquired{result.strategy, {}, {}, {}}, random{"random", {}, {}, {}};
  for (const LearningCurvePoint& p : result.curve) {
    acquired.x.push_back(static_cast<double>(p.labelled));
    acquired.y.push_back(p.acquired);
    if (p.acquired_runs.size() > 1) acquired.y_error.push_back(stddev(p.acquired_runs));
    if (p.random_runs.empty()) continue;
    random.x.push_back(static_cast<double>(p.labelled));
    random.y.push_back(p.random);
    if (p.random_runs.size() > 1) random.y_error.push_back(stddev(p.random_runs));
  }
  std::vector<PlotSeries> series{acquired};
  if (!random.x.empty()) series.push_back(random);
  PlotOptions options;
  options.title = title;
  options.x_label = "labelled rows";
  options.y_label = result.metric == "accuracy" ? "test accuracy" : "test RMSE (original units)";
  write_file_atomically(path, line_plot_svg(series, options));
}

}  // namespace packtrain::runtime
