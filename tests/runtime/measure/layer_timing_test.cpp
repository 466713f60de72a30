// Layer timing: the measured seconds of a transformer's pieces (embedding, block,
// heads; forward alone and forward + backward) that time-balanced pipeline
// placement uses.
#include "packtrain/runtime/measure/layer_timing.h"
#include "packtrain/ensemble/packed_transformer.h"
#include "tests/runtime/distributed/pipeline_test_support.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

namespace packtrain::runtime {
namespace {

using ensemble::PackedTransformerOptions;
using pipeline_testing::model_options;

// Layer timing measures every piece (positive, finite), and a block 16x wider takes
// clearly longer than a narrow one (~256x the arithmetic; asserted only 3x).
TEST(LayerTimingTest, MeasuresEachPieceAndAWiderBlockTakesLonger) {
  const PackedTransformerOptions narrow = model_options(at::kFloat).width(16).heads(2);
  const PackedTransformerOptions wide = model_options(at::kFloat).width(256).heads(4);
  // Medians of 9: a busy machine (CI beside a build) preempts single runs.
  const LayerTimes a = measure_layer_times(narrow, 8, 16, 9), b = measure_layer_times(wide, 8, 16, 9);
  for (const double t : {a.embedding, a.block, a.heads, a.embedding_forward, a.block_forward, b.embedding, b.block,
                         b.heads, b.embedding_forward, b.block_forward}) {
    EXPECT_TRUE(std::isfinite(t) && t > 0) << t;
  }
  EXPECT_LT(b.block_forward, b.block) << "a forward alone is part of forward + backward";
  EXPECT_GT(b.block, 3 * a.block) << "wide " << b.block << " s, narrow " << a.block << " s";
  EXPECT_THROW(measure_layer_times(narrow, 0, 16), std::invalid_argument);
  EXPECT_THROW(measure_layer_times(narrow, 8, 17), std::invalid_argument);
}

}  // namespace
}  // namespace packtrain::runtime
