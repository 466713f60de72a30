// Pipeline groups: how the ranks of a pipeline run of S stages and R replicas
// (pipeline x data parallel, S x R ranks) work together. Rank r holds stage r % S
// of replica r / S, so a replica's stages are neighbouring ranks (on one host, when
// hosts run consecutive ranks). Each replica's S ranks form its pipeline group
// (activations and their gradients travel there); each stage's R ranks, one per
// replica, form that stage's replicas group (its gradients are summed there every
// step, and its weights stay the same on all R).
#pragma once

#include "packtrain/runtime/distributed/process_group.h"

#include <cstdint>
#include <memory>

namespace packtrain::runtime::distributed {

struct PipelineGroups {
  int64_t stages = 1, replicas = 1;
  int64_t stage = 0, replica = 0;  // this rank's
  // This replica's S ranks (rank s holds stage s): the run's group itself when R = 1.
  ProcessGroup* pipeline = nullptr;
  // This stage's R ranks (rank i is replica i's); nullptr when R = 1.
  ProcessGroup* stage_replicas = nullptr;
  // The subgroups made for R > 1.
  std::unique_ptr<ProcessGroup> owned_pipeline, owned_replicas;
};

// Collective over `run` (all its ranks call it): splits its S x R ranks as above.
// Throws packtrain::UserError when the run's size is not a multiple of `stages`, naming both.
PipelineGroups split_pipeline_groups(ProcessGroup& run, int64_t stages);

}  // namespace packtrain::runtime::distributed
