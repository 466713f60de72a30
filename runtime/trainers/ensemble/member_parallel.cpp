#include "packtrain/runtime/trainers/ensemble/member_parallel.h"

#include "packtrain/base/number_text.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/input_file.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/io/checkpoint_file.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <limits>
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
  if (std::filesystem::exists(path, ec))
    check_input_file(path, "checkpoint", uint64_t{1} << 40);  // missing: its reader says so
  std::ifstream in(path, std::ios::binary);
  if (!in || in.peek() != '{') return std::nullopt;  // a checkpoint container (or missing: its reader says so)
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("format", "") != kManifestFormat) {
    throw runtime::DataError(path + ": not a packtrain checkpoint or member-parallel manifest");
  }
  const auto bad = [&](const std::string& problem) {
    return runtime::DataError(path + ": bad member-parallel manifest: " + problem);
  };
  // A count as JSON holds it: a whole number in int64's range (2^63 would read as
  // negative, 2.5 as 2).
  const auto count = [&](const nlohmann::json& object, const char* key, int64_t missing) {
    if (!object.contains(key) && missing >= 0) return missing;
    const nlohmann::json& v = object.at(key);
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      throw bad(fmt::format("'{}' {}, got {}", key, integer_range_rule<int64_t>(), v.dump()));
    }
    return v.get<int64_t>();
  };
  ShardManifest m;
  m.path = path;
  std::set<std::string> names;
  try {
    m.members = count(j, "members", -1);
    m.ranks = count(j, "ranks", static_cast<int64_t>(j.at("shards").size()));
    m.epoch = count(j, "epoch", 0);
    if (m.members < 1 || m.ranks < 1 || m.epoch < 0) {
      throw bad(fmt::format("{} members, {} ranks, epoch {} (a run has at least one member on one rank)", m.members,
                            m.ranks, m.epoch));
    }
    const fs::path dir = fs::path(path).parent_path();
    for (const auto& s : j.at("shards")) {
      const std::string name = s.at("file").get<std::string>();
      // Shards are written next to their manifest: a manifest never points elsewhere.
      if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
        throw bad(fmt::format("shard file '{}' is not a file name in the manifest's directory", name));
      }
      if (!names.insert(name).second) throw bad(fmt::format("shard file '{}' is named twice", name));
      ShardManifest::Shard shard{dir / name, count(s, "first_member", -1), count(s, "members", -1), {}};
      if (s.contains("checksum")) {
        const std::string hex = s.at("checksum").get<std::string>();
        size_t used = 0;
        try {
          shard.checksum = std::stoull(hex, &used, 16);
        } catch (const std::exception&) {
          used = 0;
        }
        if (hex.size() != 16 || used != hex.size())
          throw bad(fmt::format("shard '{}': checksum '{}' is not 16 hex digits", name, hex));
      }
      m.shards.push_back(std::move(shard));
    }
  } catch (const nlohmann::json::exception& e) {
    throw runtime::DataError(path + ": malformed member-parallel manifest: " + e.what());
  }
  int64_t next = 0;
  for (const ShardManifest::Shard& s : m.shards) {
    if (s.first_member != next || s.members <= 0) {
      throw runtime::DataError(
          fmt::format("{}: its shards do not cover members 0..{} in order (shard {} starts at "
                      "member {}, expected {})",
                      path, m.members - 1, s.file.filename().string(), s.first_member, next));
    }
    next += s.members;
  }
  if (next != m.members || static_cast<int64_t>(m.shards.size()) != m.ranks) {
    throw runtime::DataError(
        fmt::format("{}: {} shards with {} members in all, but the manifest says {} ranks and {} "
                    "members",
                    path, m.shards.size(), next, m.ranks, m.members));
  }
  return m;
}

namespace {

// What every shard of one run shares: its options but for which members the shard
// holds, its run description (data, names, data fingerprint) and training rows.
std::string run_identity(const runtime::EnsembleTrainer::Checkpoint& checkpoint) {
  using runtime::EnsembleTrainer;
  runtime::EnsembleTrainerOptions options = EnsembleTrainer::checkpoint_options(checkpoint);
  options.first_member(0).members(1).device(c10::Device(c10::kCPU));  // ranks train on their own GPUs
  return fmt::format("{}\n{}\n{:x}", runtime::to_json(options), EnsembleTrainer::checkpoint_extra(checkpoint),
                     EnsembleTrainer::checkpoint_data_fingerprint(checkpoint));
}

}  // namespace

std::vector<runtime::EnsembleTrainer::MemberSource> read_shards(const ShardManifest& manifest) {
  using runtime::EnsembleTrainer;
  std::vector<EnsembleTrainer::MemberSource> shards;
  std::string identity;
  for (const ShardManifest::Shard& shard : manifest.shards) {
    const std::string where = fmt::format("{}: shard {}", manifest.path.string(), shard.file.filename().string());
    if (shard.checksum) {
      const uint64_t actual = runtime::checkpoint_checksum(shard.file);
      if (actual != *shard.checksum) {
        throw runtime::DataError(
            fmt::format("{} is not the file this manifest committed (its checksum is {:016x}, "
                        "the manifest's {:016x}): was it replaced or copied over?",
                        where, actual, *shard.checksum));
      }
    }
    auto checkpoint = EnsembleTrainer::read_checkpoint(shard.file);
    const runtime::EnsembleTrainerOptions held = EnsembleTrainer::checkpoint_options(*checkpoint);
    if (held.members() != shard.members || held.first_member() != shard.first_member) {
      throw runtime::DataError(fmt::format("{} holds members {}..{}, but the manifest names {}..{} for it", where,
                                           held.first_member(), held.first_member() + held.members() - 1,
                                           shard.first_member, shard.first_member + shard.members - 1));
    }
    const int64_t epoch = EnsembleTrainer::checkpoint_epoch(*checkpoint);
    if (epoch != manifest.epoch) {
      throw runtime::DataError(
          fmt::format("{} is at epoch {}, but the manifest committed epoch {}", where, epoch, manifest.epoch));
    }
    const std::string id = run_identity(*checkpoint);
    if (identity.empty()) {
      identity = id;
    } else if (id != identity) {
      throw runtime::DataError(
          fmt::format("{} comes from another run than shard {} (options, data or run description "
                      "differ)",
                      where, manifest.shards.front().file.filename().string()));
    }
    shards.emplace_back(std::move(checkpoint), shard.first_member);
  }
  return shards;
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
      const uint64_t checksum = runtime::checkpoint_checksum(manifest_.parent_path() / shard_name(i));
      shards.push_back({{"file", shard_name(i)},
                        {"first_member", s.first},
                        {"members", s.count},
                        {"checksum", fmt::format("{:016x}", checksum)}});
    }
    runtime::write_file_atomically(
        manifest_,
        nlohmann::json{
            {"format", kManifestFormat}, {"members", members_}, {"ranks", W}, {"epoch", epoch}, {"shards", shards}}
            .dump(1));
  }
  group_->barrier();  // committed: every other shard file of this manifest is garbage now
  if (r == 0) {       // earlier commits, another number of ranks, a run that died while saving
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
