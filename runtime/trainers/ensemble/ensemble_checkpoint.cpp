// EnsembleTrainer's checkpoints: encode (save), decode (read_checkpoint, restore)
// and the selection of members from a member-parallel run's shards.
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"

#include "packtrain/ensemble/optimizers/packed_optimizer.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/graphs/device_batcher.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_steps.h"

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>

namespace packtrain::runtime {

namespace fs = std::filesystem;

struct EnsembleTrainer::Checkpoint {
  fs::path path;
  c10::impl::GenericDict payload{c10::StringType::get(), c10::AnyType::get()};
};

namespace {

constexpr const char* kCheckpointFormat = "packtrain-trainer-1";
at::Tensor cpu_copy(const at::Tensor& t) { return t.detach().to(at::kCPU).clone(); }
at::Tensor doubles(const std::vector<double>& v) { return at::tensor(v, at::kDouble).reshape({-1}); }
std::vector<double> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kDouble).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}
}  // namespace

void EnsembleTrainer::save(const fs::path& path, const std::string& extra, int64_t crash_after_bytes) const {
  TORCH_CHECK(model_, "save: nothing to save (no model)");
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("format", std::string(kCheckpointFormat));
  d.insert("options", to_json(options_));
  d.insert("extra", extra);
  d.insert("in_features", in_features_);
  d.insert("classes", doubles(classes_));
  d.insert("x_mean", cpu_copy(x_scale_.mean));
  d.insert("x_std", cpu_copy(x_scale_.std));
  if (y_scale_.mean.defined()) {
    d.insert("y_mean", cpu_copy(y_scale_.mean));
    d.insert("y_std", cpu_copy(y_scale_.std));
  }
  d.insert("params", cpu_copy(model_->parameters().flat()));
  std::vector<int64_t> status, best_epoch, ended, usable;
  std::vector<double> best_loss;
  for (const MemberState& m : members_) {
    status.push_back(static_cast<int64_t>(m.status));
    best_epoch.push_back(m.best_epoch);
    ended.push_back(m.ended_epoch);
    usable.push_back(m.usable ? 1 : 0);
    best_loss.push_back(m.best_loss);
  }
  d.insert("member_status", at::tensor(status, at::kLong));
  d.insert("member_best_epoch", at::tensor(best_epoch, at::kLong));
  d.insert("member_ended_epoch", at::tensor(ended, at::kLong));
  d.insert("member_usable", at::tensor(usable, at::kLong));
  d.insert("member_best_loss", doubles(best_loss));
  d.insert("epoch", epoch_);
  d.insert("steps_taken", steps_taken_);
  d.insert("train_history", doubles(train_history_));
  d.insert("val_history", doubles(val_history_));
  d.insert("variance_scale", variance_scale_);
  d.insert("data_fingerprint", static_cast<int64_t>(data_fingerprint_));
  d.insert("prepared", prepared());
  if (prepared()) {
    c10::impl::GenericDict opt(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [name, tensor] : optimizer_->state()) opt.insert(name, cpu_copy(tensor));
    d.insert("optimizer", opt);
    // Device-neutral: (seed, epochs drawn), not a generator's raw state (a CPU
    // generator's does not restore into a CUDA one, nor the reverse).
    const graphs::OrderState order = steps_->batcher().order_state();
    d.insert("order_seed", static_cast<int64_t>(order.seed));  // the bits of the uint64
    d.insert("order_epochs", order.epochs_drawn);
    if (best_params_.defined()) d.insert("best_params", cpu_copy(best_params_));
    if (resume_params_.defined()) d.insert("resume_params", cpu_copy(resume_params_));
    if (steps_->batcher().active_rows().defined()) d.insert("training_rows", cpu_copy(steps_->batcher().active_rows()));
  }
  save_checkpoint(path, d, crash_after_bytes);
}

std::shared_ptr<const EnsembleTrainer::Checkpoint> EnsembleTrainer::read_checkpoint(const fs::path& path) {
  const c10::IValue payload = load_checkpoint(path);
  auto checkpoint = std::make_shared<Checkpoint>();
  checkpoint->path = path;
  if (!payload.isGenericDict() || !payload.toGenericDict().contains("format") ||
      !payload.toGenericDict().at("format").isString() ||
      payload.toGenericDict().at("format").toStringRef() != kCheckpointFormat) {
    throw DataError(path.string() + ": not a packtrain trainer checkpoint (expected format " + kCheckpointFormat + ")");
  }
  checkpoint->payload = payload.toGenericDict();
  return checkpoint;
}

