// Hugging Face checkpoints as the multi-task trunk (runtime/trainers/multitask/pretrained_trunk.h).
#include "packtrain/runtime/trainers/multitask/pretrained_trunk.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/fingerprint.h"
#include "packtrain/runtime/data/input_file.h"
#include "packtrain/runtime/data/json_file.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/io/output_folder.h"
#include "packtrain/runtime/io/safetensors_file.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

namespace packtrain::runtime {

namespace {

namespace fs = std::filesystem;

// Through the checked reader (a FIFO or a directory at the name is refused, never
// waited on); a config or index is small: 16 MiB is far above any real one.
nlohmann::json read_json(const fs::path& path, const std::string& what) {
  return read_json_file(path, what, uint64_t{16} << 20);
}

// No size of a real checkpoint comes near this (vocabularies ~ 2^18, widths ~ 2^14,
// positions ~ 2^20): products of sizes stay far inside int64.
constexpr int64_t kMaxConfigInteger = int64_t{1} << 24;

// config[key] as an integer in [minimum, kMaxConfigInteger] (or `fallback` when
// absent or null and given).
int64_t config_integer(const nlohmann::json& config, const fs::path& file, const std::string& key, int64_t minimum,
                       std::optional<int64_t> fallback = std::nullopt) {
  if (!config.contains(key) || config.at(key).is_null()) {
    if (fallback) return *fallback;
    throw UserError("config '" + file.string() + "' has no " + key);
  }
  const nlohmann::json& v = config.at(key);
  const bool in_range = v.is_number_integer() &&
                        (v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t{kMaxConfigInteger} &&
                                                      static_cast<int64_t>(v.get<uint64_t>()) >= minimum
                                                : v.get<int64_t>() >= minimum && v.get<int64_t>() <= kMaxConfigInteger);
  if (!in_range) {
    throw UserError("config '" + file.string() + "': " + key + " must be an integer from " + std::to_string(minimum) +
                    " to " + std::to_string(kMaxConfigInteger) + ", got " + short_json(v));
  }
  return v.get<int64_t>();
}

// The options' own check (a TORCH_CHECK) as a UserError naming the config.
void validate_trunk(const ensemble::PackedTransformerOptions& o, const fs::path& file) {
  try {
    o.validate();
  } catch (const c10::Error& e) {
    throw UserError("config '" + file.string() + "': " + e.what_without_backtrace());
  }
}

// The GPT-2 name of each trunk parameter (prefix "transformer." for a *LMHeadModel's
// file, "" for a bare GPT2Model's), and whether it is stored as a vector ((d) in the
// file, (1, d) in the pack).
std::string gpt2_name(const std::string& ours, const std::string& prefix) {
  static const std::vector<std::pair<std::string, std::string>> block_parts{
      {"ln1.", "ln_1."}, {"attn.qkv.", "attn.c_attn."}, {"attn.out.", "attn.c_proj."},
      {"ln2.", "ln_2."}, {"mlp.fc.", "mlp.c_fc."},      {"mlp.proj.", "mlp.c_proj."}};
  if (ours == "tok_emb.weight") return prefix + "wte.weight";
  if (ours == "pos_emb.weight") return prefix + "wpe.weight";
  if (ours.starts_with("ln_f.")) return prefix + ours;
  if (ours.starts_with("cls.")) return "score." + ours.substr(4);
  if (ours.starts_with("block")) {
    const size_t dot = ours.find('.');
    const std::string layer = ours.substr(5, dot - 5), rest = ours.substr(dot + 1);
    for (const auto& [mine, theirs] : block_parts) {
      if (rest.starts_with(mine)) return prefix + "h." + layer + "." + theirs + rest.substr(mine.size());
    }
  }
  throw UserError("pretrained trunk: parameter '" + ours + "' has no GPT-2 name");
}

// A checkpoint folder's tensors: one file, or the shards an index names.
class CheckpointTensors {
 public:
  explicit CheckpointTensors(const fs::path& dir) {
    const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
    std::error_code ec;
    if (fs::exists(fs::symlink_status(single, ec))) {
      files_.push_back(std::make_unique<SafetensorsFile>(single));
      for (const std::string& name : files_.back()->names()) where_[name] = files_.back().get();
      return;
    }
    if (!fs::exists(fs::symlink_status(index, ec))) {
      throw UserError("checkpoint folder '" + dir.string() +
                      "' has neither model.safetensors nor model.safetensors.index.json (only safetensors "
                      "weights are read; convert a pytorch_model.bin with transformers' save_pretrained)");
    }
    const nlohmann::json map = read_json(index, "checkpoint index");
    if (!map.contains("weight_map") || !map.at("weight_map").is_object()) {
      throw UserError("checkpoint index '" + index.string() + "' has no weight_map object");
    }
    std::map<std::string, SafetensorsFile*> opened;
    for (const auto& [name, file] : map.at("weight_map").items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
        throw UserError("checkpoint index '" + index.string() + "': tensor '" + name +
                        "' names no shard file of the folder: " + short_json(file));
      }
      const std::string shard = file.get<std::string>();
      if (!opened.count(shard)) {
        files_.push_back(std::make_unique<SafetensorsFile>(dir / shard));
        opened[shard] = files_.back().get();
      }
      if (!opened[shard]->contains(name)) {
        throw UserError("checkpoint index '" + index.string() + "' puts tensor '" + name + "' in " + shard +
                        ", which does not hold it");
      }
      where_[name] = opened[shard];
    }
  }

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The tensor's shape in its file (empty when the checkpoint lacks it).
  std::vector<int64_t> entry_shape(const std::string& name) const {
    const auto it = where_.find(name);
    return it == where_.end() ? std::vector<int64_t>{} : it->second->entry(name).shape;
  }
  // The tensor as float32, checked against `shape`.
  at::Tensor read(const std::string& name, c10::IntArrayRef shape, const std::string& needed_by) const {
    const auto it = where_.find(name);
    if (it == where_.end()) {
      throw UserError("checkpoint lacks tensor '" + name + "' (" + needed_by + ")");
    }
    const SafetensorsFile::Entry& e = it->second->entry(name);
    if (c10::IntArrayRef(e.shape) != shape) {
      std::ostringstream text;
      text << "tensor '" << name << "' in '" << it->second->path().string() << "' has shape "
           << c10::IntArrayRef(e.shape) << ", " << needed_by << " needs " << shape;
      throw UserError(text.str());
    }
    if (!c10::isFloatingType(e.dtype)) {
      throw UserError("tensor '" + name + "' in '" + it->second->path().string() + "' is " + c10::toString(e.dtype) +
                      ", not floating point");
    }
    return it->second->tensor(name).to(at::kFloat);
  }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, SafetensorsFile*> where_;
};

}  // namespace

