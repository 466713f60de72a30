// Layer timing: how long one micro-batch's forward and backward take through each
// piece a pipeline stage can hold — the embeddings, one transformer block, and the
// final norm with both heads and their losses — measured on the model's device, for
// placing a pipeline's blocks by time (runtime/distributed/pipeline_placement.h)
// rather than by parameter count. Each piece runs as a pipeline stage runs it: the
// embeddings from tokens, a block and the heads from an activation that needs its
// gradient, the backward taking the parameters' (and that input's) gradients.
#pragma once

#include "packtrain/ensemble/packed_transformer.h"
#include "packtrain/runtime/distributed/pipeline_placement.h"

#include <cstdint>

namespace packtrain::runtime {

// The times as plain data are distributed::LayerTimes (pipeline_placement.h): the
// placement takes them without depending on this room.
using distributed::LayerTimes;

// Times the pieces of a one-block model shaped as `model` (its members, width,
// heads, vocabulary, classes, dtype and device) on micro-batches of `rows` x
// `tokens` random sentences: `repeats` timed runs of each after one untimed.
// Throws std::invalid_argument for rows, tokens or repeats < 1, or tokens above the
// model's max_length.
LayerTimes measure_layer_times(const ensemble::PackedTransformerOptions& model, int64_t rows, int64_t tokens,
                               int64_t repeats = 5);

}  // namespace packtrain::runtime
