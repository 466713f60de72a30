#include "packtrain/runtime/trainers/member_parallel.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/input_file.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/io/checkpoint_file.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <set>
#include <system_error>

namespace packtrain::runtime {

namespace fs = std::filesystem;

namespace {
constexpr const char* kManifestFormat = "packtrain-member-parallel-1";
}

MemberShard member_shard(int64_t members, int64_t ranks, int64_t rank) {
  const int64_t base = members / ranks, extra = members % ranks;
  return {rank * base + std::min(rank, extra), base + (rank < extra ? 1 : 0)};
}

std::optional<ShardManifest> read_shard_manifest(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) check_input_file(path, "checkpoint", uint64_t{1} << 40);  // missing: its reader says so
  std::ifstream in(path, std::ios::binary);
  if (!in || in.peek() != '{') return std::nullopt;  // a checkpoint container (or missing: its reader says so)
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("format", "") != kManifestFormat) {
    throw runtime::DataError(path + ": not a packtrain checkpoint or member-parallel manifest");
  }
  ShardManifest m;
  try {
    m.members = j.at("members").get<int64_t>();
    m.ranks = j.value("ranks", static_cast<int64_t>(j.at("shards").size()));
    m.epoch = j.value("epoch", int64_t{0});
    const fs::path dir = fs::path(path).parent_path();
    for (const auto& s : j.at("shards")) {
      m.shards.push_back({dir / s.at("file").get<std::string>(), s.at("first_member").get<int64_t>(),
                          s.at("members").get<int64_t>()});
    }
  } catch (const nlohmann::json::exception& e) {
    throw runtime::DataError(path + ": malformed member-parallel manifest: " + e.what());
  }
  int64_t next = 0;
  for (const ShardManifest::Shard& s : m.shards) {
    if (s.first_member != next || s.members <= 0) {
      throw runtime::DataError(fmt::format("{}: its shards do not cover members 0..{} in order (shard {} starts at "
                                           "member {}, expected {})",
                                           path, m.members - 1, s.file.filename().string(), s.first_member, next));
    }
    next += s.members;
  }
  if (next != m.members || static_cast<int64_t>(m.shards.size()) != m.ranks) {
    throw runtime::DataError(fmt::format("{}: {} shards with {} members in all, but the manifest says {} ranks and {} "
                                         "members",
                                         path, m.shards.size(), next, m.ranks, m.members));
  }
  return m;
}

ShardedCheckpoint::ShardedCheckpoint(fs::path manifest, runtime::distributed::ProcessGroup& group, int64_t members)
    : manifest_(std::move(manifest)), group_(&group), members_(members) {}

void ShardedCheckpoint::save(const runtime::EnsembleTrainer& trainer, const std::string& extra) {
  const int64_t epoch = trainer.epoch();
  if (epoch == saved_epoch_) return;  // committed already (an interrupt right after a periodic save)
  const int64_t W = group_->world_size(), r = group_->rank();
  const auto shard_name = [&](int64_t rank) {
    return fmt::format("{}.e{}.shard-{}-of-{}", manifest_.filename().string(), epoch, rank, W);
  };
  const fs::path mine = manifest_.parent_path() / shard_name(r);
  trainer.save(mine, extra);
  group_->barrier();  // every shard is on disk before the manifest that commits them
  if (r == 0) {
    nlohmann::json shards = nlohmann::json::array();
    for (int64_t i = 0; i < W; ++i) {
      const MemberShard s = member_shard(members_, W, i);
      shards.push_back({{"file", shard_name(i)}, {"first_member", s.first}, {"members", s.count}});
    }
    runtime::write_file_atomically(manifest_, nlohmann::json{{"format", kManifestFormat},
                                                             {"members", members_},
                                                             {"ranks", W},
                                                             {"epoch", epoch},
                                                             {"shards", shards}}
                                                  .dump(1));
  }
  group_->barrier();  // committed: every other shard file of this manifest is garbage now
  if (r == 0) {  // earlier commits, another number of ranks, a run that died while saving
    std::set<std::string> committed;
    for (int64_t i = 0; i < W; ++i) committed.insert(shard_name(i));
    const std::string prefix = manifest_.filename().string() + ".e";
    std::error_code error;
    const fs::path dir = manifest_.parent_path().empty() ? fs::path(".") : manifest_.parent_path();
    for (const auto& entry : fs::directory_iterator(dir, error)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with(prefix) && name.find(".shard-") != std::string::npos && !committed.contains(name)) {
        std::error_code ignored;
        fs::remove(entry.path(), ignored);
      }
    }
  }
  saved_epoch_ = epoch;
}

runtime::EnsemblePrediction gather_predictions(const runtime::EnsembleTrainer& trainer, const at::Tensor& x,
                                               MemberShard shard, int64_t members,
                                               runtime::distributed::ProcessGroup& group) {
  const runtime::EnsembleTrainerOptions& o = trainer.options();
  const int64_t N = x.size(0);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  runtime::EnsemblePrediction all;
  if (o.head() == runtime::Head::kClassification) {
    all.member_probabilities = at::zeros({members, N, static_cast<int64_t>(trainer.classes().size())}, f64);
  } else {
    all.member_mean = at::zeros({members, N}, f64);
    if (o.head() == runtime::Head::kGaussian) all.member_variance = at::zeros({members, N}, f64);
  }
  // A shard whose members all diverged contributes nothing (predict would refuse).
  const auto& states = trainer.member_states();
  if (std::any_of(states.begin(), states.end(), [](const runtime::MemberState& m) { return m.usable; })) {
    runtime::place_members(all, trainer.predict(x), shard.first, members);
  }
  at::Tensor usable = at::zeros({members}, f64);
  for (int64_t k : all.included) usable[k] = 1.0;
  for (at::Tensor* t : {&all.member_mean, &all.member_variance, &all.member_probabilities}) {
    if (t->defined()) group.all_reduce_sum_(*t, "prediction gather");
  }
  group.all_reduce_sum_(usable, "prediction gather");
  all.included.clear();
  for (int64_t k = 0; k < members; ++k) {
    if (usable[k].item<double>() > 0) all.included.push_back(k);
  }
  return runtime::combine_members(std::move(all), o.head(), trainer.classes());
}

}  // namespace packtrain::runtime