// A Llama config.json's trunk: RMSNorm, rotary positions, grouped-query attention,
// SwiGLU, no projection biases; tied or untied LM head.
ensemble::PackedTransformerOptions llama_options(const nlohmann::json& config, const fs::path& file, int64_t classes) {
  const auto refuse = [&](const std::string& what) {
    throw UserError("config '" + file.string() + "': " + what + " is not supported by the trunk");
  };
  const auto flag = [&](const std::string& key, bool fallback) {
    const nlohmann::json& v = config.contains(key) ? config.at(key) : nlohmann::json();
    if (v.is_null()) return fallback;
    if (!v.is_boolean()) throw UserError("config '" + file.string() + "': " + key + " must be true or false");
    return v.get<bool>();
  };
  const auto number = [&](const nlohmann::json& from, const std::string& key, double fallback) {
    if (!from.contains(key) || from.at(key).is_null()) return fallback;
    if (!from.at(key).is_number() || !(from.at(key).get<double>() > 0)) {
      throw UserError("config '" + file.string() + "': " + key + " must be a positive number, got " +
                      short_json(from.at(key)));
    }
    return from.at(key).get<double>();
  };
  const std::string where = "config '" + file.string() + "'";
  if (const std::string act = json_string(config, "hidden_act", "silu", where); act != "silu") {
    refuse("hidden_act " + short_json(act));
  }
  if (flag("attention_bias", false) || flag("mlp_bias", false)) refuse("projection biases (attention_bias, mlp_bias)");
  // transformers 5 keeps rope_theta in rope_parameters, older versions beside rope_scaling.
  double theta = number(config, "rope_theta", 10000.0);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!config.contains(key) || config.at(key).is_null()) continue;
    const nlohmann::json& rope = config.at(key);
    if (!rope.is_object() || json_string(rope, "rope_type", "default", where + " " + key) != "default") {
      refuse(std::string(key) + " " + short_json(rope) + " (the default rotary positions are)");
    }
    theta = number(rope, "rope_theta", theta);
  }
  const int64_t width = config_integer(config, file, "hidden_size", 1);
  const int64_t heads = config_integer(config, file, "num_attention_heads", 1);
  if (width % heads != 0 || config_integer(config, file, "head_dim", 1, width / heads) != width / heads) {
    refuse("a head_dim other than hidden_size / num_attention_heads");
  }
  ensemble::PackedTransformerOptions o;
  o.members(1)
      .vocab(config_integer(config, file, "vocab_size", 2))
      .width(width)
      .layers(config_integer(config, file, "num_hidden_layers", 1))
      .heads(heads)
      .kv_heads(config_integer(config, file, "num_key_value_heads", 1, heads))
      .mlp_hidden(config_integer(config, file, "intermediate_size", 1))
      .max_length(config_integer(config, file, "max_position_embeddings", 2))
      .classes(classes)
      .tie_lm_head(flag("tie_word_embeddings", false))
      .rms_norm(true)
      .linear_bias(false)
      .rope_theta(theta)
      .gated_mlp(true)
      .norm_eps(number(config, "rms_norm_eps", 1e-6));
  if (heads % o.key_value_heads() != 0) refuse("num_key_value_heads not dividing num_attention_heads");
  validate_trunk(o, file);
  return o;
}

