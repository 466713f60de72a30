// Which unlabelled rows to label next: acquisition scores from an ensemble's
// prediction on a pool (higher: more worth a label) and the choice of a batch —
// the top b, or b drawn at random in proportion to the scores (power or softmax
// sampling, Kirsch et al., 2023), which keeps near-duplicate rows of a dense region
// from filling the whole batch. `packtrain acquire` and the active-learning loop
// both score and choose through here.
#pragma once

#include "packtrain/base/enum_names.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
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
  // Either head: a baseline.
  kRandom,
};
inline constexpr EnumNames<AcquisitionStrategy, 8> kAcquisitionStrategyNames{
    "acquisition strategy",
    {{{AcquisitionStrategy::kEpistemic, "epistemic"},
      {AcquisitionStrategy::kTotalVariance, "variance"},
      {AcquisitionStrategy::kUcb, "ucb"},
      {AcquisitionStrategy::kBald, "bald"},
      {AcquisitionStrategy::kEntropy, "entropy"},
      {AcquisitionStrategy::kMargin, "margin"},
      {AcquisitionStrategy::kVariationRatio, "variation-ratio"},
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

struct AcquisitionOptions {
  AcquisitionStrategy strategy = AcquisitionStrategy::kEpistemic;
  BatchSelection selection = BatchSelection::kTop;
  double ucb_beta = 2.0;  // UCB's multiple of the total std
  double power = 1.0;     // the sampling exponent (power) or inverse temperature (softmax)
  uint64_t seed = 0;      // random scores, sampled batches
};

// UCB's beta is bounded: mean + beta * std of a larger one overflows, and it means
// "by the std alone" long before.
inline constexpr double kMaxUcbBeta = 1e6;

// UserError, saying what to use instead, when `options` cannot score
// the predictions of a classifier (or a regressor): a strategy of the other head, a
// UCB beta that is not finite or beyond +-kMaxUcbBeta, a sampling power that is not
// finite and >= 0. Check before the work that ends in scoring (a pool read, rounds
// of training).
void check_acquisition_options(const AcquisitionOptions& options, bool classification);

// Scores (N, float64) of the prediction's rows under `options.strategy`; throws
// UserError as check_acquisition_options.
at::Tensor acquisition_scores(const EnsemblePrediction& p, const AcquisitionOptions& options);

// The scores of every row of a pool x (N, I), predicted by `predict` `chunk_rows` rows
// at a time (ensemble_predictions.h's predict_in_chunks) keeping only each row's
// score: equal to acquisition_scores(predict(x)) with memory for one chunk's
// prediction, not the whole pool's. kRandom draws its N scores without predicting.
at::Tensor acquisition_scores_in_chunks(const std::function<EnsemblePrediction(const at::Tensor&)>& predict,
                                        const at::Tensor& x, const AcquisitionOptions& options, int64_t chunk_rows);

// Row indices of the batch of `count` rows (count <= N), in the order chosen:
// highest score first for kTop; for the sampled selections, Gumbel top-k on
// log(score) * power or score * power, seeded, taken relative to the highest score
// so a huge power cannot overflow (it tends to kTop; rows it leaves at weight 0 come
// last, by score). kPower needs scores >= 0.
std::vector<int64_t> select_batch(const at::Tensor& scores, int64_t count, const AcquisitionOptions& options);

}  // namespace packtrain::runtime
