// MultiTaskTrainer's checkpoints: save (one file, or a pipeline's stage files and
// their manifest), MultiTaskCheckpoint::read, and load (a stage per rank, or the
// stages assembled into the whole model in one process).
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"

#include "packtrain/runtime/trainers/multitask/pretrained_trunk.h"

#include "multitask_trainer_internal.h"
#include "packtrain/profiling/nvtx.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/distributed/pipeline_groups.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/trainers/multitask/multitask_pipeline.h"
#include "packtrain/runtime/trainers/multitask/multitask_steps.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>

namespace packtrain::runtime {

namespace {

constexpr const char* kMultiTaskFormat = "packtrain-multitask-1";
constexpr const char* kPipelineManifestFormat = "packtrain-multitask-pipeline-manifest-1";

// A trainer's checkpoint payload (the whole model's, or one pipeline stage's).
c10::impl::GenericDict trainer_payload(const MultiTaskTrainerOptions& options, const std::string& extra,
                                       const ensemble::PackedTransformer& model, const ensemble::PackedAdam& optimizer,
                                       int64_t epochs, int64_t steps, const std::string& trunk_record) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("format", std::string(kMultiTaskFormat));
  d.insert("options", to_json(options));
  if (!trunk_record.empty()) d.insert("trunk_files", trunk_record);
  d.insert("extra", extra);
  d.insert("params", model.parameters().flat().to(at::kCPU).clone());
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, tensor] : optimizer.state()) state.insert(name, tensor.to(at::kCPU).clone());
  d.insert("optimizer", state);
  d.insert("epochs", epochs);
  d.insert("steps", steps);
  d.insert("first_layer", model.stage().first_layer);
  d.insert("end_layer", model.stage().end_layer);
  return d;
}

c10::impl::GenericDict checkpoint_dict(const std::filesystem::path& path, const char* what) {
  const c10::IValue payload = load_checkpoint(path);
  if (!payload.isGenericDict() || !payload.toGenericDict().contains("format") ||
      !payload.toGenericDict().at("format").isString()) {
    throw DataError(path.string() + ": not a packtrain " + what);
  }
  return payload.toGenericDict();
}

MultiTaskTrainerOptions options_of(const c10::impl::GenericDict& d, const std::filesystem::path& path) {
  try {
    return multitask_options_from_json(d.at("options").toStringRef());
  } catch (const c10::Error& e) {
    throw DataError(path.string() + ": unreadable options: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw DataError(path.string() + ": unreadable options: " + e.what());
  }
}

// Copies the tensors of `from` (laid out as `layout`) into `to` by parameter name.
void copy_by_name(const ensemble::PackedParameters& layout, const at::Tensor& from,
                  const ensemble::PackedParameters& target, at::Tensor to) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < target.size(); ++i) index[target.spec(i).name] = i;
  const std::vector<at::Tensor> sources = layout.blocks(from), targets = target.blocks(to);
  for (size_t i = 0; i < layout.size(); ++i) {
    at::Tensor destination = targets.at(index.at(layout.spec(i).name));
    destination.copy_(sources[i]);
  }
}

// A pipeline stage's file, beside its manifest: "<manifest>.stage<s>-of-<S>.step<N>".
std::string stage_file_name(const std::filesystem::path& manifest, int64_t stage, int64_t stages, int64_t steps) {
  return fmt::format("{}.stage{}-of-{}.step{}", manifest.filename().string(), stage, stages, steps);
}

// The 16 hex digits a manifest records of a stage file's checksum.
std::string checksum_hex(uint64_t checksum) { return fmt::format("{:016x}", checksum); }
}  // namespace