// A Llama parameter in the pack's per-member shape, from transformers' tensors: q, k
// and v stacked as one (in, out) qkv, gate and up as one (in, 2r) fc, Linear weights
// transposed to (in, out); the classifier (packtrain's own) is not the checkpoint's.
template <typename Tensors>
at::Tensor llama_value(const Tensors& tensors, const ensemble::ParameterSpec& spec) {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> block_parts{
      {"ln1.weight", {"input_layernorm.weight"}},
      {"attn.qkv.weight", {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
      {"attn.out.weight", {"self_attn.o_proj.weight"}},
      {"ln2.weight", {"post_attention_layernorm.weight"}},
      {"mlp.fc.weight", {"mlp.gate_proj.weight", "mlp.up_proj.weight"}},
      {"mlp.proj.weight", {"mlp.down_proj.weight"}}};
  const std::string& name = spec.name;
  const bool vector = spec.shape.size() == 2 && spec.shape[0] == 1;
  const auto read = [&](const std::string& theirs, std::vector<int64_t> shape) {
    return tensors.read(theirs, shape, "the config's " + name);
  };
  if (name == "tok_emb.weight") return read("model.embed_tokens.weight", spec.shape);
  if (name == "ln_f.weight") return read("model.norm.weight", {spec.shape[1]}).view(spec.shape);
  if (name == "lm.weight") return read("lm_head.weight", {spec.shape[1], spec.shape[0]}).t();
  const size_t dot = name.find('.');
  if (!name.starts_with("block") || dot == std::string::npos) {
    throw UserError("pretrained trunk: parameter '" + name + "' has no Llama name");
  }
  const std::string prefix = "model.layers." + name.substr(5, dot - 5) + ".", part = name.substr(dot + 1);
  for (const auto& [mine, theirs] : block_parts) {
    if (part != mine) continue;
    if (vector) return read(prefix + theirs.front(), {spec.shape[1]}).view(spec.shape);
    std::vector<at::Tensor> rows;  // torch Linear weights (out, in), stacked along out
    const int64_t in = spec.shape[0];
    for (const std::string& t : theirs) {
      const auto& e = tensors.entry_shape(prefix + t);
      rows.push_back(read(prefix + t, {e.empty() ? 0 : e[0], in}));
    }
    const at::Tensor stacked = at::cat(rows, 0);
    if (stacked.size(0) != spec.shape[1]) {
      throw UserError("checkpoint's " + prefix + theirs.front() + " and its companions stack to " +
                      std::to_string(stacked.size(0)) + " outputs, the config's " + name + " needs " +
                      std::to_string(spec.shape[1]));
    }
    return stacked.t();
  }
  throw UserError("pretrained trunk: parameter '" + name + "' has no Llama name");
}

ensemble::PackedTransformerOptions pretrained_trunk_options(const fs::path& dir, int64_t classes) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw UserError("pretrained trunk '" + dir.string() +
                    "' is not a folder (give a Hugging Face checkpoint folder: config.json and model.safetensors)");
  }
  const fs::path file = dir / "config.json";
  const nlohmann::json config = read_json(file, "config");
  if (!config.is_object() || !config.contains("model_type") || !config.at("model_type").is_string()) {
    throw UserError("config '" + file.string() + "' has no model_type");
  }
  const std::string type = config.at("model_type").get<std::string>();
  if (type == "llama") return llama_options(config, file, classes);
  if (type != "gpt2") {
    throw UserError("config '" + file.string() + "': model_type '" + type +
                    "' is not supported; packtrain loads the GPT-2 (gpt2) and Llama (llama) families today");
  }
  const auto flag = [&](const std::string& key, bool fallback) {
    if (!config.contains(key) || config.at(key).is_null()) return fallback;
    if (!config.at(key).is_boolean())
      throw UserError("config '" + file.string() + "': " + key + " must be true or false");
    return config.at(key).get<bool>();
  };
  const auto refuse = [&](const std::string& what) {
    throw UserError("config '" + file.string() + "': " + what + " is not supported by the trunk");
  };
  if (!flag("tie_word_embeddings", true)) refuse("an untied LM head (tie_word_embeddings false)");
  if (!flag("scale_attn_weights", true))
    refuse("attention without 1/sqrt(head_dim) scaling (scale_attn_weights false)");
  if (flag("scale_attn_by_inverse_layer_idx", false)) refuse("scale_attn_by_inverse_layer_idx");
  const std::string activation =
      json_string(config, "activation_function", "gelu_new", "config '" + file.string() + "'");
  bool tanh = false;
  if (activation == "gelu_new" || activation == "gelu_pytorch_tanh") {
    tanh = true;
  } else if (activation != "gelu") {
    refuse("activation_function '" + activation + "' (gelu, gelu_new and gelu_pytorch_tanh are)");
  }
  const int64_t width = config_integer(config, file, "n_embd", 1);
  const int64_t inner = config_integer(config, file, "n_inner", 1, 4 * width);
  if (inner % width != 0) refuse("n_inner " + std::to_string(inner) + " (not a multiple of n_embd)");
  double eps = 1e-5;
  if (config.contains("layer_norm_epsilon")) {
    const nlohmann::json& v = config.at("layer_norm_epsilon");
    if (!v.is_number() || !(v.get<double>() > 0)) {
      throw UserError("config '" + file.string() + "': layer_norm_epsilon must be a positive number, got " +
                      short_json(v));
    }
    eps = v.get<double>();
  }
  ensemble::PackedTransformerOptions o;
  o.members(1)
      .vocab(config_integer(config, file, "vocab_size", 2))
      .width(width)
      .layers(config_integer(config, file, "n_layer", 1))
      .heads(config_integer(config, file, "n_head", 1))
      .mlp_ratio(inner / width)
      .max_length(config_integer(config, file, "n_positions", 2))
      .classes(classes)
      .tie_lm_head(true)
      .gelu_tanh(tanh)
      .norm_eps(eps);
  if (o.width() % o.heads() != 0) {
    throw UserError("config '" + file.string() + "': n_embd " + std::to_string(o.width()) +
                    " is not a multiple of n_head " + std::to_string(o.heads()));
  }
  validate_trunk(o, file);
  return o;
}