EnsembleTrainerOptions EnsembleTrainer::checkpoint_options(const Checkpoint& checkpoint) {
  try {
    return options_from_json(checkpoint.payload.at("options").toStringRef());
  } catch (const UserError& e) {
    throw DataError(checkpoint.path.string() + ": bad options in checkpoint: " + e.what());
  }
}

std::string EnsembleTrainer::checkpoint_extra(const Checkpoint& checkpoint) {
  return checkpoint.payload.at("extra").toStringRef();
}

int64_t EnsembleTrainer::checkpoint_epoch(const Checkpoint& checkpoint) {
  return checkpoint.payload.at("epoch").toInt();
}

uint64_t EnsembleTrainer::checkpoint_data_fingerprint(const Checkpoint& checkpoint) {
  return static_cast<uint64_t>(checkpoint.payload.at("data_fingerprint").toInt());
}

namespace {

// Flat (N = K * P) buffers <-> member rows (K, P), through a layout of K members.
at::Tensor to_rows(const at::Tensor& flat, const ensemble::PackedParameters& p) { return at::cat(p.blocks(flat), 1); }

at::Tensor from_rows(const at::Tensor& rows, const ensemble::PackedParameters& p) {
  at::Tensor flat = at::zeros({rows.size(0) * p.per_member()}, rows.options());
  const std::vector<at::Tensor> blocks = p.blocks(flat);
  int64_t column = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].copy_(rows.narrow(1, column, p.numel(i)));
    column += p.numel(i);
  }
  return flat;
}

// Members [first, first + count) of a member-parallel run's shards, gathered one
// tensor at a time: every shard's members as rows, (K_s, P) per flat buffer, (K_s)
// per per-member tensor, each shard's converted once.
class MemberGather {
 public:
  using Checkpoint = EnsembleTrainer::Checkpoint;
  // The parameter layout of a pack of `members` members of the run.
  using LayoutOf = std::function<std::shared_ptr<ensemble::PackedParameters>(int64_t members)>;
  // A shard's tensor, or none where the shard lacks it.
  using Get = std::function<c10::optional<at::Tensor>(const Checkpoint&)>;

  MemberGather(const std::vector<EnsembleTrainer::MemberSource>& shards, int64_t first, int64_t count,
               LayoutOf layout_of, std::string where)
      : shards_(shards),
        first_(first),
        count_(count),
        layout_of_(std::move(layout_of)),
        where_(std::move(where)),
        target_(layout_of_(count)) {}

  // The selection's layout (count members).
  const ensemble::PackedParameters& target() const { return *target_; }

  // Gathers the members of a tensor that every shard holds: flat or per member; an
  // undefined tensor where a shard lacks it.
  at::Tensor gather(const Get& get, bool flat) {
    std::vector<at::Tensor> rows;
    std::map<const Checkpoint*, at::Tensor> by_shard;  // each shard's rows, converted once
    for (int64_t m = first_; m < first_ + count_; ++m) {
      const auto [c, k] = locate(m);
      at::Tensor& shard_rows = by_shard[c];
      if (!shard_rows.defined()) {
        const c10::optional<at::Tensor> t = get(*c);
        if (!t) return at::Tensor();
        shard_rows = flat ? to_rows(*t, *shard_layout(c)) : *t;
      }
      rows.push_back(shard_rows[k]);
    }
    const at::Tensor stacked = at::stack(rows);
    return flat ? from_rows(stacked, *target_) : stacked;
  }

 private:
  // Which shard holds member m, and its index there.
  std::pair<const Checkpoint*, int64_t> locate(int64_t m) const {
    for (const auto& [checkpoint, shard_first] : shards_) {
      const int64_t n = EnsembleTrainer::checkpoint_options(*checkpoint).members();
      if (m >= shard_first && m < shard_first + n) return {checkpoint.get(), m - shard_first};
    }
    throw DataError(fmt::format("{}member {} is in none of the shards given", where_, m));
  }

  std::shared_ptr<ensemble::PackedParameters> shard_layout(const Checkpoint* c) {
    auto& p = layouts_[c];
    if (!p) p = layout_of_(EnsembleTrainer::checkpoint_options(*c).members());
    return p;
  }

  const std::vector<EnsembleTrainer::MemberSource>& shards_;
  int64_t first_, count_;
  LayoutOf layout_of_;
  std::string where_;
  std::shared_ptr<ensemble::PackedParameters> target_;
  std::map<const Checkpoint*, std::shared_ptr<ensemble::PackedParameters>> layouts_;
};

