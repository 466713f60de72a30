// Acquisition scores and batch selection (runtime/trainers/uncertainty/acquisition.h).
#include "packtrain/runtime/trainers/uncertainty/acquisition.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_predictions.h"
#include "packtrain/runtime/trainers/uncertainty/predictive_distribution.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace packtrain::runtime {

bool strategy_for_classification(AcquisitionStrategy s) {
  switch (s) {
    case AcquisitionStrategy::kBald:
    case AcquisitionStrategy::kEntropy:
    case AcquisitionStrategy::kMargin:
    case AcquisitionStrategy::kVariationRatio:
    case AcquisitionStrategy::kBatchBald: return true;
    default: return false;
  }
}

namespace {

at::Generator generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

std::string fit_error(AcquisitionStrategy s, bool classification) {
  return "the acquisition strategy '" + std::string(kAcquisitionStrategyNames.name(s)) + "' scores " +
         (classification ? "regression" : "classification") + " predictions; this model is a " +
         (classification ? "classifier (use bald, batchbald, entropy, margin, variation-ratio or random)"
                         : "regressor (use epistemic, variance, ucb or random)");
}

// The usable members' class probabilities (K, N, C), float64.
at::Tensor included_probabilities(const EnsemblePrediction& p) {
  return p.member_probabilities.to(at::kDouble).index_select(0, at::tensor(p.included, at::kLong));
}

void check_power(const AcquisitionOptions& o) {
  if (!(o.power >= 0 && std::isfinite(o.power))) {
    throw UserError("the sampling power must be finite and >= 0, got " + std::to_string(o.power));
  }
}

// The strategies that score the members' disagreement: with one member it is 0 (or
// rounding's 1e-15) for every row, and ranking by it would be noise.
void check_disagreement(const AcquisitionOptions& o, int64_t members) {
  const bool disagreement = o.strategy == AcquisitionStrategy::kEpistemic || o.strategy == AcquisitionStrategy::kBald ||
                            o.strategy == AcquisitionStrategy::kBatchBald ||
                            o.strategy == AcquisitionStrategy::kVariationRatio;
  if (disagreement && members < 2) {
    throw UserError(fmt::format(
        "{} scores the members' disagreement, which needs at least 2 members; this ensemble has {} usable (train "
        "more members, or use {})",
        kAcquisitionStrategyNames.name(o.strategy), members, members == 1 ? "entropy, margin or random" : "random"));
  }
}

}  // namespace

void check_acquisition_options(const AcquisitionOptions& o, bool classification) {
  if (o.strategy != AcquisitionStrategy::kRandom && strategy_for_classification(o.strategy) != classification) {
    throw UserError(fit_error(o.strategy, classification));
  }
  if (o.strategy == AcquisitionStrategy::kBatchBald && o.selection != BatchSelection::kTop) {
    throw UserError(
        "batchbald chooses its batch greedily by joint mutual information, not by sampling: use the "
        "selection top (the default), or power/softmax sampling with bald");
  }
  o.validate();
}

const OptionSchema<AcquisitionOptions>& acquisition_option_schema() {
  static const OptionSchema<AcquisitionOptions> schema = [] {
    OptionSchema<AcquisitionOptions> s("acquisition options", /*format_version=*/1);
    describe_acquisition_options(
        s, [](auto& o) -> auto& { return o; }, "Acquisition", "seed", "--seed");
    return s;
  }();
  return schema;
}

void AcquisitionOptions::validate() const { acquisition_option_schema().check_ranges(*this); }

AcquisitionStrategy default_strategy(bool classification) {
  return classification ? AcquisitionStrategy::kBald : AcquisitionStrategy::kEpistemic;
}

at::Tensor acquisition_scores(const EnsemblePrediction& p, const AcquisitionOptions& o) {
  const bool classification = p.member_probabilities.defined();
  const int64_t N = classification ? p.member_probabilities.size(1) : p.member_mean.size(1);
  check_acquisition_options(o, classification);
  if (o.strategy == AcquisitionStrategy::kRandom) {
    return at::rand({N}, generator(o.seed), at::kDouble);
  }
  check_disagreement(o, static_cast<int64_t>(p.included.size()));
  switch (o.strategy) {
    case AcquisitionStrategy::kEpistemic: return decompose_uncertainty(p).epistemic_std;
    case AcquisitionStrategy::kTotalVariance: return decompose_uncertainty(p).total_std.square();
    case AcquisitionStrategy::kUcb: {
      const UncertaintyDecomposition d = decompose_uncertainty(p);
      return d.mean + o.ucb_beta * d.total_std;
    }
    case AcquisitionStrategy::kBald:
    case AcquisitionStrategy::kBatchBald: return decompose_class_uncertainty(p).mutual_information;
    case AcquisitionStrategy::kEntropy: return decompose_class_uncertainty(p).entropy;
    case AcquisitionStrategy::kMargin: {
      const at::Tensor mixture = included_probabilities(p).mean(0);  // (N, C)
      if (mixture.size(1) < 2) return at::zeros({N}, at::kDouble);
      const at::Tensor top = std::get<0>(mixture.topk(2, 1));
      return 1 - (top.select(1, 0) - top.select(1, 1));
    }
    case AcquisitionStrategy::kVariationRatio: {
      const at::Tensor members = included_probabilities(p);
      const int64_t K = members.size(0), C = members.size(2);
      const at::Tensor votes = at::one_hot(members.argmax(2), C).sum(0);  // (N, C)
      return 1 - std::get<0>(votes.max(1)).to(at::kDouble) / static_cast<double>(K);
    }
    default: break;
  }
  throw std::logic_error("acquisition_scores: unhandled strategy");
}

