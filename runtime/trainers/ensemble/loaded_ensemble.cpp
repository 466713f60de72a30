#include "packtrain/runtime/trainers/ensemble/loaded_ensemble.h"

#include "packtrain/runtime/trainers/ensemble/member_parallel.h"

#include <c10/util/Exception.h>

#include <utility>

namespace packtrain::runtime {

LoadedEnsemble LoadedEnsemble::from_checkpoint(const EnsembleTrainer::Checkpoint& checkpoint, c10::Device device,
                                               const graphs::GraphLog& log) {
  EnsembleTrainerOptions options = EnsembleTrainer::checkpoint_options(checkpoint);
  options.device(device);
  options.log(log);
  LoadedEnsemble out;
  out.shards_.push_back({std::make_unique<EnsembleTrainer>(options), 0});
  out.shards_.front().trainer->restore(checkpoint);
  out.run_ = run_description_from_json(EnsembleTrainer::checkpoint_extra(checkpoint));
  out.members_ = options.members();
  return out;
}

LoadedEnsemble LoadedEnsemble::load(const std::string& path, c10::Device device, const graphs::GraphLog& log) {
  const std::optional<ShardManifest> manifest = read_shard_manifest(path);
  if (!manifest) return from_checkpoint(*EnsembleTrainer::read_checkpoint(path), device, log);
  LoadedEnsemble out;
  for (const auto& [checkpoint, first] : read_shards(*manifest)) {
    LoadedEnsemble shard = from_checkpoint(*checkpoint, device, log);
    if (out.shards_.empty()) out.run_ = std::move(shard.run_);
    out.shards_.push_back({std::move(shard.shards_.front().trainer), first});
  }
  out.members_ = manifest->members;
  out.sharded_ = true;
  return out;
}

EnsemblePrediction LoadedEnsemble::predict(const at::Tensor& x) const {
  if (!sharded_) return first().predict(x);
  EnsemblePrediction all;
  for (const Shard& s : shards_) place_members(all, s.trainer->predict(x), s.first_member, members_);
  return combine_members(std::move(all), first().options().head(), first().classes());
}

EnsembleMetrics LoadedEnsemble::evaluate(const at::Tensor& x, const at::Tensor& y) const {
  if (!sharded_) return first().evaluate(x, y);
  return ensemble_metrics(predict(x), y, first().options().head(), first().classes());
}

std::unique_ptr<EnsembleTrainer> LoadedEnsemble::take_trainer() {
  TORCH_CHECK(!sharded_ && shards_.size() == 1, "take_trainer: a member-parallel run has one trainer per shard");
  std::unique_ptr<EnsembleTrainer> trainer = std::move(shards_.front().trainer);
  shards_.clear();
  return trainer;
}

}  // namespace packtrain::runtime
