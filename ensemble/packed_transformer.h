// PackedTransformer: K small decoder-only transformers of one shape, trained as one
// model (K = 1 is the ordinary model): a shared trunk — token and position
// embeddings, pre-norm blocks of causal self-attention (at::scaled_dot_product_attention)
// and a GELU MLP, a final norm — feeding two heads: a classifier on each row's last
// real token, as sequence-classification models do, and a causal language-model head,
// optionally tied to the token embedding.
//
// Parameters live in one PackedParameters flat buffer (member-major, so packed
// optimizers, checkpoints and the flat-gradient all-reduce work unchanged); every
// matmul is a baddbmm over the K members, or a plain GEMM (addmm, mm) when K = 1, and
// a pack of one normalizes with at::layer_norm's own weight and bias. The linear
// layers are PackedLinear views of the flat buffer (PackOfOne::kPlainGemm), made once
// at construction; the buffer is only ever written in place (checkpoint loads,
// reinitialize, write_member_rows), so they stay its views. Inputs are
// right-padded token rows (B, T) with per-row lengths: causal attention never lets a
// real token see a pad, so no padding mask is needed, and losses ignore pad positions.
//
// Pipeline stages: a PackedTransformer built with a TransformerStage holds only the
// blocks [first_layer, end_layer) — the first stage also the embeddings, the last the
// final norm and both heads, and, when the LM head is tied, its own copy of the token
// embedding (the pipeline sums the copies' gradients, so they stay equal). Parameter
// names and initial values are the full model's: a stage draws every parameter in
// the full model's order and keeps its own, so S stages start exactly where one
// model does. embed -> run_blocks -> final_norm of the stages is trunk().
//
// Decoding with a KV cache: decode_step runs one token per row at a position held in
// a device tensor and attends over the whole preallocated cache with a mask built on
// the device, so its shapes never change and the step can be captured as a graph.
//
// K adapters on one frozen trunk (lora_rank r > 0; issue 39): the trunk's parameters
// are held once, in trunk_parameters() (one member, no gradients), and parameters()
// holds only what the K members train — a low-rank adapter (LoRA: W + (alpha / r) A B,
// A (in, r) drawn as Kaiming-uniform, B (r, out) zero) on every block's qkv, attention
// output, MLP fc and MLP projection, and a classification head per member. Each
// shared GEMM runs once for all members (the members' activations stacked into its
// rows; the first block's input, the embedding, once for all), each adapter is a
// baddbmm over the K members. Packed optimizers, checkpoints and the gradient
// all-reduce see only the adapters. The whole model only (no pipeline stages).
#pragma once