MultiTaskCheckpoint MultiTaskCheckpoint::read(const std::filesystem::path& path) {
  MultiTaskCheckpoint checkpoint;
  checkpoint.path_ = path;
  const c10::impl::GenericDict top = checkpoint_dict(path, "multi-task checkpoint");
  checkpoint.payload_ = std::make_shared<const c10::IValue>(top);
  const std::string format = top.at("format").toStringRef();
  if (format == kMultiTaskFormat) return checkpoint;
  if (format != kPipelineManifestFormat) throw DataError(path.string() + ": not a packtrain multi-task checkpoint");

  const auto bad = [&](const std::string& problem) {
    return DataError(path.string() + ": bad pipeline checkpoint manifest: " + problem);
  };
  int64_t S = 0;
  std::vector<std::string> names, checksums;  // checksums: none in manifests of earlier versions
  try {
    S = top.at("stages").toInt();
    names = nlohmann::json::parse(top.at("files").toStringRef()).get<std::vector<std::string>>();
    if (top.contains("checksums")) {
      checksums = nlohmann::json::parse(top.at("checksums").toStringRef()).get<std::vector<std::string>>();
    }
  } catch (const c10::Error& e) {
    throw bad(e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw bad(e.what());
  }
  if (S < 1 || static_cast<int64_t>(names.size()) != S || (!checksums.empty() && checksums.size() != names.size())) {
    throw bad(fmt::format("{} stages, {} stage files and {} checksums", S, names.size(), checksums.size()));
  }
  const std::filesystem::path dir = path.parent_path();
  for (int64_t s = 0; s < S; ++s) {
    const std::string& name = names[static_cast<size_t>(s)];
    // Stage files are written beside their manifest: a manifest never points elsewhere.
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        std::count(names.begin(), names.end(), name) != 1) {
      throw bad(fmt::format("stage {}'s file '{}' is not a file name of its own in the manifest's directory", s, name));
    }
    const std::filesystem::path file = dir / name;
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) {
      throw DataError(
          fmt::format("{}: stage {}'s file {} is missing (a pipeline checkpoint is the manifest and its "
                      "{} stage files, side by side)",
                      path.string(), s, file.string(), S));
    }
    if (!checksums.empty()) {
      const std::string actual = checksum_hex(checkpoint_checksum(file));
      if (actual != checksums[static_cast<size_t>(s)]) {
        throw DataError(
            fmt::format("{}: not the stage {} file that {} committed (its checksum is {}, the manifest's "
                        "{}): was it replaced, or another stage's file copied over it?",
                        file.string(), s, path.string(), actual, checksums[static_cast<size_t>(s)]));
      }
    }
    checkpoint.stage_files_.push_back(file);
  }
  return checkpoint;
}

std::string MultiTaskCheckpoint::extra() const {
  const c10::impl::GenericDict top = payload_->toGenericDict();
  if (top.contains("extra")) return top.at("extra").toStringRef();
  const c10::impl::GenericDict first = checkpoint_dict(stage_files_.at(0), "multi-task stage checkpoint");
  if (!first.contains("extra")) throw DataError(stage_files_.at(0).string() + ": no run description");
  return first.at("extra").toStringRef();
}

std::string MultiTaskCheckpoint::trunk() const {
  const c10::impl::GenericDict top = payload_->toGenericDict();
  if (top.contains("options")) return options_of(top, path_).trunk();
  const c10::impl::GenericDict first = checkpoint_dict(stage_files_.at(0), "multi-task stage checkpoint");
  return options_of(first, stage_files_.at(0)).trunk();
}

void MultiTaskTrainer::save(const std::filesystem::path& path, const std::string& extra) const {
  PACKTRAIN_NVTX_RANGE("checkpoint");
  if (pipeline_) {
    save_stage(path, extra);
    return;
  }
  c10::impl::GenericDict d =
      trainer_payload(options_, extra, *model_, *optimizer_, epochs_done_, steps_done_, trunk_record_);
  if (best_rows_.defined()) {  // early stopping's records, so a resumed run stops as this one would
    std::vector<double> loss;
    std::vector<int64_t> epoch, stopped;
    for (const MemberBest& m : member_best_) {
      loss.push_back(m.loss);
      epoch.push_back(m.epoch);
      stopped.push_back(m.stopped ? 1 : 0);
    }
    d.insert("member_best_rows", best_rows_.to(at::kCPU).clone());
    d.insert("member_best_loss", at::tensor(loss, at::kDouble));
    d.insert("member_best_epoch", at::tensor(epoch, at::kLong));
    d.insert("member_stopped", at::tensor(stopped, at::kLong));
  }
  save_checkpoint(path, d);
}