void load_pretrained_weights(const fs::path& dir, ensemble::PackedTransformer& model) {
  const ensemble::PackedTransformerOptions& options = model.options();
  const CheckpointTensors tensors(dir);
  // With adapters the frozen shared trunk (one member, no classifier), else every member's.
  const fs::path config = dir / "config.json";
  if (json_string(read_json(config, "config"), "model_type", "", "config '" + config.string() + "'") == "llama") {
    ensemble::PackedParameters& params = model.trunk_parameters();
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params.spec(i).name.starts_with("cls.")) continue;  // a new head: as drawn from the seed
      params[i].copy_(llama_value(tensors, params.spec(i)).unsqueeze(0).expand_as(params[i]));
    }
    return;
  }
  const std::string prefix = tensors.contains("transformer.wte.weight") ? "transformer." : "";
  ensemble::PackedParameters& params = model.trunk_parameters();
  const bool has_classifier = tensors.contains("score.weight");
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const ensemble::ParameterSpec& spec = params.spec(i);
    const std::string name = gpt2_name(spec.name, prefix);
    at::Tensor value;  // in the pack's per-member shape
    if (spec.name.starts_with("cls.")) {
      if (!has_classifier) continue;    // a new head: as drawn from the seed
      if (spec.name == "cls.weight") {  // torch Linear (C, d) -> (d, C)
        value = tensors
                    .read(name, {spec.shape[1], spec.shape[0]},
                          "a classifier of " + std::to_string(options.classes()) + " classes")
                    .t();
      } else if (tensors.contains(name)) {
        value = tensors.read(name, {spec.shape[1]}, "the classifier").view(spec.shape);
      } else {
        value = at::zeros(spec.shape);  // transformers' score has no bias
      }
    } else {
      const bool vector = spec.shape.size() == 2 && spec.shape[0] == 1;  // norms' and biases' (1, d)
      const std::vector<int64_t> file_shape = vector ? std::vector<int64_t>{spec.shape[1]} : spec.shape;
      value = tensors.read(name, file_shape, "the config's " + spec.name).view(spec.shape);
    }
    params[i].copy_(value.unsqueeze(0).expand_as(params[i]));  // every member starts from the checkpoint
  }
  if (tensors.contains("lm_head.weight")) {  // tied: must be the embedding itself
    const at::Tensor lm = tensors.read("lm_head.weight", {options.vocab(), options.width()}, "the tied LM head");
    const at::Tensor wte = tensors.read(prefix + "wte.weight", {options.vocab(), options.width()}, "the embedding");
    if (!at::equal(lm, wte)) {
      throw UserError("checkpoint's lm_head.weight differs from its wte.weight: an untied LM head is not supported");
    }
  }
}

