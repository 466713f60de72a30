// Pipeline placement: which contiguous blocks of a PackedTransformer each of S
// pipeline stages holds (stage s on rank s), balanced by parameter count — the
// first stage also holds the embeddings, the last the final norm, the heads and,
// with a tied LM head, a copy of the token embedding — and what each rank holds in
// bytes, for the placement table a pipeline run prints.
#pragma once

#include "packtrain/ensemble/packed_transformer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace packtrain::runtime::distributed {

struct StagePlacement {
  ensemble::TransformerStage blocks;  // [first_layer, end_layer)
  int64_t parameters = 0;             // scalars, all K members
  // Bytes this rank keeps for the whole run: parameters, their gradients and
  // Adam's two moments (4 x the parameters' bytes).
  int64_t state_bytes = 0;
  // Bytes of one micro-batch's activation this stage sends forward (K x rows x
  // tokens x width; the last stage sends none), at `rows` and `tokens` given.
  int64_t activation_bytes = 0;
};

// The blocks of each of `stages` stages minimizing the largest stage's parameter
// count, every stage at least one block. Throws std::invalid_argument when stages
// is < 1 or exceeds the model's blocks. rows x tokens: one micro-batch's shape.
std::vector<StagePlacement> place_pipeline(const ensemble::PackedTransformerOptions& model, int64_t stages,
                                           int64_t rows, int64_t tokens);

// One line per stage: "stage 1: blocks 2-3, 1.21 M parameters, state 19.4 MB, sends 0.5 MB per micro-batch".
std::vector<std::string> describe_placement(const std::vector<StagePlacement>& placement);

// The modelled idle fraction of a pipeline step (the "bubble") with S stages and M
// micro-batches under GPipe or 1F1B: (S - 1) / (M + S - 1).
double bubble_fraction(int64_t stages, int64_t micro_batches);

}  // namespace packtrain::runtime::distributed
