// Which unlabelled rows to label next: acquisition scores from an ensemble's
// prediction on a pool (higher: more worth a label) and the choice of a batch —
// the top b, or b drawn at random in proportion to the scores (power or softmax
// sampling, Kirsch et al., 2023), which keeps near-duplicate rows of a dense region
// from filling the whole batch. `packtrain acquire` and the active-learning loop
// both score and choose through here.
#pragma once

#include "packtrain/base/enum_names.h"
#include "packtrain/base/option_schema.h"
#include "packtrain/runtime/trainers/uncertainty/batchbald.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace packtrain::runtime {

struct EnsemblePrediction;  // runtime/trainers/ensemble/ensemble_predictions.h

enum class AcquisitionStrategy {
  // Regression.
  kEpistemic,      // the std of the member means: disagreement (the spread)
  kTotalVariance,  // the mixture's variance: disagreement plus predicted noise
  kUcb,            // mean + beta * total std: an upper confidence bound (maximization)
  // Classification.
  kBald,            // mutual information between the label and the member: H[mean p] - mean H[p_k]
  kEntropy,         // predictive entropy H[mean p]
  kMargin,          // 1 - (top class probability - second), of the mixture
  kVariationRatio,  // 1 - (members voting for the modal class) / K
  // A row's score is BALD's; the batch is BatchBALD's greedy joint choice
  // (batchbald.h), from the members' probabilities, not from the scores.
  kBatchBald,
  // Either head: a baseline.
  kRandom,
};
inline constexpr EnumNames<AcquisitionStrategy, 9> kAcquisitionStrategyNames{
    "acquisition strategy",
    {{{AcquisitionStrategy::kEpistemic, "epistemic"},
      {AcquisitionStrategy::kTotalVariance, "variance"},
      {AcquisitionStrategy::kUcb, "ucb"},
      {AcquisitionStrategy::kBald, "bald"},
      {AcquisitionStrategy::kEntropy, "entropy"},
      {AcquisitionStrategy::kMargin, "margin"},
      {AcquisitionStrategy::kVariationRatio, "variation-ratio"},
      {AcquisitionStrategy::kBatchBald, "batchbald"},
      {AcquisitionStrategy::kRandom, "random"}}}};

// Whether a strategy applies to a head's predictions (classification or not).
bool strategy_for_classification(AcquisitionStrategy s);

enum class BatchSelection {
  kTop,      // the b highest scores
  kPower,    // b drawn without replacement with probability proportional to score^power
  kSoftmax,  // ... proportional to exp(power * score)
};
inline constexpr EnumNames<BatchSelection, 3> kBatchSelectionNames{
    "batch selection",
    {{{BatchSelection::kTop, "top"}, {BatchSelection::kPower, "power"}, {BatchSelection::kSoftmax, "softmax"}}}};

// Described once, with their defaults' meaning, ranges and flags, by
// acquisition_option_schema() (describe_acquisition_options below): a field added
// here needs one line there to reach validate(), JSON, `acquire`'s and
// `active-learn`'s flags, `packtrain info` and Python's defaults.
struct AcquisitionOptions {
  /// Example: AcquisitionOptions{.strategy = AcquisitionStrategy::kBald, .selection = BatchSelection::kPower}
  AcquisitionStrategy strategy = AcquisitionStrategy::kEpistemic;  // a classifier's default: default_strategy
  BatchSelection selection = BatchSelection::kTop;
  double ucb_beta = 2.0;  // UCB's multiple of the total std
  double power = 1.0;     // the sampling exponent (power) or inverse temperature (softmax)
  uint64_t seed = 0;      // random scores, sampled batches

  // UserError naming the first field outside its schema range (whether or not the
  // strategy and selection use it); check_acquisition_options adds the head's fit.
  void validate() const;
};

// The strategy a run takes when none is given: bald for a classifier, else epistemic
// (the CLI's and Python's "default epistemic|bald").
AcquisitionStrategy default_strategy(bool classification);

// UCB's beta is bounded: mean + beta * std of a larger one overflows, and it means
// "by the std alone" long before.
inline constexpr double kMaxUcbBeta = 1e6;