void MultiTaskTrainer::save_stage(const std::filesystem::path& path, const std::string& extra) const {
  // A stage's replicas hold the same weights (checked every epoch): replica 0's stages save them.
  if (pipeline_groups_->replica != 0) return;
  const int64_t s = pipeline_group_->rank(), S = pipeline_group_->world_size();
  const auto name = [&](int64_t stage) { return stage_file_name(path, stage, S, steps_done_); };
  const std::filesystem::path file = path.parent_path() / name(s);
  c10::impl::GenericDict d =
      trainer_payload(options_, extra, *model_, *optimizer_, epochs_done_, steps_done_, trunk_record_);
  d.insert("stage", s);
  d.insert("stages", S);
  save_checkpoint(file, d);
  pipeline_group_->barrier();  // every stage's file is committed
  if (s == 0) {
    std::vector<std::string> files, checksums;
    for (int64_t t = 0; t < S; ++t) {
      files.push_back(name(t));
      checksums.push_back(checksum_hex(checkpoint_checksum(path.parent_path() / name(t))));
    }
    c10::impl::GenericDict m(c10::StringType::get(), c10::AnyType::get());
    m.insert("format", std::string(kPipelineManifestFormat));
    m.insert("stages", S);
    m.insert("files", nlohmann::json(files).dump());
    m.insert("checksums", nlohmann::json(checksums).dump());
    m.insert("extra", extra);
    m.insert("epochs", epochs_done_);
    m.insert("steps", steps_done_);
    save_checkpoint(path, m);
  }
  pipeline_group_->barrier();  // the manifest names the new files: the old ones can go
  // The stage file this run committed last under this manifest (a run resumed into
  // another file leaves the one it resumed whole).
  if (!committed_stage_file_.empty() && committed_stage_file_ != file && committed_manifest_ == path) {
    std::error_code ignored;
    std::filesystem::remove(committed_stage_file_, ignored);
  }
  committed_stage_file_ = file;
  committed_manifest_ = path;
}

std::vector<std::filesystem::path> MultiTaskTrainer::stage_files_to_write(const std::filesystem::path& path,
                                                                          int64_t epochs) const {
  const int64_t per_epoch = steps_per_epoch();
  if (pipeline_ == nullptr || per_epoch <= 0 || epochs <= epochs_done_) return {};
  const int64_t S = pipeline_group_->world_size();
  const std::string prefix = path.filename().string() + ".stage";
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  // The directory, not every save's names: a run of many epochs lists no more than is there.
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    long long stage = -1, stages = -1, steps = -1;
    if (std::sscanf(name.c_str() + prefix.size(), "%lld-of-%lld.step%lld", &stage, &stages, &steps) != 3) continue;
    if (stages != S || stage < 0 || stage >= S || name != stage_file_name(path, stage, S, steps)) continue;
    const int64_t after = steps - steps_done_;  // saves come after each epoch, per_epoch steps apart
    if (after > 0 && after % per_epoch == 0 && after / per_epoch <= epochs - epochs_done_) {
      out.push_back(path.parent_path() / name);
    }
  }
  return out;
}

std::unique_ptr<MultiTaskTrainer> MultiTaskTrainer::load(const std::filesystem::path& path, c10::Device device,
                                                         std::string* extra, graphs::GraphLog log,
                                                         distributed::ProcessGroup* pipeline) {
  return load(MultiTaskCheckpoint::read(path), device, extra, std::move(log), pipeline);
}

