// Hugging Face checkpoints as the multi-task trunk (runtime/trainers/multitask/pretrained_trunk.h).
#include "packtrain/runtime/trainers/multitask/pretrained_trunk.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/io/safetensors_file.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

namespace packtrain::runtime {

namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) throw UserError(what + " '" + path.string() + "' cannot be read (is this a checkpoint folder?)");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(what + " '" + path.string() + "' is not JSON: " + e.what());
  }
}

// config[key] as an integer >= minimum (or `fallback` when absent and given).
int64_t config_integer(const nlohmann::json& config, const fs::path& file, const std::string& key, int64_t minimum,
                       std::optional<int64_t> fallback = std::nullopt) {
  if (!config.contains(key) || config.at(key).is_null()) {
    if (fallback) return *fallback;
    throw UserError("config '" + file.string() + "' has no " + key);
  }
  const nlohmann::json& v = config.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < minimum) {
    throw UserError("config '" + file.string() + "': " + key + " must be an integer >= " + std::to_string(minimum) +
                    ", got " + v.dump());
  }
  return v.get<int64_t>();
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
    if (fs::exists(single)) {
      files_.push_back(std::make_unique<SafetensorsFile>(single));
      for (const std::string& name : files_.back()->names()) where_[name] = files_.back().get();
      return;
    }
    if (!fs::exists(index)) {
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
                        "' names no shard file of the folder: " + file.dump());
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

ensemble::PackedTransformerOptions pretrained_trunk_options(const fs::path& dir, int64_t classes) {
  if (!fs::is_directory(dir)) {
    throw UserError("pretrained trunk '" + dir.string() +
                    "' is not a folder (give a Hugging Face checkpoint folder: config.json and model.safetensors)");
  }
  const fs::path file = dir / "config.json";
  const nlohmann::json config = read_json(file, "config");
  if (!config.is_object() || !config.contains("model_type") || !config.at("model_type").is_string()) {
    throw UserError("config '" + file.string() + "' has no model_type");
  }
  const std::string type = config.at("model_type").get<std::string>();
  if (type != "gpt2") {
    throw UserError("config '" + file.string() + "': model_type '" + type +
                    "' is not supported; packtrain loads the GPT-2 family (model_type gpt2) today" +
                    (type == "llama" ? " — Llama's RMSNorm, rotary positions, SwiGLU and grouped-query attention "
                                       "are not in the trunk yet"
                                     : ""));
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
  const std::string activation = config.value("activation_function", std::string("gelu_new"));
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
      throw UserError("config '" + file.string() + "': layer_norm_epsilon must be a positive number, got " + v.dump());
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
  o.validate();
  return o;
}

void load_pretrained_weights(const fs::path& dir, ensemble::PackedTransformer& model) {
  const ensemble::PackedTransformerOptions& options = model.options();
  const CheckpointTensors tensors(dir);
  const std::string prefix = tensors.contains("transformer.wte.weight") ? "transformer." : "";
  ensemble::PackedParameters& params = model.parameters();
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

std::vector<std::pair<std::string, at::Tensor>> pretrained_named_tensors(const ensemble::PackedTransformer& model,
                                                                         int64_t member, bool gradients) {
  TORCH_CHECK(model.whole(), "pretrained trunk: a pipeline stage holds part of the model; use the whole model");
  TORCH_CHECK(model.options().tie_lm_head(), "pretrained trunk: GPT-2 ties its LM head to wte; this model's is untied");
  TORCH_CHECK(member >= 0 && member < model.members(), "pretrained trunk: member ", member, " out of range for ",
              model.members(), " members");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  const ensemble::PackedParameters& params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const ensemble::ParameterSpec& spec = params.spec(i);
    const at::Tensor source = gradients ? params[i].grad() : params[i];
    TORCH_CHECK(source.defined(), "pretrained trunk: parameter ", spec.name, " has no gradient");
    at::Tensor value = source[member].detach().to(at::kFloat);
    if (spec.name == "cls.weight") value = value.t();  // (d, C) -> torch Linear's (C, d)
    const bool vector = spec.shape.size() == 2 && spec.shape[0] == 1;
    tensors.emplace_back(gpt2_name(spec.name, "transformer."), vector ? value.view({spec.shape[1]}) : value);
  }
  return tensors;
}

void save_pretrained_trunk(const ensemble::PackedTransformer& model, const fs::path& dir, int64_t member) {
  const ensemble::PackedTransformerOptions& o = model.options();
  const auto tensors = pretrained_named_tensors(model, member);
  fs::create_directories(dir);
  nlohmann::json config{{"model_type", "gpt2"},
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
  write_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});
  write_file_atomically(dir / "config.json", config.dump(2) + "\n");
}

}  // namespace packtrain::runtime
