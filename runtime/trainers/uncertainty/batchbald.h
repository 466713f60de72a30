// BatchBALD (Kirsch, van Amersfoort and Gal, 2019): a batch of pool rows chosen
// greedily to maximize the joint mutual information I(y_1..y_b; member) between
// their labels and the ensemble member — which a row that repeats a chosen one
// does not raise, so a batch does not fill with near-duplicates as BALD's top b do.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace packtrain::runtime {

// Label configurations of the chosen rows: counted exactly while there are at most
// this many (C^t after t picks), estimated from this many seeded draws beyond.
inline constexpr int64_t kDefaultBatchBaldSamples = 10000;
// The most member probabilities (K x N x C values, float64: 1 GiB) `acquire`
// gathers for BatchBALD; a larger pool is refused, saying so.
inline constexpr int64_t kMaxBatchBaldValues = int64_t{1} << 27;

struct BatchBaldSelection {
  std::vector<int64_t> rows;                     // in the order chosen: rows[0] is BALD's argmax
  std::vector<double> joint_mutual_information;  // I(y_1..y_t; member) once rows[t-1] is chosen
};

// The `count` rows (1 <= count <= N) of member_probabilities (K, N, C), the
// posterior samples being the K members, each pick the row that most raises the
// chosen rows' joint mutual information (ties to the lower row). The joint entropy
// is exact while C^t <= samples; beyond, estimated as the paper and baal do from
// `samples` label configurations drawn from the members (the same number from each,
// rounded up), seeded by `seed`. Memory: (K, N, C) plus about 2^24 values per
// chunk of candidate rows. Throws UserError on a count, samples or probabilities
// (not finite, or outside [0, 1]) it cannot use.
BatchBaldSelection batchbald_select(const at::Tensor& member_probabilities, int64_t count,
                                    int64_t samples = kDefaultBatchBaldSamples, uint64_t seed = 0);

}  // namespace packtrain::runtime