std::unique_ptr<ensemble::PackedTransformer> load_pretrained_trunk(const fs::path& dir, int64_t classes, uint64_t seed,
                                                                   c10::Device device) {
  auto model =
      std::make_unique<ensemble::PackedTransformer>(pretrained_trunk_options(dir, classes).seed(seed).device(device));
  load_pretrained_weights(dir, *model);
  return model;
}

std::vector<fs::path> pretrained_trunk_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  const auto add = [&](const fs::path& file) {
    if (fs::exists(fs::symlink_status(file, ec))) files.push_back(file);
  };
  add(dir / "config.json");
  add(dir / "model.safetensors");
  const fs::path index = dir / "model.safetensors.index.json";
  add(index);
  if (!fs::exists(dir / "model.safetensors", ec) && fs::is_regular_file(index, ec)) {
    std::set<std::string> shards;
    try {  // the shards the index names (a malformed index: the load says why)
      const nlohmann::json map = read_json(index, "checkpoint index");
      if (map.is_object() && map.contains("weight_map") && map.at("weight_map").is_object()) {
        for (const auto& [name, file] : map.at("weight_map").items()) {
          if (file.is_string() && file.get<std::string>().find('/') == std::string::npos)
            shards.insert(file.get<std::string>());
        }
      }
    } catch (const UserError&) {
    }
    for (const std::string& shard : shards) add(dir / shard);
  }
  for (const char* name : kTrunkTokenizerFiles) add(dir / name);
  return files;
}

std::vector<std::string> pretrained_folder_names() {
  std::vector<std::string> names{"config.json", "model.safetensors"};
  for (const char* name : kTrunkTokenizerFiles) names.emplace_back(name);
  return names;
}

namespace {

nlohmann::json trunk_record(const fs::path& dir) {
  nlohmann::json files = nlohmann::json::object();
  for (const fs::path& file : pretrained_trunk_files(dir)) {
    files[file.filename().string()] = fingerprint_hex(input_file_checksum(file, "trunk file"));
  }
  return {{"dir", fs::absolute(dir).lexically_normal().string()}, {"files", files}};
}

}  // namespace

std::string trunk_record_json(const fs::path& dir) { return trunk_record(dir).dump(); }

