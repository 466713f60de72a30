// Member-parallel runs (`train --member-parallel`, `resume MANIFEST`): an ensemble's
// members split across the ranks of a multi-process run, with no gradient traffic.
// Which members a rank trains, the checkpoint such a run commits (one file per
// shard, then a manifest naming them, written last), and the predictions gathered
// from every rank for the ensemble statistics.
#pragma once

#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace packtrain::runtime::distributed {
class ProcessGroup;
}

namespace packtrain::runtime {

// Rank r's contiguous share of K members over W ranks (sizes differ by at most one).
struct MemberShard {
  int64_t first = 0, count = 0;
};
MemberShard member_shard(int64_t members, int64_t ranks, int64_t rank);

// {"format": "packtrain-member-parallel-1", "members": K, "ranks": W, "epoch": e,
//  "shards": [{"file", "first_member", "members", "checksum"}]}; files are names in
// the manifest's directory; checksum: the shard's payload checksum (16 hex digits;
// absent in manifests from earlier versions).
struct ShardManifest {
  struct Shard {
    std::filesystem::path file;  // resolved against the manifest's directory
    int64_t first_member = 0, members = 0;
    std::optional<uint64_t> checksum;
  };
  std::filesystem::path path;
  int64_t members = 0, ranks = 0, epoch = 0;
  std::vector<Shard> shards;
};
// The manifest at `path`; nothing when it is an ordinary checkpoint; DataError when
// it is neither, has no members or shards, names a shard outside its directory or
// twice, or its shards do not cover members 0..K-1 exactly once.
std::optional<ShardManifest> read_shard_manifest(const std::string& path);

// Every shard of a manifest, read and checked against it (DataError naming the
// shard and the disagreement): its checksum is the one the manifest committed, it
// holds the members the manifest names for it, at the manifest's epoch, and every
// shard comes from the same run (options, data and run description alike).
std::vector<runtime::EnsembleTrainer::MemberSource> read_shards(const ShardManifest& manifest);

// A member-parallel run's checkpoint. save() is collective (every rank calls it after
// the same epoch): each rank writes its shard to "<manifest>.e<epoch>.shard-<r>-of-<W>",
// a barrier, rank 0 writes the manifest (atomically: the commit point), a barrier,
// then rank 0 removes every other shard file of this manifest (earlier commits, other
// numbers of ranks, the uncommitted shards of a run that died while saving). A rank
// that dies at any point leaves the last committed manifest and all its shards
// loadable.
class ShardedCheckpoint {
 public:
  ShardedCheckpoint(std::filesystem::path manifest, runtime::distributed::ProcessGroup& group, int64_t members);
  void save(const runtime::EnsembleTrainer& trainer, const std::string& extra);
  const std::filesystem::path& manifest() const { return manifest_; }

 private:
  std::filesystem::path manifest_;
  runtime::distributed::ProcessGroup* group_;
  int64_t members_;
  int64_t saved_epoch_ = -1;
};

// Every member's predictions for x, gathered on every rank: each rank fills its
// shard's rows, a sum over the ranks does the rest; combined into the ensemble.
// Collective.
runtime::EnsemblePrediction gather_predictions(const runtime::EnsembleTrainer& trainer, const at::Tensor& x,
                                               MemberShard shard, int64_t members,
                                               runtime::distributed::ProcessGroup& group);

}  // namespace packtrain::runtime