namespace {

// The options a checkpoint records, on `device` and logging to `log`.
MultiTaskTrainerOptions on_device(MultiTaskTrainerOptions options, c10::Device device, const graphs::GraphLog& log) {
  options.model(ensemble::PackedTransformerOptions(options.model()).device(device)).log(log);
  return options;
}

// Parameters and optimizer state of `d` (read from `file`) into `trainer`, whose layout must match.
void restore_weights(MultiTaskTrainer& trainer, const c10::impl::GenericDict& d, const std::filesystem::path& file) {
  at::NoGradGuard no_grad;
  const at::Tensor params = d.at("params").toTensor();
  if (params.numel() != trainer.model().parameters().flat().numel()) {
    throw DataError(fmt::format("{}: {} parameters stored, the model described has {}", file.string(), params.numel(),
                                trainer.model().parameters().flat().numel()));
  }
  trainer.model().parameters().flat().copy_(params);
  const c10::impl::GenericDict optimizer = d.at("optimizer").toGenericDict();
  for (const auto& [name, tensor] : trainer.optimizer().state()) {
    if (!optimizer.contains(name)) throw DataError(file.string() + ": optimizer state '" + name + "' missing");
    const at::Tensor stored = optimizer.at(name).toTensor();
    if (stored.sizes() != tensor.sizes())
      throw DataError(file.string() + ": optimizer state '" + name + "' mismatched");
    at::Tensor target = tensor;
    target.copy_(stored);
  }
}

// Stage s's file of the pipeline save that `checkpoint` (its manifest `manifest`)
// names, found (and matched with its checksum) by MultiTaskCheckpoint::read, and
// checked to be that stage of that save.
std::pair<std::filesystem::path, c10::impl::GenericDict> stage_dict(const MultiTaskCheckpoint& checkpoint,
                                                                    const c10::impl::GenericDict& manifest, int64_t s) {
  const std::filesystem::path& path = checkpoint.path();
  const int64_t S = static_cast<int64_t>(checkpoint.stage_files().size()), steps = manifest.at("steps").toInt();
  const std::filesystem::path& file = checkpoint.stage_files().at(static_cast<size_t>(s));
  c10::impl::GenericDict d = checkpoint_dict(file, "multi-task stage checkpoint");
  if (d.at("format").toStringRef() != kMultiTaskFormat || d.at("steps").toInt() != steps) {
    throw DataError(
        fmt::format("{}: not stage {} of the save at step {} that {} names", file.string(), s, steps, path.string()));
  }
  // The file's own record: a stage file renamed, or copied over another, holds another stage.
  if (!d.contains("stage") || !d.contains("stages")) {
    throw DataError(fmt::format("{}: not a pipeline stage file (it records no stage), yet {} names it as stage {}",
                                file.string(), path.string(), s));
  }
  if (d.at("stage").toInt() != s || d.at("stages").toInt() != S) {
    throw DataError(
        fmt::format("{}: holds stage {} of {}, but {} names it as stage {} of {}: was it renamed, or "
                    "copied over another stage's file?",
                    file.string(), d.at("stage").toInt(), d.at("stages").toInt(), path.string(), s, S));
  }
  return std::make_pair(file, d);
}

// The stage file of this rank of `pipeline` (stages x replicas ranks) in a pipeline save.
std::pair<std::filesystem::path, c10::impl::GenericDict> rank_stage_dict(const MultiTaskCheckpoint& checkpoint,
                                                                         const c10::impl::GenericDict& manifest,
                                                                         const distributed::ProcessGroup& pipeline) {
  const int64_t S = static_cast<int64_t>(checkpoint.stage_files().size());
  if (pipeline.world_size() % S != 0) {
    throw DataError(
        fmt::format("{}: a pipeline run of {} stages resumes on {} ranks (or a multiple: stages x "
                    "replicas), not {} (or in one process, which assembles the stages)",
                    checkpoint.path().string(), S, S, pipeline.world_size()));
  }
  return stage_dict(checkpoint, manifest, pipeline.rank() % S);
}

// Stage s's parameters and optimizer state (`d`, read from `file`) copied by name
// into `trainer`, which holds the whole model described by `model`.
void copy_stage_in(MultiTaskTrainer& trainer, const ensemble::PackedTransformerOptions& model, int64_t s,
                   const std::filesystem::path& file, const c10::impl::GenericDict& d) {
  at::NoGradGuard no_grad;
  ensemble::PackedParameters& whole = trainer.model().parameters();
  const ensemble::TransformerStage blocks{d.at("first_layer").toInt(), d.at("end_layer").toInt()};
  const ensemble::PackedParameters layout(model.members(), ensemble::transformer_parameters(model, blocks),
                                          c10::TensorOptions().dtype(model.dtype()));
  const at::Tensor params = d.at("params").toTensor();
  if (params.numel() != layout.flat().numel()) {
    throw DataError(fmt::format("{}: {} parameters stored, stage {} of the model described has {}", file.string(),
                                params.numel(), s, layout.flat().numel()));
  }
  copy_by_name(layout, params.to(layout.flat().dtype()), whole, whole.flat());
  const c10::impl::GenericDict optimizer = d.at("optimizer").toGenericDict();
  for (const auto& [name, tensor] : trainer.optimizer().state()) {
    if (!optimizer.contains(name)) throw DataError(file.string() + ": optimizer state '" + name + "' missing");
    const at::Tensor stored = optimizer.at(name).toTensor();
    at::Tensor target = tensor;
    if (stored.numel() == layout.flat().numel() && tensor.numel() == whole.flat().numel()) {
      copy_by_name(layout, stored.to(tensor.scalar_type()), whole, target);  // in the parameters' layout
    } else if (s == 0) {
      if (stored.sizes() != tensor.sizes())
        throw DataError(file.string() + ": optimizer state '" + name + "' mismatched");
      target.copy_(stored);  // per member: the same on every stage
    }
  }
}

}  // namespace

