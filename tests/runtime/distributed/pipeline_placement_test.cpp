// Pipeline placement: stages split the blocks contiguously, balanced by parameters
// or by measured time, and the bytes each rank holds fall as ~1/S; S x R ranks split
// into each replica's pipeline and each stage's replicas.
#include "packtrain/runtime/distributed/pipeline_placement.h"
#include "packtrain/ensemble/optimizers/adam.h"
#include "packtrain/ensemble/packed_transformer.h"
#include "packtrain/runtime/distributed/pipeline_groups.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/measure/layer_timing.h"
#include "tests/runtime/distributed/pipeline_test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace packtrain::runtime {
namespace {

using ensemble::PackedTransformer;
using ensemble::PackedTransformerOptions;
using pipeline_testing::adam;
using pipeline_testing::model_options;
using pipeline_testing::ProcessGroup;
using pipeline_testing::run_ranks;

// Scalars of all members that blocks [first, end) with their extras hold.
int64_t stage_parameters(const PackedTransformerOptions& options, int64_t first, int64_t end) {
  int64_t n = 0;
  for (const ensemble::ParameterSpec& spec : ensemble::transformer_parameters(options, {first, end})) {
    int64_t m = 1;
    for (const int64_t d : spec.shape) m *= d;
    n += m;
  }
  return n * options.members();
}

TEST(PipelinePlacementTest, ContiguousBalancedAndEveryStageHoldsABlock) {
  const PackedTransformerOptions options = model_options(at::kFloat, 8).width(64).heads(4).max_length(64);
  for (int64_t S : {1, 2, 4, 8}) {
    SCOPED_TRACE("S = " + std::to_string(S));
    const auto placement = distributed::place_pipeline(options, S, 4, 32);
    ASSERT_EQ(static_cast<int64_t>(placement.size()), S);
    int64_t next = 0, largest = 0, total = 0;
    for (const auto& p : placement) {
      EXPECT_EQ(p.blocks.first_layer, next);
      EXPECT_GT(p.blocks.end_layer, p.blocks.first_layer);
      EXPECT_EQ(p.parameters, stage_parameters(options, p.blocks.first_layer, p.blocks.end_layer));
      next = p.blocks.end_layer;
      largest = std::max(largest, p.parameters);
      total += p.parameters;
    }
    EXPECT_EQ(next, 8);
    // No other contiguous split has a smaller largest stage: moving any boundary
    // one block either way cannot lower the maximum.
    for (int64_t s = 0; s + 1 < S; ++s) {
      for (int64_t shift : {-1, 1}) {
        std::vector<int64_t> ends;
        for (const auto& p : placement) ends.push_back(p.blocks.end_layer);
        ends[static_cast<size_t>(s)] += shift;
        int64_t first = 0, worst = 0;
        bool valid = true;
        for (int64_t end : ends) {
          valid = valid && end > first;
          if (valid) worst = std::max(worst, stage_parameters(options, first, end));
          first = end;
        }
        if (valid) {
          EXPECT_GE(worst, largest) << "boundary " << s << " moved by " << shift;
        }
      }
    }
    if (S == 1) {
      EXPECT_EQ(total, PackedTransformer(options).parameters().flat().numel());
    }
  }
  EXPECT_THROW(distributed::place_pipeline(options, 0, 4, 32), std::invalid_argument);
  EXPECT_THROW(distributed::place_pipeline(options, 9, 4, 32), std::invalid_argument);
  EXPECT_DOUBLE_EQ(distributed::bubble_fraction(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(distributed::bubble_fraction(1, 8), 0.0);
}

// Placed by time, a stage costs its blocks' time plus the embedding's (first stage)
// and the heads' (last): the slowest stage is as fast as any contiguous split
// allows, heavy heads push blocks off the last stage (where balancing parameters
// would not), and a placement's boundaries give it back.
TEST(PipelinePlacementTest, ByTimeMinimizesTheSlowestStage) {
  const PackedTransformerOptions options = model_options(at::kFloat, 8);
  const LayerTimes times{0.5, 1.0, 4.0};
  const auto cost = [&](int64_t a, int64_t b) {
    return static_cast<double>(b - a) * times.block + (a == 0 ? times.embedding : 0.0) + (b == 8 ? times.heads : 0.0);
  };
  const auto two = distributed::place_pipeline_by_time(options, 2, 4, 12, times);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].blocks.first_layer, 6) << "6.5 s | 6 s is the only split whose slowest stage is below 7 s";
  EXPECT_DOUBLE_EQ(two[0].seconds, 6.5);
  EXPECT_DOUBLE_EQ(two[1].seconds, 6.0);
  EXPECT_LT(distributed::place_pipeline(options, 2, 4, 12)[1].blocks.first_layer, 6);
  // Static stage steps recompute the forward on stages before the last: stage 0's
  // blocks cost 1.5 s each (+0.75 s embeddings), so it gets fewer: 6.75 s | 8 s.
  const LayerTimes forwards{0.5, 1.0, 4.0, 0.25, 0.5};
  const auto recomputed = distributed::place_pipeline_by_time(options, 2, 4, 12, forwards, /*recompute=*/true);
  EXPECT_EQ(recomputed[1].blocks.first_layer, 4);
  EXPECT_DOUBLE_EQ(recomputed[0].seconds, 6.75);
  EXPECT_DOUBLE_EQ(recomputed[1].seconds, 8.0);
  // Three stages: no split of 8 blocks has a faster slowest stage (all 21 tried).
  const auto three = distributed::place_pipeline_by_time(options, 3, 4, 12, times);
  double slowest = 0, best = 1e9;
  for (const auto& p : three) slowest = std::max(slowest, cost(p.blocks.first_layer, p.blocks.end_layer));
  for (int64_t a = 1; a < 8; ++a) {
    for (int64_t b = a + 1; b < 8; ++b) best = std::min(best, std::max({cost(0, a), cost(a, b), cost(b, 8)}));
  }
  EXPECT_DOUBLE_EQ(slowest, best);
  // The boundaries round-trip; bad ones are refused.
  const auto again = distributed::place_pipeline_at(options, distributed::stage_boundaries(three), 4, 12);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(again[s].blocks.first_layer, three[s].blocks.first_layer);
    EXPECT_EQ(again[s].blocks.end_layer, three[s].blocks.end_layer);
    EXPECT_EQ(again[s].parameters, three[s].parameters);
  }
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{0}, {8}, {5, 3}, {4, 4}}) {
    EXPECT_THROW(distributed::place_pipeline_at(options, bad, 4, 12), std::invalid_argument);
  }
}