at::Tensor acquisition_scores_in_chunks(const std::function<EnsemblePrediction(const at::Tensor&)>& predict,
                                        const at::Tensor& x, const AcquisitionOptions& o, int64_t chunk_rows) {
  if (o.strategy == AcquisitionStrategy::kRandom) return at::rand({x.size(0)}, generator(o.seed), at::kDouble);
  at::Tensor scores = at::empty({x.size(0)}, at::kDouble);
  predict_in_chunks(predict, x, chunk_rows, [&](int64_t first, const EnsemblePrediction& p) {
    const at::Tensor chunk = acquisition_scores(p, o);
    scores.narrow(0, first, chunk.size(0)).copy_(chunk);
  });
  return scores;
}

std::vector<int64_t> select_batch(const at::Tensor& scores, int64_t count, const AcquisitionOptions& o) {
  const at::Tensor s = scores.reshape({-1}).to(at::kDouble).cpu();
  const int64_t N = s.size(0);
  if (count < 1 || count > N) {
    throw UserError("cannot choose " + std::to_string(count) + " rows from a pool of " + std::to_string(N) + " (1 to " +
                    std::to_string(N) + ")");
  }
  if (!at::isfinite(s).all().item<bool>()) throw UserError("acquisition scores must be finite");
  if (o.strategy == AcquisitionStrategy::kBatchBald) {
    throw std::logic_error("select_batch: batchbald's batch is chosen from member probabilities (batchbald_select)");
  }
  if (o.selection == BatchSelection::kTop) {
    const at::Tensor chosen = std::get<1>(s.topk(count, 0, /*largest=*/true, /*sorted=*/true)).contiguous();
    return {chosen.data_ptr<int64_t>(), chosen.data_ptr<int64_t>() + count};
  }
  check_power(o);
  if (o.selection == BatchSelection::kPower && (s < 0).any().item<bool>()) {
    throw UserError("power sampling needs scores >= 0 (" + std::string(kAcquisitionStrategyNames.name(o.strategy)) +
                    " gave negative ones): use softmax sampling");
  }
  // Gumbel top-k: the top `count` of log-weight + Gumbel noise are a draw without
  // replacement with probabilities proportional to the weights.
  const at::Tensor u = at::rand({N}, generator(o.seed ^ 0x9E3779B97F4A7C15ULL), at::kDouble).clamp_min(1e-300);
  const at::Tensor gumbel = -(-u.log()).log();
  // The log-weights relative to the largest (<= 0), so power * them cannot overflow
  // to +inf: a huge power sends all but the top rows to -inf, never to a tie at +inf.
  const at::Tensor log_score = o.selection == BatchSelection::kPower ? s.log() : s;
  const double top = log_score.max().item<double>();
  const at::Tensor log_weight = o.power == 0         ? at::zeros_like(s)  // uniform
                                : std::isfinite(top) ? o.power * (log_score - top)
                                                     : o.power * log_score;  // every score 0 under power
  const at::Tensor key = log_weight + gumbel;  // weight 0: -inf, chosen only after every positive one
  // Rows of equal key (-inf) in the order of their scores: sort by score, then
  // stably by key.
  const at::Tensor by_score = std::get<1>(s.sort(/*stable=*/true, 0, /*descending=*/true));
  const at::Tensor by_key = std::get<1>(key.index_select(0, by_score).sort(/*stable=*/true, 0, /*descending=*/true));
  const at::Tensor chosen = by_score.index_select(0, by_key.narrow(0, 0, count)).contiguous();
  return {chosen.data_ptr<int64_t>(), chosen.data_ptr<int64_t>() + count};
}

BatchBaldSelection batchbald_in_chunks(const std::function<EnsemblePrediction(const at::Tensor&)>& predict,
                                       const at::Tensor& x, int64_t count, const AcquisitionOptions& o,
                                       int64_t chunk_rows) {
  check_acquisition_options(o, /*classification=*/true);
  const int64_t N = x.size(0);
  at::Tensor probabilities;  // (K, N, C), allocated once the first chunk gives K and C
  predict_in_chunks(predict, x, chunk_rows, [&](int64_t first, const EnsemblePrediction& p) {
    if (!p.member_probabilities.defined()) throw UserError(fit_error(o.strategy, /*classification=*/false));
    check_disagreement(o, static_cast<int64_t>(p.included.size()));
    const at::Tensor chunk = included_probabilities(p);  // (K, rows, C)
    if (!probabilities.defined()) {
      const int64_t K = chunk.size(0), C = chunk.size(2);
      if (K * N * C > kMaxBatchBaldValues) {
        throw UserError("batchbald keeps the pool's member probabilities: " + std::to_string(K) + " members x " +
                        std::to_string(N) + " rows x " + std::to_string(C) + " classes is more than " +
                        std::to_string(kMaxBatchBaldValues) +
                        " values (1 GiB); acquire from a smaller pool "
                        "(split it) or use bald");
      }
      probabilities = at::empty({K, N, C}, at::kDouble);
    }
    probabilities.narrow(1, first, chunk.size(1)).copy_(chunk);
  });
  return batchbald_select(probabilities, count, kDefaultBatchBaldSamples, o.seed);
}

}  // namespace packtrain::runtime