std::unique_ptr<MultiTaskTrainer> MultiTaskTrainer::load(const MultiTaskCheckpoint& checkpoint, c10::Device device,
                                                         std::string* extra, graphs::GraphLog log,
                                                         distributed::ProcessGroup* pipeline) {
  const std::filesystem::path& path = checkpoint.path();
  const c10::impl::GenericDict top = checkpoint.payload_->toGenericDict();
  std::unique_ptr<MultiTaskTrainer> trainer;
  c10::impl::GenericDict progress = top;  // the dict whose epochs, steps and run description the trainer takes
  if (top.at("format").toStringRef() == kMultiTaskFormat) {
    trainer = std::make_unique<MultiTaskTrainer>(on_device(options_of(top, path), device, log));
    restore_weights(*trainer, top, path);
    trainer->restore_member_best(c10::IValue(top), path);
  } else if (pipeline != nullptr) {
    // A pipeline run's manifest, resumed on a pipeline: this rank's stage.
    const auto [file, d] = rank_stage_dict(checkpoint, top, *pipeline);
    trainer = std::make_unique<MultiTaskTrainer>(on_device(options_of(d, file), device, log), pipeline);
    restore_weights(*trainer, d, file);
    trainer->committed_stage_file_ = file;
    trainer->committed_manifest_ = path;
    progress = d;
  } else {
    // A pipeline run's manifest, in one process: the whole model, every stage copied in by name.
    const auto [first_file, first] = stage_dict(checkpoint, top, 0);
    const MultiTaskTrainerOptions options =
        on_device(options_of(first, first_file), device, log).pipeline_stages(1).pipeline_boundaries({});
    trainer = std::make_unique<MultiTaskTrainer>(options);
    for (int64_t s = 0; s < static_cast<int64_t>(checkpoint.stage_files().size()); ++s) {
      const auto [file, d] = stage_dict(checkpoint, top, s);
      copy_stage_in(*trainer, options.model(), s, file, d);
    }
    progress = first;
  }
  // The trunk folder must hold the files the run was trained on (a LoRA pack's frozen
  // trunk and every trunk's tokenizer are read from it again).
  if (progress.contains("trunk_files") && !trainer->trunk_record_.empty()) {
    check_trunk_record(progress.at("trunk_files").toStringRef(), trainer->trunk_record_, trainer->options_.trunk(),
                       path);
  }
  trainer->epochs_done_ = progress.at("epochs").toInt();
  trainer->steps_done_ = progress.at("steps").toInt();
  if (extra != nullptr) *extra = progress.at("extra").toStringRef();
  return trainer;
}

void MultiTaskTrainer::restore_member_best(const c10::IValue& payload, const std::filesystem::path& file) {
  const c10::impl::GenericDict d = payload.toGenericDict();
  if (!d.contains("member_best_rows")) return;  // no early stopping yet (or an older checkpoint)
  const int64_t K = model_->members();
  const at::Tensor rows = d.at("member_best_rows").toTensor();
  const at::Tensor loss = d.at("member_best_loss").toTensor(), epoch = d.at("member_best_epoch").toTensor(),
                   stopped = d.at("member_stopped").toTensor();
  const int64_t P = model_->parameters().flat().numel() / std::max<int64_t>(K, 1);
  if (rows.dim() != 2 || rows.size(0) != K || rows.size(1) != P || loss.numel() != K || epoch.numel() != K ||
      stopped.numel() != K) {
    throw DataError(
        fmt::format("{}: the early-stopping records do not match the model's {} members", file.string(), K));
  }
  best_rows_ = rows.to(model_->parameters().flat().options());
  member_best_.assign(static_cast<size_t>(K), MemberBest{});
  for (int64_t k = 0; k < K; ++k) {
    member_best_[static_cast<size_t>(k)] = {loss[k].item<double>(), epoch[k].item<int64_t>(),
                                            stopped[k].item<int64_t>() != 0};
  }
}

void MultiTaskTrainer::save_pretrained(const std::filesystem::path& dir, int64_t member) const {
  if (pipeline_) {
    throw UserError("save_pretrained needs the whole model: load the pipeline run's checkpoint in one process first");
  }
  if (member < 0 || member >= model_->members()) {
    throw UserError(fmt::format("save_pretrained: member {} out of range for {} members", member, model_->members()));
  }
  save_pretrained_trunk(*model_, dir, member, options_.trunk());
}

}  // namespace packtrain::runtime