// The acquisition options' fields, described once, on the schema of any options
// struct O that holds an AcquisitionOptions where `access` (O& -> AcquisitionOptions&)
// says: AcquisitionOptions itself (acquisition_option_schema: `acquire`'s flags) or
// ActiveLearningOptions::acquisition() (`active-learn`'s). `seed_name` is the seed's
// JSON name; `seed_flag` its flag, "" for none (active-learn seeds by --al-seed).
template <typename O, typename Access>
void describe_acquisition_options(OptionSchema<O>& s, Access access, const std::string& group,
                                  const std::string& seed_name, const std::string& seed_flag) {
  s.choice(
       "strategy", [access](auto& o) -> auto& { return access(o).strategy; }, kAcquisitionStrategyNames)
      .help_text("How the pool is scored; default epistemic (regression) or bald (classification)")
      .in_group(group);
  s.choice(
       "selection", [access](auto& o) -> auto& { return access(o).selection; }, kBatchSelectionNames)
      .help_text("top: the b highest scores; power/softmax: b drawn with probability ~ score^power or exp(power*score)")
      .in_group(group);
  s.option(
       "power", [access](auto& o) -> auto& { return access(o).power; })
      .help_text("Exponent (power) or inverse temperature (softmax) of the sampling")
      .in_group(group)
      .at_least(0)
      .finite_only();
  s.option(
       "ucb_beta", [access](auto& o) -> auto& { return access(o).ucb_beta; })
      .help_text("UCB: mean + beta * total std")
      .in_group(group)
      .at_least(-kMaxUcbBeta)
      .at_most(kMaxUcbBeta);
  OptionField<O>& seed = s.option(
                              seed_name, [access](auto& o) -> auto& { return access(o).seed; })
                             .help_text("Seed of random scores and sampled batches")
                             .in_group(group);
  if (seed_flag.empty())
    seed.no_flag();
  else
    seed.flag_name(seed_flag);
}

// `packtrain acquire`'s options: the fields above, format version 1.
const OptionSchema<AcquisitionOptions>& acquisition_option_schema();

// UserError, saying what to use instead, when `options` cannot score
// the predictions of a classifier (or a regressor): a strategy of the other head,
// batchbald with a sampled selection (its batch is greedy), or a field outside its
// schema range (validate(): a UCB beta that is not finite or beyond +-kMaxUcbBeta, a
// sampling power that is not finite and >= 0). Check before the work that ends in
// scoring (a pool read, rounds of training).
void check_acquisition_options(const AcquisitionOptions& options, bool classification);

// Scores (N, float64) of the prediction's rows under `options.strategy` (batchbald:
// BALD's); throws UserError as check_acquisition_options.
at::Tensor acquisition_scores(const EnsemblePrediction& p, const AcquisitionOptions& options);

// The scores of every row of a pool x (N, I), predicted by `predict` `chunk_rows` rows
// at a time (ensemble_predictions.h's predict_in_chunks) keeping only each row's
// score: equal to acquisition_scores(predict(x)) with memory for one chunk's
// prediction, not the whole pool's. kRandom draws its N scores without predicting.
at::Tensor acquisition_scores_in_chunks(const std::function<EnsemblePrediction(const at::Tensor&)>& predict,
                                        const at::Tensor& x, const AcquisitionOptions& options, int64_t chunk_rows);

// Row indices of the batch of `count` rows (count <= N), in the order chosen
// (every strategy but batchbald, whose batch batchbald_select chooses):
// highest score first for kTop; for the sampled selections, Gumbel top-k on
// log(score) * power or score * power, seeded, taken relative to the highest score
// so a huge power cannot overflow (it tends to kTop; rows it leaves at weight 0 come
// last, by score). kPower needs scores >= 0.
std::vector<int64_t> select_batch(const at::Tensor& scores, int64_t count, const AcquisitionOptions& options);

// BatchBALD's batch (batchbald.h) of `count` rows of a pool x (N, I), seeded by
// options.seed: the usable members' class probabilities of every row (K, N, C),
// predicted `chunk_rows` rows at a time, then batchbald_select. Throws UserError
// when the model is not a classifier, and when K x N x C exceeds
// kMaxBatchBaldValues (after predicting one chunk, before gathering the rest).
BatchBaldSelection batchbald_in_chunks(const std::function<EnsemblePrediction(const at::Tensor&)>& predict,
                                       const at::Tensor& x, int64_t count, const AcquisitionOptions& options,
                                       int64_t chunk_rows);

}  // namespace packtrain::runtime