// The selection's weights (params, best_params, resume_params) and per-member
// records (member_*) into `out`, a copy of the first shard's payload `base`.
void gather_member_tensors(const c10::impl::GenericDict& base, MemberGather& members, c10::impl::GenericDict& out) {
  using Checkpoint = EnsembleTrainer::Checkpoint;
  for (const auto& entry : base) {
    const std::string key = entry.key().toStringRef();
    if (key == "params" || key == "best_params" || key == "resume_params") {
      const at::Tensor gathered = members.gather(
          [&](const Checkpoint& c) -> c10::optional<at::Tensor> {
            return c.payload.contains(key) ? c10::optional<at::Tensor>(c.payload.at(key).toTensor()) : c10::nullopt;
          },
          /*flat=*/true);
      // Optional buffers some shard lacks: none for the selection (restore asks for
      // best weights only where the run has validation data, which all shards share).
      if (gathered.defined()) {
        out.insert_or_assign(key, gathered);
      } else {
        (void)out.erase(key);
      }
    } else if (key.rfind("member_", 0) == 0) {
      out.insert_or_assign(
          key,
          members.gather([&](const Checkpoint& c) -> c10::optional<at::Tensor> { return c.payload.at(key).toTensor(); },
                         /*flat=*/false));
    }
  }
}

// The selection's optimizer state: flat (K0 * P) and per-member (K0) tensors
// gathered, the others (shared by all members) as the first shard's `base` holds them.
c10::impl::GenericDict gather_optimizer_state(const c10::impl::GenericDict& base, MemberGather& members, int64_t K0) {
  c10::impl::GenericDict opt(c10::StringType::get(), c10::AnyType::get());
  const auto base_opt = base.at("optimizer").toGenericDict();
  const int64_t P = members.target().per_member();
  for (const auto& entry : base_opt) {
    const std::string name = entry.key().toStringRef();
    const at::Tensor t = entry.value().toTensor();
    const bool flat = t.numel() == K0 * P, per_member = t.numel() == K0;
    if (!flat && !per_member) {
      opt.insert(name, t);  // shared by all members
      continue;
    }
    opt.insert(name, members.gather(
                         [&](const EnsembleTrainer::Checkpoint& c) -> c10::optional<at::Tensor> {
                           return c.payload.at("optimizer").toGenericDict().at(name).toTensor();
                         },
                         flat));
  }
  return opt;
}

}  // namespace

std::shared_ptr<const EnsembleTrainer::Checkpoint> EnsembleTrainer::select_members(
    const std::vector<MemberSource>& shards, int64_t first, int64_t count) {
  TORCH_CHECK(!shards.empty() && count > 0, "select_members: no shards or no members");
  const Checkpoint& base = *shards.front().first;
  const std::string where = base.path.string() + ": ";
  EnsembleTrainerOptions options = checkpoint_options(base);
  if (options.order() != graphs::BatchOrder::kShared) {
    throw DataError(where + "its members were trained with " + std::string(graphs::to_string(options.order())) +
                    " batch orders, which depend on how the members were sharded: resume it on its own number of "
                    "ranks");
  }
  const int64_t in = base.payload.at("in_features").toInt();
  EnsembleTrainerOptions layout_options = options;
  layout_options.device(c10::Device(c10::kCPU));
  const auto parameters_for = [&](int64_t members) {
    EnsembleTrainerOptions o = layout_options;
    EnsembleTrainer t(o.members(members));
    t.classes_ = to_vector(base.payload.at("classes").toTensor());
    t.build_model(in);
    return std::make_shared<ensemble::PackedParameters>(t.model_->parameters());
  };
  MemberGather members(shards, first, count, parameters_for, where);
  auto out = std::make_shared<Checkpoint>();
  out->path = base.path;
  out->payload = base.payload.copy();
  if (base.payload.contains("training_rows")) {
    throw DataError(where + "trained on per-member training-row sets (active learning): resume it as it was sharded");
  }
  gather_member_tensors(base.payload, members, out->payload);
  if (base.payload.contains("optimizer")) {
    out->payload.insert_or_assign("optimizer", gather_optimizer_state(base.payload, members, options.members()));
  }
  out->payload.insert_or_assign("options", to_json(options.members(count).first_member(first)));
  return out;
}

