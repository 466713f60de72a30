#include "packtrain/runtime/distributed/pipeline_placement.h"

#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <stdexcept>

namespace packtrain::runtime::distributed {

namespace {
int64_t count(const ensemble::PackedTransformerOptions& model, ensemble::TransformerStage stage) {
  int64_t n = 0;
  for (const ensemble::ParameterSpec& spec : ensemble::transformer_parameters(model, stage)) {
    int64_t size = 1;
    for (const int64_t s : spec.shape) size *= s;
    n += size;
  }
  return n * model.members();
}
}  // namespace

namespace {
void check_stages(const ensemble::PackedTransformerOptions& model, int64_t stages) {
  if (stages < 1 || stages > model.layers()) {
    throw std::invalid_argument(
        fmt::format("pipeline: {} stages for a model of {} blocks (each stage holds at "
                    "least one block: use --layers >= --pipeline-stages)",
                    stages, model.layers()));
  }
}

// The stages ending at `ends` (stage s: blocks [ends[s-1], ends[s])), with their sizes.
std::vector<StagePlacement> stages_ending_at(const ensemble::PackedTransformerOptions& model,
                                             const std::vector<int64_t>& ends, int64_t rows, int64_t tokens) {
  const auto S = static_cast<int64_t>(ends.size());
  std::vector<StagePlacement> out(ends.size());
  const int64_t bytes = static_cast<int64_t>(c10::elementSize(model.dtype()));
  for (int64_t s = 0, first = 0; s < S; first = ends[static_cast<size_t>(s)], ++s) {
    StagePlacement& p = out[static_cast<size_t>(s)];
    p.blocks = {first, ends[static_cast<size_t>(s)]};
    p.parameters = count(model, p.blocks);
    p.state_bytes = 4 * p.parameters * bytes;
    p.activation_bytes = s + 1 < S ? model.members() * rows * tokens * model.width() * bytes : 0;
  }
  return out;
}

// The stages' ends minimizing the largest cost(first, end) of a stage (contiguous
// blocks, each stage at least one), by dynamic programming over (stages, blocks).
std::vector<int64_t> balanced_ends(int64_t layers, int64_t stages,
                                   const std::function<double(int64_t, int64_t)>& cost) {
  const int64_t L = layers;
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][l]: the smallest largest-stage cost placing blocks [0, l) on s stages.
  std::vector<std::vector<double>> best(static_cast<size_t>(stages + 1), std::vector<double>(L + 1, inf));
  std::vector<std::vector<int64_t>> cut(static_cast<size_t>(stages + 1), std::vector<int64_t>(L + 1, 0));
  best[0][0] = 0;
  for (int64_t s = 1; s <= stages; ++s) {
    for (int64_t l = s; l <= L; ++l) {
      for (int64_t a = s - 1; a < l; ++a) {
        if (best[s - 1][a] == inf) continue;
        const double worst = std::max(best[s - 1][a], cost(a, l));
        if (worst < best[s][l]) {
          best[s][l] = worst;
          cut[s][l] = a;
        }
      }
    }
  }
  std::vector<int64_t> ends(static_cast<size_t>(stages));
  for (int64_t s = stages, end = L; s >= 1; end = cut[s][end], --s) ends[static_cast<size_t>(s - 1)] = end;
  return ends;
}
}  // namespace

std::vector<StagePlacement> place_pipeline(const ensemble::PackedTransformerOptions& model, int64_t stages,
                                           int64_t rows, int64_t tokens) {
  check_stages(model, stages);
  const auto cost = [&](int64_t a, int64_t b) { return static_cast<double>(count(model, {a, b})); };
  return stages_ending_at(model, balanced_ends(model.layers(), stages, cost), rows, tokens);
}

std::vector<StagePlacement> place_pipeline_by_time(const ensemble::PackedTransformerOptions& model, int64_t stages,
                                                   int64_t rows, int64_t tokens, const LayerTimes& times,
                                                   bool recompute) {
  check_stages(model, stages);
  const int64_t L = model.layers();
  const auto seconds = [&](int64_t a, int64_t b) { return stage_seconds(model, {a, b}, times, recompute); };
  std::vector<StagePlacement> out = stages_ending_at(model, balanced_ends(L, stages, seconds), rows, tokens);
  for (StagePlacement& p : out) p.seconds = seconds(p.blocks.first_layer, p.blocks.end_layer);
  return out;
}

double stage_seconds(const ensemble::PackedTransformerOptions& model, ensemble::TransformerStage blocks,
                     const LayerTimes& times, bool recompute) {
  const int64_t a = blocks.first_layer, b = blocks.end_layer, L = model.layers();
  const bool again = recompute && b < L;  // a stage before the last recomputes its forward
  return static_cast<double>(b - a) * (times.block + (again ? times.block_forward : 0.0)) +
         (a == 0 ? times.embedding + (again ? times.embedding_forward : 0.0) : 0.0) + (b == L ? times.heads : 0.0);
}

std::vector<StagePlacement> place_pipeline_at(const ensemble::PackedTransformerOptions& model,
                                              const std::vector<int64_t>& boundaries, int64_t rows, int64_t tokens) {
  check_stages(model, static_cast<int64_t>(boundaries.size()) + 1);
  std::vector<int64_t> ends = boundaries;
  ends.push_back(model.layers());
  for (size_t s = 0; s < boundaries.size(); ++s) {
    if (boundaries[s] < 1 || boundaries[s] >= ends[s + 1]) {
      throw std::invalid_argument(
          fmt::format("pipeline: stage boundaries [{}] must be strictly ascending blocks in "
                      "[1, {})",
                      fmt::join(boundaries, ", "), model.layers()));
    }
  }
  return stages_ending_at(model, ends, rows, tokens);
}

std::vector<int64_t> stage_boundaries(const std::vector<StagePlacement>& placement) {
  std::vector<int64_t> out;
  for (size_t s = 1; s < placement.size(); ++s) out.push_back(placement[s].blocks.first_layer);
  return out;
}

std::vector<std::string> describe_placement(const std::vector<StagePlacement>& placement, int64_t replicas) {
  const auto S = static_cast<int64_t>(placement.size());
  std::vector<std::string> lines;
  for (size_t s = 0; s < placement.size(); ++s) {
    const StagePlacement& p = placement[s];
    std::string extras;
    if (s == 0) extras += " + embeddings";
    if (s + 1 == placement.size()) extras += " + final norm and heads";
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < replicas; ++r) ranks.push_back(r * S + static_cast<int64_t>(s));
    lines.push_back(fmt::format(
        "stage {} ({} {}): blocks {}-{}{}, {:.3f} M parameters, {:.2f} MB of parameters, "
        "gradients and Adam state, {}{}",
        s, replicas > 1 ? "ranks" : "rank", fmt::join(ranks, ", "), p.blocks.first_layer, p.blocks.end_layer - 1,
        extras, p.parameters / 1e6, p.state_bytes / 1e6,
        p.activation_bytes > 0 ? fmt::format("sends {:.2f} MB of activations per micro-batch", p.activation_bytes / 1e6)
                               : std::string("computes the losses"),
        p.seconds > 0 ? fmt::format(", {:.2f} ms per micro-batch (measured)", p.seconds * 1e3) : std::string()));
  }
  return lines;
}

double bubble_fraction(int64_t stages, int64_t micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace packtrain::runtime::distributed
