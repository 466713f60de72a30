// Pipeline placement: which contiguous blocks of a PackedTransformer each of S
// pipeline stages holds (stage s on rank s), balanced by parameter count or by
// measured time (LayerTimes below, as runtime/measure/layer_timing.h measures them) — the first stage also holds the
// embeddings, the last the final norm, the heads and, with a tied LM head, a copy
// of the token embedding — and what each rank holds in bytes, for the placement
// table a pipeline run prints.
#pragma once

#include "packtrain/base/enum_names.h"
#include "packtrain/ensemble/packed_transformer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace packtrain::runtime::distributed {

// What a placement balances: the stages' parameters (memory), or their measured
// forward + backward time (the slowest stage sets a pipeline's pace).
enum class PlacementBalance { kParameters, kTime };
inline constexpr EnumNames<PlacementBalance, 2> kPlacementBalanceNames{
    "pipeline balance", {{{PlacementBalance::kParameters, "parameters"}, {PlacementBalance::kTime, "time"}}}};

// Seconds per micro-batch, the median of the repeats: forward + backward of each
// piece, and the forward alone of the embeddings and of a block (what a stage whose
// backward recomputes its forward runs once more: trainers/multitask/pipeline_stage_steps.h).
// Plain data: runtime/measure/layer_timing.h measures them, a caller passes them.
struct LayerTimes {
  double embedding = 0, block = 0, heads = 0;
  double embedding_forward = 0, block_forward = 0;
};

struct StagePlacement {
  ensemble::TransformerStage blocks;  // [first_layer, end_layer)
  int64_t parameters = 0;             // scalars, all K members
  // Bytes this rank keeps for the whole run: parameters, their gradients and
  // Adam's two moments (4 x the parameters' bytes).
  int64_t state_bytes = 0;
  // Bytes of one micro-batch's activation this stage sends forward (K x rows x
  // tokens x width; the last stage sends none), at `rows` and `tokens` given.
  int64_t activation_bytes = 0;
  // Placed by time: this stage's measured seconds per micro-batch (forward +
  // backward of its pieces); 0 otherwise.
  double seconds = 0;
};

// The blocks of each of `stages` stages minimizing the largest stage's parameter
// count, every stage at least one block. Throws std::invalid_argument when stages
// is < 1 or exceeds the model's blocks. rows x tokens: one micro-batch's shape.
std::vector<StagePlacement> place_pipeline(const ensemble::PackedTransformerOptions& model, int64_t stages,
                                           int64_t rows, int64_t tokens);
// The same, minimizing the slowest stage's time: `times`' embedding on the first
// stage, a block's time per block, the heads' on the last; with `recompute` (static
// stage steps, as a GPU runs them) the stages before the last also pay their blocks'
// (and the embeddings') forward once more.
std::vector<StagePlacement> place_pipeline_by_time(const ensemble::PackedTransformerOptions& model, int64_t stages,
                                                   int64_t rows, int64_t tokens, const LayerTimes& times,
                                                   bool recompute = false);
// Seconds per micro-batch of the stage holding `blocks`, from the pieces' `times`:
// what place_pipeline_by_time balances.
double stage_seconds(const ensemble::PackedTransformerOptions& model, ensemble::TransformerStage blocks,
                     const LayerTimes& times, bool recompute = false);
// A placement given by its stages' first blocks after stage 0 (S - 1 of them,
// strictly ascending in [1, layers)): what a checkpoint records, so a resumed run
// holds the blocks its files hold. Throws std::invalid_argument otherwise.
std::vector<StagePlacement> place_pipeline_at(const ensemble::PackedTransformerOptions& model,
                                              const std::vector<int64_t>& boundaries, int64_t rows, int64_t tokens);
// Stages 1..S-1's first blocks: the inverse of place_pipeline_at.
std::vector<int64_t> stage_boundaries(const std::vector<StagePlacement>& placement);

// One line per stage: "stage 1 (rank 1): blocks 2-3, 1.210 M parameters, 19.36 MB of parameters, gradients and
// Adam state, sends 0.52 MB of activations per micro-batch" (and, placed by time, its measured milliseconds).
// With R > 1 replicas stage s is on ranks s, s + S, ...: "stage 1 (ranks 1, 3)".
std::vector<std::string> describe_placement(const std::vector<StagePlacement>& placement, int64_t replicas = 1);

// The modelled idle fraction of a pipeline step (the "bubble") with S stages and M
// micro-batches under GPipe or 1F1B: (S - 1) / (M + S - 1).
double bubble_fraction(int64_t stages, int64_t micro_batches);

}  // namespace packtrain::runtime::distributed