void check_trunk_record(const std::string& recorded, const std::string& current, const fs::path& dir,
                        const fs::path& checkpoint) {
  nlohmann::json then;
  try {
    then = nlohmann::json::parse(recorded);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(checkpoint.string() + ": its record of the trunk's files is not JSON: " + e.what());
  }
  if (!then.is_object() || !then.contains("files") || !then.at("files").is_object()) {
    throw DataError(checkpoint.string() + ": its record of the trunk's files has no files");
  }
  const nlohmann::json now = nlohmann::json::parse(current).at("files");
  const auto advice = " since " + checkpoint.string() +
                      " was written: it was trained on the trunk as it was; restore the file, or train anew";
  for (const auto& [name, sum] : then.at("files").items()) {
    if (!now.contains(name)) throw DataError("trunk file '" + (dir / name).string() + "' is gone" + advice);
    if (now.at(name) != sum) {
      throw DataError("trunk file '" + (dir / name).string() + "' changed (checksum " +
                      now.at(name).get<std::string>() + ", recorded " + short_json(sum) + ")" + advice);
    }
  }
  for (const auto& [name, sum] : now.items()) {
    if (!then.at("files").contains(name)) {
      throw DataError("trunk file '" + (dir / name).string() + "' is new" + advice);
    }
  }
}

