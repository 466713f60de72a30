// Bring your own language model (issue 39): a Hugging Face checkpoint folder as the
// multi-task trunk, and the trained trunk written back as one.
//
// A checkpoint folder holds config.json and model.safetensors, or
// model.safetensors.index.json ({"weight_map": {tensor: shard file}}) and its shards
// (runtime/io/safetensors_file.h reads each, tensor by tensor). Supported today:
// the GPT-2 family (config model_type "gpt2": learned positions, pre-LayerNorm blocks,
// GELU as its activation_function says — gelu_new/gelu_pytorch_tanh as the tanh form,
// gelu exact —, the fused c_attn stored as Conv1D [in, out], which is the pack's own
// (in, out) layout, and the LM head tied to wte) and the Llama family (model_type
// "llama": RMSNorm, rotary positions of the default kind, grouped-query attention,
// SwiGLU, no biases, tied or untied head; q/k/v and gate/up are stacked into the
// pack's fused qkv and fc), with float32, bfloat16 or float16 weights, loaded as
// float32. Refused, each a UserError naming it: another model_type, GPT-2 with an
// untied head, Llama with scaled rotary positions or biases, a missing or mis-shaped
// tensor, a malformed file. Both decode through the KV cache (a Llama trunk's holds
// its key/value heads; rotary angles are taken at the step's position).
//
// The classification head is the pack's own (cls: d -> classes, with bias): new,
// drawn from the seed, unless the folder holds packtrain's own `score.weight` and
// `score.bias` of that shape (what save_pretrained_trunk writes; transformers'
// GPT2ForSequenceClassification reads score.weight and ignores the bias).
#pragma once

#include "packtrain/ensemble/packed_transformer.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace packtrain::runtime {

// The trunk's options a checkpoint folder's config.json describes (one member;
// `classes` the classification head's), before any weight is read; UserError naming
// the folder and the key for a missing folder, a config without model_type, an
// unsupported architecture or an unusable value.
ensemble::PackedTransformerOptions pretrained_trunk_options(const std::filesystem::path& dir, int64_t classes);

// A one-member PackedTransformer of those options on `device`, its trunk and LM head
// the checkpoint's weights (every one present, of its shape, or a UserError naming
// the tensor and file), its classification head drawn from `seed` (or the folder's
// score.weight and score.bias).
std::unique_ptr<ensemble::PackedTransformer> load_pretrained_trunk(const std::filesystem::path& dir, int64_t classes,
                                                                   uint64_t seed = 0,
                                                                   c10::Device device = c10::Device(c10::kCPU));

// Writes the checkpoint's weights into every member of `model` (any stage of a
// pipeline: the parameters it holds; with adapters into the one frozen trunk), whose options must be the checkpoint's
// shape (pretrained_trunk_options); the classifier only where the folder has score.weight. UserError naming a missing
// or mis-shaped tensor and its file.
void load_pretrained_weights(const std::filesystem::path& dir, ensemble::PackedTransformer& model);

// Member `member`'s parameters (gradients: their .grad()) under transformers' GPT-2
// or Llama names and in its layouts (norms and biases as vectors, the classifier as
// score's (C, d)); an adapter member's with its adapters merged into the trunk's
// weights (PackedTransformer::member_tensors; no gradients). What
// save_pretrained_trunk writes. A whole model.
std::vector<std::pair<std::string, at::Tensor>> pretrained_named_tensors(const ensemble::PackedTransformer& model,
                                                                         int64_t member = 0, bool gradients = false);

// The files of checkpoint folder `dir` packtrain reads, those present: config.json,
// the weights (model.safetensors, or model.safetensors.index.json and each shard it
// names) and the tokenizer's (kTrunkTokenizerFiles). A run's inputs: no output may
// replace one (runtime/cli/output_paths.h), and a checkpoint records their checksums.
inline constexpr const char* kTrunkTokenizerFiles[] = {
    "tokenizer.model", "tokenizer.json",        "vocab.json",
    "merges.txt",      "tokenizer_config.json", "special_tokens_map.json"};
std::vector<std::filesystem::path> pretrained_trunk_files(const std::filesystem::path& dir);
// The names save_pretrained_trunk may write into its folder: config.json,
// model.safetensors and kTrunkTokenizerFiles.
std::vector<std::string> pretrained_folder_names();

// What a checkpoint records of the trunk folder it was trained from: the folder's
// absolute path and a checksum (FNV-1a 64, hex) of each file pretrained_trunk_files
// lists, by file name. A JSON object {"dir": ..., "files": {name: checksum}}.
std::string trunk_record_json(const std::filesystem::path& dir);
// DataError naming the file when the folder's record now (`current`, a
// trunk_record_json of `dir`) differs from the one `checkpoint` holds (`recorded`):
// a file changed, gone or added.
void check_trunk_record(const std::string& recorded, const std::string& current, const std::filesystem::path& dir,
                        const std::filesystem::path& checkpoint);

// Writes member `member` of `model` (a whole model of GPT-2's or Llama's layout) to
// `dir` as a checkpoint folder — config.json and model.safetensors in transformers'
// names, the classifier as score.weight and score.bias, and, with `tokenizer_from`
// (the trunk's folder), its tokenizer files (kTrunkTokenizerFiles) — that
// transformers' GPT2LMHeadModel / LlamaForCausalLM loads with the same logits. The
// folder is an output (runtime/io/output_folder.h): checked first (never the trunk's
// own folder, nor one holding other files; UserError), then written as a unit.
void save_pretrained_trunk(const ensemble::PackedTransformer& model, const std::filesystem::path& dir,
                           int64_t member = 0, const std::filesystem::path& tokenizer_from = {});

}  // namespace packtrain::runtime
