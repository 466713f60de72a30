// BatchBALD's greedy batch (runtime/trainers/uncertainty/batchbald.h).
#include "packtrain/runtime/trainers/uncertainty/batchbald.h"

#include "packtrain/base/user_error.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace packtrain::runtime {
namespace {

// One chunk's joint (E, rows, C): 8 MB of doubles, so a chunk's buffers come from the
// heap again and again instead of fresh pages from the kernel (128 MB chunks spent
// more time in page faults than in arithmetic: 18 s system of 58 s for one 10-row
// acquisition over 1,418 rows, 10,002 configurations).
constexpr int64_t kChunkValues = int64_t{1} << 20;

// The chosen rows' label configurations e, each with its probability under every
// member, q (E, K) = prod_i p_k(y_i^e) up to a factor alpha_e per configuration, and
// the weight w_e each configuration's terms of the joint entropy take:
//   H(chosen, y_n) = -sum_e w_e sum_c J log J + offset,  J (E, C) = q p_n / K.
// Exact: every configuration, w = 1, alpha = 1. Sampled: configurations drawn from
// the members, w = 1 / (M q_e) (importance weights), q scaled to max_k = 1 so that
// long products do not underflow, offset = -mean_e log alpha_e.
struct Configurations {
  at::Tensor q;       // (E, K)
  at::Tensor weight;  // (E)
  double offset = 0;
};

// The joint entropy H(chosen, y_n) of every candidate row n: (N).
at::Tensor joint_entropies(const Configurations& s, const at::Tensor& flat /* (K, N*C) */, int64_t N, int64_t C) {
  const int64_t E = s.q.size(0), K = s.q.size(1);
  at::Tensor h = at::empty({N}, at::kDouble);
  const int64_t chunk = std::max<int64_t>(1, kChunkValues / (E * C));
  for (int64_t first = 0; first < N; first += chunk) {
    const int64_t rows = std::min(chunk, N - first);
    at::Tensor joint = at::mm(s.q, flat.narrow(1, first * C, rows * C)).div_(K).view({E, rows, C});
    const at::Tensor plogp = joint.xlogy_(joint).sum(2);  // (E, rows), in place: one chunk-sized buffer
    h.narrow(0, first, rows).copy_(at::mv(plogp.t(), s.weight).neg_().add_(s.offset));
  }
  return h;
}

// M = ceil(samples / K) * K configurations of the chosen rows' labels, the same
// number drawn from each member (each row's label from that member's p).
Configurations sampled(const at::Tensor& p /* (K, N, C) */, const std::vector<int64_t>& chosen, int64_t samples,
                       at::Generator& gen) {
  const int64_t K = p.size(0);
  const int64_t per_member = (samples + K - 1) / K, M = per_member * K;
  at::Tensor log_q = at::zeros({K, M}, at::kDouble);  // (K', M): config m = k * per_member + s drawn from member k
  for (const int64_t row : chosen) {
    const at::Tensor p_row = p.select(1, row);  // (K, C)
    const at::Tensor labels = at::multinomial(p_row, per_member, /*replacement=*/true, gen).reshape({M});
    log_q.add_(p_row.index_select(1, labels).log());
  }
  const at::Tensor log_alpha = std::get<0>(log_q.max(0));  // (M): finite, the drawing member's
  Configurations s;
  s.q = (log_q - log_alpha).exp().t().contiguous();  // (M, K), max_k = 1
  s.weight = 1.0 / (s.q.mean(1) * static_cast<double>(M));
  s.offset = -log_alpha.mean().item<double>();
  return s;
}

void check_inputs(const at::Tensor& p, int64_t count, int64_t samples) {
  if (p.dim() != 3 || p.size(0) < 1 || p.size(1) < 1 || p.size(2) < 1) {
    throw UserError("BatchBALD needs member probabilities shaped (members, rows, classes), got " +
                    std::string(c10::str(p.sizes())));
  }
  if (p.size(0) < 2) {
    throw UserError("BatchBALD scores the members' disagreement, which needs at least 2 members, got " +
                    std::to_string(p.size(0)));
  }
  if (count < 1 || count > p.size(1)) {
    throw UserError("BatchBALD cannot choose " + std::to_string(count) + " rows from a pool of " +
                    std::to_string(p.size(1)) + " (1 to " + std::to_string(p.size(1)) + ")");
  }
  if (samples < 1) throw UserError("BatchBALD needs samples >= 1, got " + std::to_string(samples));
  if (!(p >= 0).logical_and(p <= 1).all().item<bool>()) {
    throw UserError("BatchBALD needs member probabilities in [0, 1] (finite)");
  }
}

}  // namespace

BatchBaldSelection batchbald_select(const at::Tensor& member_probabilities, int64_t count, int64_t samples,
                                    uint64_t seed) {
  check_inputs(member_probabilities, count, samples);
  const at::Tensor p = member_probabilities.to(at::kDouble).cpu().contiguous();  // (K, N, C)
  const int64_t K = p.size(0), N = p.size(1), C = p.size(2);
  const at::Tensor flat = p.view({K, N * C});
  const at::Tensor conditional = -at::xlogy(p, p).sum(2).mean(0);  // (N): E_k H[p_k(y_n)]
  const double* cond = conditional.data_ptr<double>();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);

  Configurations exact{at::ones({1, K}, at::kDouble), at::ones({1}, at::kDouble), 0.0};
  bool is_exact = true;
  BatchBaldSelection out;
  std::vector<char> taken(static_cast<size_t>(N), 0);
  double chosen_conditional = 0;  // sum of the chosen rows' E_k H
  for (int64_t t = 0; t < count; ++t) {
    const at::Tensor h =
        joint_entropies(is_exact ? exact : sampled(p, out.rows, samples, gen), flat, N, C).contiguous();
    const double* joint = h.data_ptr<double>();
    int64_t best = -1;
    double best_mi = -std::numeric_limits<double>::infinity();
    for (int64_t n = 0; n < N; ++n) {
      const double mi = joint[n] - chosen_conditional - cond[n];
      if (!taken[static_cast<size_t>(n)] && (best < 0 || mi > best_mi)) best = n, best_mi = mi;
    }
    taken[static_cast<size_t>(best)] = 1;
    out.rows.push_back(best);
    out.joint_mutual_information.push_back(best_mi);
    chosen_conditional += cond[best];
    if (is_exact && exact.q.size(0) * C <= samples) {   // every configuration of the chosen rows' labels
      const at::Tensor p_best = p.select(1, best).t();  // (C, K)
      exact.q = (exact.q.unsqueeze(1) * p_best.unsqueeze(0)).reshape({-1, K});
      exact.weight = at::ones({exact.q.size(0)}, at::kDouble);
    } else {
      is_exact = false;
    }
  }
  return out;
}

}  // namespace packtrain::runtime
