#include "packtrain/runtime/distributed/pipeline_groups.h"

#include "packtrain/base/user_error.h"

#include <fmt/format.h>

#include <vector>

namespace packtrain::runtime::distributed {

PipelineGroups split_pipeline_groups(ProcessGroup& run, int64_t stages) {
  const int64_t world = run.world_size();
  if (stages < 1 || world % stages != 0) {
    throw UserError(
        fmt::format("{} pipeline stages need a multiple of {} ranks (stages x replicas: packtrain launch "
                    "--nproc {} -- multitask train --pipeline-stages {}, or --nproc {} for 2 replicas); "
                    "this run has {}",
                    stages, stages, stages, stages, 2 * stages, world));
  }
  PipelineGroups g;
  g.stages = stages;
  g.replicas = world / stages;
  g.stage = run.rank() % stages;
  g.replica = run.rank() / stages;
  if (g.replicas == 1) {
    g.pipeline = &run;
    return g;
  }
  // Every rank makes its replica's group first, then its stage's: the same order on all.
  std::vector<int64_t> replica_ranks, stage_ranks;
  for (int64_t s = 0; s < stages; ++s) replica_ranks.push_back(g.replica * stages + s);
  for (int64_t r = 0; r < g.replicas; ++r) stage_ranks.push_back(r * stages + g.stage);
  g.owned_pipeline = run.subgroup(replica_ranks, fmt::format("replica {}'s stages", g.replica));
  g.owned_replicas = run.subgroup(stage_ranks, fmt::format("stage {}'s replicas", g.stage));
  g.pipeline = g.owned_pipeline.get();
  g.stage_replicas = g.owned_replicas.get();
  return g;
}

}  // namespace packtrain::runtime::distributed