namespace {
void restore_order(graphs::DeviceBatcher& batcher, const c10::impl::GenericDict& d, int64_t epoch,
                   const graphs::GraphLog& log) {
  if (d.contains("order_epochs")) {
    batcher.restore_order_state({static_cast<uint64_t>(d.at("order_seed").toInt()), d.at("order_epochs").toInt()});
    return;
  }
  // Written before orders were device-neutral ("order_rng": a generator's raw
  // state). Still resumable: later epochs draw from this run's order seed at the
  // epoch reached — the same as the uninterrupted run's model and optimizer state,
  // a different (equally random) sequence of batch orders from here on.
  TORCH_CHECK(d.contains("order_rng"), "no batch-order state (order_epochs)");
  batcher.restore_order_state({batcher.order_state().seed, epoch});
  if (log) {
    log("checkpoint from an earlier packtrain (raw batch-order generator state): resuming with "
        "device-neutral orders from epoch " +
        std::to_string(epoch) + "; batch orders from here on differ from the uninterrupted run's");
  }
}
}  // namespace

void EnsembleTrainer::restore(const Checkpoint& checkpoint) {
  const auto& d = checkpoint.payload;
  const std::string where = checkpoint.path.string() + ": ";
  try {
    const int64_t in = d.at("in_features").toInt();
    classes_ = to_vector(d.at("classes").toTensor());
    if (!model_) build_model(in);
    const int64_t saved = d.at("params").toTensor().numel(), ours = model_->parameters().flat().numel();
    if (in != in_features_ || saved != ours) {
      throw DataError(where + "the checkpoint is for a model with " + std::to_string(in) + " inputs and " +
                      std::to_string(saved) + " parameters; this one has " + std::to_string(in_features_) + " and " +
                      std::to_string(ours));
    }
    if (prepared() && static_cast<int64_t>(data_fingerprint_) != d.at("data_fingerprint").toInt()) {
      throw DataError(where + "the training data differ from the data this checkpoint was trained on");
    }
    at::NoGradGuard no_grad;
    x_scale_ = {d.at("x_mean").toTensor(), d.at("x_std").toTensor()};
    if (d.contains("y_mean")) y_scale_ = {d.at("y_mean").toTensor(), d.at("y_std").toTensor()};
    model_->parameters().flat().detach().copy_(d.at("params").toTensor());
    const at::Tensor status = d.at("member_status").toTensor(), best_epoch = d.at("member_best_epoch").toTensor();
    const at::Tensor ended = d.at("member_ended_epoch").toTensor(), usable = d.at("member_usable").toTensor();
    const at::Tensor best_loss = d.at("member_best_loss").toTensor();
    TORCH_CHECK(status.numel() == options_.members(), "member states for ", status.numel(), " members");
    for (int64_t k = 0; k < options_.members(); ++k) {
      members_[k] = {static_cast<MemberStatus>(status[k].item<int64_t>()), best_epoch[k].item<int64_t>(),
                     best_loss[k].item<double>(), ended[k].item<int64_t>(), usable[k].item<int64_t>() != 0};
    }
    epoch_ = d.at("epoch").toInt();
    steps_taken_ = d.at("steps_taken").toInt();
    train_history_ = to_vector(d.at("train_history").toTensor());
    val_history_ = to_vector(d.at("val_history").toTensor());
    variance_scale_ = d.contains("variance_scale") ? d.at("variance_scale").toDouble() : 1.0;  // absent before it
    TORCH_CHECK(std::isfinite(variance_scale_) && variance_scale_ > 0, "variance scale ", variance_scale_,
                " is not positive and finite");
    if (!prepared()) return;
    TORCH_CHECK(d.at("prepared").toBool(), "the checkpoint holds a model only (no training state to resume)");
    const auto opt = d.at("optimizer").toGenericDict();
    for (const auto& [name, tensor] : optimizer_->state()) {
      TORCH_CHECK(opt.contains(name), "no optimizer state '", name, "' (was it saved with another optimizer?)");
      tensor.copy_(opt.at(name).toTensor());
    }
    restore_order(steps_->batcher(), d, epoch_, options_.log());
    if (best_params_.defined()) {
      TORCH_CHECK(d.contains("best_params"), "no best weights (was it trained without validation data?)");
      best_params_.copy_(d.at("best_params").toTensor());
    }
    if (d.contains("resume_params")) resume_params_ = d.at("resume_params").toTensor().to(options_.device());
    if (d.contains("training_rows")) set_training_rows(d.at("training_rows").toTensor());
  } catch (const c10::Error& e) {
    throw DataError(where + "damaged or incompatible checkpoint: " + e.what_without_backtrace());
  }
}

}  // namespace packtrain::runtime