#include "packtrain/ensemble/packed_linear.h"
#include "packtrain/ensemble/packed_parameters.h"
#include "packtrain/ensemble/precision.h"

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace packtrain::ensemble {

struct PackedTransformerOptions {
  /// Example: PackedTransformerOptions().width(256).layers(4).heads(8).max_length(64)
  TORCH_ARG(int64_t, members) = 1;       // K
  TORCH_ARG(int64_t, vocab) = 259;       // V: bytes and three special tokens (runtime/data/byte_tokenizer.h)
  TORCH_ARG(int64_t, width) = 128;       // d
  TORCH_ARG(int64_t, layers) = 2;        // blocks
  TORCH_ARG(int64_t, heads) = 4;         // d % heads == 0
  TORCH_ARG(int64_t, mlp_ratio) = 4;     // MLP hidden = mlp_ratio * d
  TORCH_ARG(int64_t, max_length) = 128;  // positions, and the KV cache's length
  TORCH_ARG(int64_t, classes) = 2;       // C of the classification head
  TORCH_ARG(bool, tie_lm_head) = true;   // LM logits = hidden @ token_embedding^T (no LM weights)
  // The MLP's GELU: the exact erf form, or its tanh approximation (GPT-2's "gelu_new";
  // a loaded GPT-2 checkpoint sets it: runtime/trainers/multitask/pretrained_trunk.h).
  TORCH_ARG(bool, gelu_tanh) = false;
  TORCH_ARG(double, norm_eps) = 1e-5;  // every norm's epsilon
  // Llama's block (a loaded Llama checkpoint sets them: pretrained_trunk.h): RMSNorm
  // (weight only) instead of LayerNorm; no biases on the attention and MLP projections
  // or an untied LM head; grouped-query attention with kv_heads key/value heads (0:
  // heads); rotary positions of base rope_theta instead of learned ones (0: learned);
  // a SwiGLU MLP proj(silu(gate(x)) * up(x)) of width mlp_hidden (0: mlp_ratio * width).
  TORCH_ARG(bool, rms_norm) = false;
  TORCH_ARG(bool, linear_bias) = true;
  TORCH_ARG(int64_t, kv_heads) = 0;
  TORCH_ARG(double, rope_theta) = 0.0;
  TORCH_ARG(bool, gated_mlp) = false;
  TORCH_ARG(int64_t, mlp_hidden) = 0;
  // Adapters on a frozen shared trunk (above): their rank (0: none, every member a full
  // model) and scale alpha (the adapter adds (alpha / rank) x A B).
  TORCH_ARG(int64_t, lora_rank) = 0;
  TORCH_ARG(double, lora_alpha) = 16.0;
  TORCH_ARG(uint64_t, seed) = 0;  // member i draws from member_seed(seed, first_member + i)
  // The global index of member 0: a pack of one with first_member k starts as member k
  // of a larger pack of the same seed (so a member can be trained alone).
  TORCH_ARG(int64_t, first_member) = 0;
  TORCH_ARG(c10::ScalarType, dtype) = c10::ScalarType::Float;
  TORCH_ARG(c10::Device, device) = c10::Device(c10::DeviceType::CPU);

 public:
  // Throws naming the offending field and value.
  void validate() const;
  int64_t mlp_width() const { return mlp_hidden() > 0 ? mlp_hidden() : mlp_ratio() * width(); }
  int64_t key_value_heads() const { return kv_heads() > 0 ? kv_heads() : heads(); }
};

// A contiguous range of blocks [first_layer, end_layer) of the model (end_layer -1:
// through the last block).
struct TransformerStage {
  int64_t first_layer = 0;
  int64_t end_layer = -1;
};

// The per-member parameters a model of `options` holds for `stage` (throws for a
// stage that is not a non-empty range of blocks): names and shapes, in order. With
// adapters (lora_rank > 0), what the members train: the adapters and heads.
std::vector<ParameterSpec> transformer_parameters(const PackedTransformerOptions& options, TransformerStage stage = {});

// Keys and values of every layer for `rows` sequences per member, preallocated
// for max_length positions.
struct KvCache {
  at::Tensor keys;    // (layers, K * rows, key_value_heads, max_length, head_dim)
  at::Tensor values;  // same
  int64_t rows = 0;
};

class PackedTransformer {
 public:
  // Views of one block's parameters in parameters() (d = width, r = mlp_ratio * d).
  struct Block {
    at::Tensor ln1_weight, ln1_bias;  // (K, 1, d); no biases with rms_norm
    PackedLinear qkv;                 // (K, d, 3d): columns [3][heads][head_dim]; GQA: [q heads][kv][kv]
    PackedLinear attn_out;            // (K, d, d)
    at::Tensor ln2_weight, ln2_bias;  // (K, 1, d)
    PackedLinear mlp_fc;              // (K, d, r)
    PackedLinear mlp_proj;            // (K, r, d)
    // With adapters: the four projections' (the linears above are the trunk's, one member).
    struct Adapter {
      PackedLinear down;  // A (K, in, rank)
      PackedLinear up;    // B (K, rank, out)
    };
    Adapter qkv_adapter, attn_out_adapter, mlp_fc_adapter, mlp_proj_adapter;
  };

  // Throws (c10::Error) for a stage that is not a non-empty range of the model's blocks.
  explicit PackedTransformer(PackedTransformerOptions options, TransformerStage stage = {});

  const PackedTransformerOptions& options() const { return options_; }
  int64_t members() const { return options_.members(); }
  // What the members train (with adapters: the adapters and heads only).
  PackedParameters& parameters() { return parameters_; }
  const PackedParameters& parameters() const { return parameters_; }
  // Whether the members are adapters on one frozen trunk (lora_rank > 0), and that
  // trunk's parameters (one member); without adapters, parameters().
  bool adapted() const { return options_.lora_rank() > 0; }
  PackedParameters& trunk_parameters() { return adapted() ? trunk_ : parameters_; }
  const PackedParameters& trunk_parameters() const { return adapted() ? trunk_ : parameters_; }
  // Member `member`'s value of every parameter of the full model, in
  // transformer_parameters(options without adapters) order — with adapters the trunk's
  // weights with the member's adapters merged in (W + (alpha / r) A B) — or, without
  // adapters, their gradients (`gradients`). The whole model only.
  std::vector<std::pair<std::string, at::Tensor>> member_tensors(int64_t member, bool gradients = false) const;

  // The blocks this model holds; whether it holds the embeddings (first stage) and the
  // final norm and heads (last stage). The whole model is both.
  const TransformerStage& stage() const { return stage_; }
  bool first_stage() const { return stage_.first_layer == 0; }
  bool last_stage() const { return stage_.end_layer == options_.layers(); }
  bool whole() const { return first_stage() && last_stage(); }

  // Block `layer` (one this model holds: first_layer <= layer < end_layer), the
  // classification head and the untied LM head (last stage; throws elsewhere, and
  // lm_head when the LM head is tied to the token embedding).
  const Block& block(int64_t layer) const;
  const PackedLinear& classifier() const;
  const PackedLinear& lm_head() const;

  // tokens (B, T) int64, shared by the members, T <= max_length. Returns the final
  // normalized hidden states (K, B, T, d). The whole model only.
  at::Tensor trunk(const at::Tensor& tokens) const;
  // The pieces of trunk(), each on the stage that holds it: token + position
  // embeddings (K, B, T, d) (first stage); this model's blocks, (K, B, T, d) in and
  // out; the final norm (last stage).
  at::Tensor embed(const at::Tensor& tokens) const;
  at::Tensor run_blocks(const at::Tensor& x) const;
  at::Tensor final_norm(const at::Tensor& x) const;
  // Logits (K, B, C) of each row at its last real token (lengths (B) int64, >= 1).
  at::Tensor classify(const at::Tensor& hidden, const at::Tensor& lengths) const;
  // Next-token logits (K, B, T, V).
  at::Tensor lm_logits(const at::Tensor& hidden) const;

  KvCache make_cache(int64_t rows) const;
  // One token per sequence: tokens (K, rows) int64 at `position` (a 1-element int64
  // tensor on the device, < max_length); writes its keys and values into the cache
  // and returns the final hidden states (K, rows, d). No host synchronization.
  at::Tensor decode_step(const at::Tensor& tokens, const at::Tensor& position, KvCache& cache) const;

  // The arithmetic of run_blocks, classify, lm_logits and decode_step (and so of
  // trunk and the training step): with bf16-mixed their products run in bfloat16
  // under PrecisionScope and each returns float32 (ensemble/precision.h); kFP32
  // until set.
  void set_precision(Precision precision) { precision_ = precision; }
  Precision precision() const { return precision_; }

  // Re-draws every member's parameters from `seed` in place (GPT-2's scheme: N(0,
  // 0.02) weights and embeddings, zero biases, unit norms; with adapters the trunk as a
  // pack of one, the adapters as LoRA starts them).
  void reinitialize(uint64_t seed);

 private:
  at::Tensor param(const std::string& name) const;  // from parameters() or the trunk's
  // y = x W (+ b) through a linear of the model, plus x's adapter (when given): x
  // (Kx, N, in) with Kx the members or 1 (shared); the trunk's shared GEMM runs once
  // over all Kx * N rows. And residual + that, the blocks' residual connections.
  at::Tensor project(const PackedLinear& linear, const Block::Adapter* adapter, const at::Tensor& x) const;
  at::Tensor project_onto(const at::Tensor& residual, const PackedLinear& linear, const Block::Adapter* adapter,
                          const at::Tensor& x) const;
  void draw_adapters(uint64_t seed);
  // x (K, N, d) normalized with weight and bias (K, 1, d).
  at::Tensor norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const;
  at::Tensor mlp_residual(const at::Tensor& x, const Block& block) const;  // x + mlp(x)
  at::Tensor attention_residual(const at::Tensor& x, const Block& block, int64_t B, int64_t T) const;
  // Rotary / grouped-query attention of a qkv projection (rope_theta > 0 or kv_heads < heads).
  at::Tensor rotary_gqa_attention(const at::Tensor& projected, int64_t B, int64_t T) const;

  PackedTransformerOptions options_;
  TransformerStage stage_;
  PackedParameters parameters_;
  PackedParameters trunk_;                     // with adapters: the frozen shared trunk (one member)
  std::map<std::string, at::Tensor> by_name_;  // every parameter of both packs
  std::vector<Block> blocks_;                  // blocks first_layer .. end_layer - 1
  at::Tensor ln_f_weight_, ln_f_bias_;         // (K, 1, d), last stage
  PackedLinear classifier_;                    // (K, d, C), last stage
  PackedLinear lm_head_;                       // (K, d, V), last stage with an untied LM head
  at::Tensor rotary_cos_, rotary_sin_;         // (max_length, dh) with rotary positions: made once, not per step
  Precision precision_ = Precision::kFP32;
};

}  // namespace packtrain::ensemble