// The bytes each rank holds — its stage's parameters, gradients and Adam moments,
// measured from the tensors — fall as ~1/S: the largest rank holds at most 1.3x an
// even share of the whole model's (the embeddings and heads make the end stages
// heavier; a model whose blocks dominate, as this one's 16 do, stays near 1/S).
TEST(PipelinePlacementTest, BytesPerRankFallAsOneOverS) {
  const PackedTransformerOptions options = model_options(at::kFloat, 16).width(64).heads(4).max_length(64);
  const auto held_bytes = [](PackedTransformer& model) {
    ensemble::PackedAdam optimizer(model.parameters(), adam());
    int64_t bytes = model.parameters().flat().nbytes() + model.parameters().flat_grad().nbytes();
    for (const auto& [name, t] : optimizer.state()) bytes += static_cast<int64_t>(t.nbytes());
    return bytes;
  };
  PackedTransformer whole(options);
  const int64_t one = held_bytes(whole);
  for (int64_t S : {2, 4, 8}) {
    int64_t largest = 0;
    const auto placement = distributed::place_pipeline(options, S, 4, 32);
    for (const auto& p : placement) {
      PackedTransformer stage(options, p.blocks);
      const int64_t bytes = held_bytes(stage);
      // The placement's estimate is what the tensors hold (up to Adam's step counts).
      EXPECT_NEAR(static_cast<double>(bytes), static_cast<double>(p.state_bytes), 0.01 * p.state_bytes);
      largest = std::max(largest, bytes);
    }
    EXPECT_LE(static_cast<double>(largest), 1.3 * static_cast<double>(one) / static_cast<double>(S)) << "S = " << S;
  }
}

// S x R ranks split into each replica's pipeline and each stage's replicas: a
// reduction over either group sums just its ranks; a group's errors name it and the
// rank in the whole run; a run whose size is no multiple of S is refused on every rank.
TEST(PipelineGroupsTest, SubgroupsReduceOverTheirRanksAndNameThemselvesInErrors) {
  PACKTRAIN_SKIP_WITHOUT_GLOO();
  const std::vector<std::string> errors = run_ranks(
      6,
      [&](int64_t rank, ProcessGroup& group) {
        const distributed::PipelineGroups g = distributed::split_pipeline_groups(group, 3);
        EXPECT_EQ(g.stages, 3);
        EXPECT_EQ(g.replicas, 2);
        at::Tensor along = at::full({2}, static_cast<double>(rank), at::kDouble), across = along.clone();
        g.pipeline->all_reduce_sum_(along, "pipeline sum");
        g.stage_replicas->all_reduce_sum_(across, "replica sum");
        const int64_t s = rank % 3, r = rank / 3;
        EXPECT_EQ(along[0].item<double>(), static_cast<double>(3 * r * 3 + 0 + 1 + 2)) << "rank " << rank;
        EXPECT_EQ(across[1].item<double>(), static_cast<double>(s + (s + 3))) << "rank " << rank;
        EXPECT_EQ(g.pipeline->rank(), s);
        EXPECT_EQ(g.stage_replicas->rank(), r);
        if (rank == 1) {  // stage 1's replica 1 (rank 4) never answers
          at::Tensor t = at::zeros({1}, at::kDouble);
          g.stage_replicas->recv_(t, 1, 7, "a message from replica 1", 3);
        }
      },
      std::chrono::seconds(2));
  EXPECT_THAT(errors[1], ::testing::HasSubstr("a message from replica 1 at step 3 failed on rank 0 of 2 of stage 1's "
                                              "replicas (rank 1 of 6)"));
  for (size_t r : {0, 2, 3, 4, 5}) EXPECT_EQ(errors[r], "") << "rank " << r;

  const std::vector<std::string> refused =
      run_ranks(3, [&](int64_t, ProcessGroup& group) { distributed::split_pipeline_groups(group, 2); });
  for (const std::string& e : refused) {
    EXPECT_THAT(e, ::testing::HasSubstr("2 pipeline stages need a multiple of 2 ranks")) << e;
    EXPECT_THAT(e, ::testing::HasSubstr("this run has 3")) << e;
  }
}

}  // namespace
}  // namespace packtrain::runtime
