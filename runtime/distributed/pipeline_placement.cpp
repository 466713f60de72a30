#include "packtrain/runtime/distributed/pipeline_placement.h"

#include <c10/core/ScalarType.h>
#include <fmt/format.h>

#include <algorithm>
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

std::vector<StagePlacement> place_pipeline(const ensemble::PackedTransformerOptions& model, int64_t stages,
                                           int64_t rows, int64_t tokens) {
  const int64_t L = model.layers();
  if (stages < 1 || stages > L) {
    throw std::invalid_argument(fmt::format("pipeline: {} stages for a model of {} blocks (each stage holds at "
                                            "least one block: use --layers >= --pipeline-stages)",
                                            stages, L));
  }
  const auto cost = [&](int64_t a, int64_t b) { return count(model, {a, b}); };
  // best[s][l]: the smallest largest-stage count placing blocks [0, l) on s stages.
  const int64_t inf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(static_cast<size_t>(stages + 1), std::vector<int64_t>(L + 1, inf));
  std::vector<std::vector<int64_t>> cut(static_cast<size_t>(stages + 1), std::vector<int64_t>(L + 1, 0));
  best[0][0] = 0;
  for (int64_t s = 1; s <= stages; ++s) {
    for (int64_t l = s; l <= L; ++l) {
      for (int64_t a = s - 1; a < l; ++a) {
        if (best[s - 1][a] == inf) continue;
        const int64_t worst = std::max(best[s - 1][a], cost(a, l));
        if (worst < best[s][l]) {
          best[s][l] = worst;
          cut[s][l] = a;
        }
      }
    }
  }
  std::vector<StagePlacement> out(static_cast<size_t>(stages));
  const int64_t bytes = static_cast<int64_t>(c10::elementSize(model.dtype()));
  for (int64_t s = stages, end = L; s >= 1; end = cut[s][end], --s) {
    StagePlacement& p = out[static_cast<size_t>(s - 1)];
    p.blocks = {cut[s][end], end};
    p.parameters = cost(p.blocks.first_layer, end);
    p.state_bytes = 4 * p.parameters * bytes;
    p.activation_bytes = s < stages ? model.members() * rows * tokens * model.width() * bytes : 0;
  }
  return out;
}

std::vector<std::string> describe_placement(const std::vector<StagePlacement>& placement) {
  std::vector<std::string> lines;
  for (size_t s = 0; s < placement.size(); ++s) {
    const StagePlacement& p = placement[s];
    std::string extras;
    if (s == 0) extras += " + embeddings";
    if (s + 1 == placement.size()) extras += " + final norm and heads";
    lines.push_back(fmt::format("stage {} (rank {}): blocks {}-{}{}, {:.3f} M parameters, {:.2f} MB of parameters, "
                                "gradients and Adam state, {}",
                                s, s, p.blocks.first_layer, p.blocks.end_layer - 1, extras, p.parameters / 1e6,
                                p.state_bytes / 1e6,
                                p.activation_bytes > 0
                                    ? fmt::format("sends {:.2f} MB of activations per micro-batch", p.activation_bytes / 1e6)
                                    : std::string("computes the losses")));
  }
  return lines;
}

double bubble_fraction(int64_t stages, int64_t micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace packtrain::runtime::distributed