namespace {

// Which transformers layout a trunk has: GPT-2's, Llama's, or none (a mix built by hand).
enum class Layout { kGpt2, kLlama, kNone };
Layout layout_of(const ensemble::PackedTransformerOptions& o) {
  const bool gpt2 = !o.rms_norm() && o.linear_bias() && o.rope_theta() == 0 && !o.gated_mlp() &&
                    o.key_value_heads() == o.heads() && o.mlp_hidden() == 0 && o.tie_lm_head();
  const bool llama = o.rms_norm() && !o.linear_bias() && o.rope_theta() > 0 && o.gated_mlp();
  return gpt2 ? Layout::kGpt2 : llama ? Layout::kLlama : Layout::kNone;
}

// One pack parameter's member value under transformers' Llama names and layouts:
// the fused qkv and gate|up split back into q/k/v and gate/up, (in, out) weights as
// torch Linear's (out, in).
void append_llama(std::vector<std::pair<std::string, at::Tensor>>& out, const ensemble::PackedTransformerOptions& o,
                  const std::string& name, const at::Tensor& value) {
  const bool vector = value.dim() == 2 && value.size(0) == 1;
  const at::Tensor v = vector ? value.view({value.size(1)}) : value;
  if (name == "tok_emb.weight") {
    out.emplace_back("model.embed_tokens.weight", v);
    return;
  }
  if (name == "ln_f.weight") {
    out.emplace_back("model.norm.weight", v);
    return;
  }
  if (name == "lm.weight") {
    out.emplace_back("lm_head.weight", v.t());
    return;
  }
  if (name == "cls.weight") {
    out.emplace_back("score.weight", v.t());
    return;
  }
  if (name == "cls.bias") {
    out.emplace_back("score.bias", v);
    return;
  }
  const size_t dot = name.find('.');
  const std::string prefix = "model.layers." + name.substr(5, dot - 5) + ".", part = name.substr(dot + 1);
  const int64_t dh = o.width() / o.heads(), q = o.heads() * dh, kv = o.key_value_heads() * dh, r = o.mlp_width();
  if (part == "ln1.weight") {
    out.emplace_back(prefix + "input_layernorm.weight", v);
    return;
  }
  if (part == "ln2.weight") {
    out.emplace_back(prefix + "post_attention_layernorm.weight", v);
    return;
  }
  if (part == "attn.out.weight") {
    out.emplace_back(prefix + "self_attn.o_proj.weight", v.t());
    return;
  }
  if (part == "mlp.proj.weight") {
    out.emplace_back(prefix + "mlp.down_proj.weight", v.t());
    return;
  }
  if (part == "attn.qkv.weight") {
    const std::vector<at::Tensor> pieces = v.t().split_with_sizes({q, kv, kv}, 0);
    out.emplace_back(prefix + "self_attn.q_proj.weight", pieces[0]);
    out.emplace_back(prefix + "self_attn.k_proj.weight", pieces[1]);
    out.emplace_back(prefix + "self_attn.v_proj.weight", pieces[2]);
    return;
  }
  if (part == "mlp.fc.weight") {
    const std::vector<at::Tensor> pieces = v.t().split_with_sizes({r, r}, 0);
    out.emplace_back(prefix + "mlp.gate_proj.weight", pieces[0]);
    out.emplace_back(prefix + "mlp.up_proj.weight", pieces[1]);
    return;
  }
  throw UserError("pretrained trunk: parameter '" + name + "' has no Llama name");
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> pretrained_named_tensors(const ensemble::PackedTransformer& model,
                                                                         int64_t member, bool gradients) {
  TORCH_CHECK(model.whole(), "pretrained trunk: a pipeline stage holds part of the model; use the whole model");
  const Layout layout = layout_of(model.options());
  if (layout == Layout::kNone) {
    throw UserError(
        "pretrained trunk: this model's blocks are neither GPT-2's nor Llama's; transformers has no layout "
        "for them");
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  // Adapters merged into the trunk's weights: member `member` as one plain model.
  for (auto& [name, member_value] : model.member_tensors(member, gradients)) {
    at::Tensor value = member_value.to(at::kFloat);
    if (layout == Layout::kLlama) {
      append_llama(tensors, model.options(), name, value);
      continue;
    }
    if (name == "cls.weight") value = value.t();                 // (d, C) -> torch Linear's (C, d)
    const bool vector = value.dim() == 2 && value.size(0) == 1;  // norms' and biases' (1, d)
    tensors.emplace_back(gpt2_name(name, "transformer."), vector ? value.view({value.size(1)}) : value);
  }
  return tensors;
}

void save_pretrained_trunk(const ensemble::PackedTransformer& model, const fs::path& dir, int64_t member,
                           const fs::path& tokenizer_from) {
  const ensemble::PackedTransformerOptions& o = model.options();
  const std::vector<std::string> names = pretrained_folder_names();
  const std::vector<fs::path> inputs =
      tokenizer_from.empty() ? std::vector<fs::path>{} : pretrained_trunk_files(tokenizer_from);
  check_output_folder(dir, names, inputs);  // the trunk's own folder holds its inputs: refused there
  const auto tensors = pretrained_named_tensors(model, member);
  nlohmann::json config;
  if (layout_of(o) == Layout::kLlama) {
    config = nlohmann::json{{"model_type", "llama"},
                            {"architectures", {"LlamaForCausalLM"}},
                            {"vocab_size", o.vocab()},
                            {"hidden_size", o.width()},
                            {"intermediate_size", o.mlp_width()},
                            {"num_hidden_layers", o.layers()},
                            {"num_attention_heads", o.heads()},
                            {"num_key_value_heads", o.key_value_heads()},
                            {"max_position_embeddings", o.max_length()},
                            {"rms_norm_eps", o.norm_eps()},
                            {"rope_theta", o.rope_theta()},
                            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", o.rope_theta()}}},
                            {"tie_word_embeddings", o.tie_lm_head()},
                            {"hidden_act", "silu"},
                            {"attention_bias", false},
                            {"mlp_bias", false},
                            {"num_labels", o.classes()},
                            {"torch_dtype", "float32"}};
  } else {
    config = nlohmann::json{{"model_type", "gpt2"},
                            {"architectures", {"GPT2LMHeadModel"}},
                            {"vocab_size", o.vocab()},
                            {"n_embd", o.width()},
                            {"n_layer", o.layers()},
                            {"n_head", o.heads()},
                            {"n_inner", o.mlp_ratio() * o.width()},
                            {"n_positions", o.max_length()},
                            {"n_ctx", o.max_length()},
                            {"activation_function", o.gelu_tanh() ? "gelu_new" : "gelu"},
                            {"layer_norm_epsilon", o.norm_eps()},
                            {"tie_word_embeddings", true},
                            {"num_labels", o.classes()},
                            {"resid_pdrop", 0.0},
                            {"embd_pdrop", 0.0},
                            {"attn_pdrop", 0.0},
                            {"torch_dtype", "float32"}};
  }
  // Read before the folder is staged: a tokenizer file that is not a bounded regular
  // file is refused with the export's folder untouched.
  std::vector<std::pair<std::string, std::string>> tokenizer_files;
  for (const fs::path& from : inputs) {  // the trunk's files: its tokenizer's are copied
    const std::string name = from.filename().string();
    if (std::find(std::begin(kTrunkTokenizerFiles), std::end(kTrunkTokenizerFiles), name) !=
        std::end(kTrunkTokenizerFiles)) {
      tokenizer_files.emplace_back(name, read_input_bytes(from, "tokenizer file"));
    }
  }
  write_folder_atomically(dir, [&](const fs::path& staging) {
    write_safetensors(staging / "model.safetensors", tensors, {{"format", "pt"}});
    for (const auto& [name, bytes] : tokenizer_files) write_file_atomically(staging / name, bytes);
    write_file_atomically(staging / "config.json", config.dump(2) + "\n");
  });
}

}  // namespace packtrain::runtime
