// Resuming an ensemble run: see run_resume.h.
#include "packtrain/runtime/trainers/ensemble/run_resume.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/trainers/memory_estimate.h"

#include <fmt/format.h>

#include <utility>
#include <vector>

namespace packtrain::runtime {

namespace {

// The checkpoint of rank `mine`'s members: its own shard when the shards are laid
// out as now, else gathered from the shards that hold them (re-sharded).
std::shared_ptr<const EnsembleTrainer::Checkpoint> shard_checkpoint(const ShardManifest& manifest, MemberShard mine) {
  std::vector<EnsembleTrainer::MemberSource> sources;
  for (auto& [checkpoint, first] : read_shards(manifest)) {
    const int64_t count = EnsembleTrainer::checkpoint_options(*checkpoint).members();
    if (first < mine.first + mine.count && first + count > mine.first)
      sources.emplace_back(std::move(checkpoint), first);
  }
  const bool same_shards = sources.size() == 1 && sources.front().second == mine.first &&
                           EnsembleTrainer::checkpoint_options(*sources.front().first).members() == mine.count;
  return same_shards ? sources.front().first : EnsembleTrainer::select_members(sources, mine.first, mine.count);
}

RunDescription run_of(const EnsembleTrainer::Checkpoint& checkpoint) {
  return run_description_from_json(EnsembleTrainer::checkpoint_extra(checkpoint));
}

// Resuming at or below the checkpoint's epoch would train nothing and rewrite it.
void check_epochs_ahead(const ResumeSource& source, const ResumeOptions& options, int64_t at) {
  if (options.epochs > 0 && options.epochs <= at) {
    throw DataError(fmt::format("{} is at epoch {}; give --epochs above it to train further", source.path, at));
  }
}

// The trainer of the resumed options, joined to a data-parallel group.
std::unique_ptr<EnsembleTrainer> make_trainer(const ResumeSource& source, const ResumeOptions& options) {
  auto trainer = std::make_unique<EnsembleTrainer>(resumed_options(source, options));
  if (!source.member_parallel()) trainer->set_process_group(options.group, options.rank_check_every);
  return trainer;
}

}  // namespace

ResumeSource open_resume(const std::string& path) {
  if (const auto manifest = read_shard_manifest(path)) return open_resume(*manifest, 0, 1);
  ResumeSource source;
  source.path = path;
  source.checkpoint = EnsembleTrainer::read_checkpoint(path);
  source.run = run_of(*source.checkpoint);
  source.shard = {0, EnsembleTrainer::checkpoint_options(*source.checkpoint).members()};
  return source;
}

ResumeSource open_resume(const ShardManifest& manifest, int64_t rank, int64_t ranks) {
  const int64_t K = manifest.members;
  if (K < ranks)
    throw DataError(fmt::format("{}: {} members cannot be split over {} ranks", manifest.path.string(), K, ranks));
  ResumeSource source;
  source.path = manifest.path.string();
  source.manifest = manifest;
  source.shard = member_shard(K, ranks, rank);
  source.checkpoint = shard_checkpoint(manifest, source.shard);
  source.run = run_of(*source.checkpoint);
  return source;
}

EnsembleTrainerOptions resumed_options(const ResumeSource& source, const ResumeOptions& options) {
  EnsembleTrainerOptions o = EnsembleTrainer::checkpoint_options(*source.checkpoint);
  o.device(options.device);
  if (options.epochs > 0) o.epochs(options.epochs);
  o.log(options.log);
  return o;
}

bool describes_its_data(const RunDescription& run) { return run.data.data != "python"; }

ResumedRun resume(const ResumeSource& source, const ResumeOptions& options) {
  if (!describes_its_data(source.run)) {
    throw DataError(source.path +
                    ": this run was fitted from Python and records no data to reload: resume it with "
                    "its training rows (Python: packtrain.resume(path, X, y))");
  }
  ResumedRun out{make_trainer(source, options), load_split_data(source.run.data)};
  EnsembleTrainer& trainer = *out.trainer;
  const EnsembleTrainerOptions& o = trainer.options();
  const Dataset train = out.data.train(), val = out.data.validation();
  const bool validated = val.features.size(0) > 0;
  check_memory(estimate_ensemble_run(o, ensemble_run_sizes(o, out.data, /*checkpoints=*/true)),
               "resume it where more memory is free");
  trainer.prepare(train.features, train.targets, validated ? val.features : at::Tensor(),
                  validated ? val.targets : at::Tensor());
  check_same_data(source.run, out.data, "resume continues a run on its own data only");
  trainer.restore(*source.checkpoint);
  check_epochs_ahead(source, options, trainer.epoch());
  return out;
}

std::unique_ptr<EnsembleTrainer> resume_with_data(const ResumeSource& source, const ResumeOptions& options,
                                                  const at::Tensor& x, const at::Tensor& y, const at::Tensor& val_x,
                                                  const at::Tensor& val_y) {
  std::unique_ptr<EnsembleTrainer> trainer = make_trainer(source, options);
  trainer->prepare(x, y, val_x, val_y);
  trainer->restore(*source.checkpoint);  // DataError when the rows are not the run's
  check_epochs_ahead(source, options, trainer->epoch());
  return trainer;
}

}  // namespace packtrain::runtime
