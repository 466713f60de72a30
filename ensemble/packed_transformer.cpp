#include "packtrain/ensemble/packed_transformer.h"

#include "packtrain/ensemble/member_seed.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace packtrain::ensemble {

namespace {

std::string block_prefix(int64_t l) { return "block" + std::to_string(l); }

std::vector<ParameterSpec> transformer_specs(const PackedTransformerOptions& o) {
  const int64_t d = o.width(), r = o.mlp_width(), dh = d / o.heads();
  const int64_t qkv = (o.heads() + 2 * o.key_value_heads()) * dh, fc = o.gated_mlp() ? 2 * r : r;
  std::vector<ParameterSpec> specs{{"tok_emb.weight", {o.vocab(), d}}};
  if (o.rope_theta() == 0) specs.push_back({"pos_emb.weight", {o.max_length(), d}});
  const auto norm = [&](const std::string& name) {
    specs.push_back({name + ".weight", {1, d}});
    if (!o.rms_norm()) specs.push_back({name + ".bias", {1, d}});
  };
  const auto linear = [&](const std::string& name, int64_t in, int64_t out) {
    specs.push_back({name + ".weight", {in, out}});
    if (o.linear_bias()) specs.push_back({name + ".bias", {1, out}});
  };
  for (int64_t l = 0; l < o.layers(); ++l) {
    const std::string b = block_prefix(l);
    norm(b + ".ln1");
    linear(b + ".attn.qkv", d, qkv);
    linear(b + ".attn.out", d, d);
    norm(b + ".ln2");
    linear(b + ".mlp.fc", d, fc);
    linear(b + ".mlp.proj", r, d);
  }
  norm("ln_f");
  specs.push_back({"cls.weight", {d, o.classes()}});
  specs.push_back({"cls.bias", {1, o.classes()}});
  if (!o.tie_lm_head()) linear("lm", d, o.vocab());
  return specs;
}

// Whether a stage holds the parameter `name` of the full model.
bool stage_holds(const std::string& name, const TransformerStage& stage, const PackedTransformerOptions& o) {
  const bool first = stage.first_layer == 0, last = stage.end_layer == o.layers();
  if (name == "tok_emb.weight") return first || (last && o.tie_lm_head());
  if (name == "pos_emb.weight") return first;
  if (name.starts_with("block")) {
    const int64_t l = std::stoll(name.substr(5, name.find('.') - 5));
    return l >= stage.first_layer && l < stage.end_layer;
  }
  return last;  // ln_f, cls, lm
}

TransformerStage checked_stage(TransformerStage stage, const PackedTransformerOptions& o) {
  if (stage.end_layer == -1) stage.end_layer = o.layers();
  TORCH_CHECK(stage.first_layer >= 0 && stage.first_layer < stage.end_layer && stage.end_layer <= o.layers(),
              "transformer stage: blocks [", stage.first_layer, ", ", stage.end_layer,
              ") are not a non-empty range of the model's ", o.layers());
  return stage;
}

std::vector<ParameterSpec> stage_specs(const PackedTransformerOptions& o, const TransformerStage& stage) {
  std::vector<ParameterSpec> out;
  for (ParameterSpec& spec : transformer_specs(o)) {
    if (stage_holds(spec.name, stage, o)) out.push_back(std::move(spec));
  }
  return out;
}

}  // namespace

void PackedTransformerOptions::validate() const {
  TORCH_CHECK(members() >= 1, "transformer: members must be >= 1, got ", members());
  TORCH_CHECK(vocab() >= 2, "transformer: vocab must be >= 2, got ", vocab());
  TORCH_CHECK(width() >= 1 && heads() >= 1 && width() % heads() == 0, "transformer: width (", width(),
              ") must be a positive multiple of heads (", heads(), ")");
  TORCH_CHECK(layers() >= 1, "transformer: layers must be >= 1, got ", layers());
  TORCH_CHECK(mlp_ratio() >= 1, "transformer: mlp_ratio must be >= 1, got ", mlp_ratio());
  TORCH_CHECK(max_length() >= 2, "transformer: max_length must be >= 2, got ", max_length());
  TORCH_CHECK(classes() >= 2, "transformer: classes must be >= 2, got ", classes());
  TORCH_CHECK(dtype() == at::kFloat || dtype() == at::kDouble, "transformer: dtype must be float32 or float64");
  TORCH_CHECK(norm_eps() > 0 && std::isfinite(norm_eps()), "transformer: norm_eps must be positive, got ", norm_eps());
  TORCH_CHECK(kv_heads() >= 0 && heads() % key_value_heads() == 0, "transformer: kv_heads (", kv_heads(),
              ") must divide heads (", heads(), ")");
  TORCH_CHECK(rope_theta() >= 0 && std::isfinite(rope_theta()), "transformer: rope_theta must be >= 0, got ",
              rope_theta());
  TORCH_CHECK(rope_theta() == 0 || (width() / heads()) % 2 == 0,
              "transformer: rotary positions need an even head "
              "width, got ",
              width() / heads());
  TORCH_CHECK(mlp_hidden() >= 0, "transformer: mlp_hidden must be >= 0, got ", mlp_hidden());
}

std::vector<ParameterSpec> transformer_parameters(const PackedTransformerOptions& options, TransformerStage stage) {
  options.validate();
  return stage_specs(options, checked_stage(stage, options));
}

PackedTransformer::PackedTransformer(PackedTransformerOptions options, TransformerStage stage)
    : options_((options.validate(), std::move(options))),
      stage_(checked_stage(stage, options_)),
      parameters_(options_.members(), stage_specs(options_, stage_),
                  c10::TensorOptions().dtype(options_.dtype()).device(options_.device())) {
  const auto optional = [&](const std::string& name) {  // a bias this shape has, or undefined
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (parameters_.spec(i).name == name) return parameters_[i];
    }
    return at::Tensor();
  };
  const auto linear = [&](const std::string& prefix) {
    return PackedLinear(param(prefix + ".weight"), optional(prefix + ".bias"), PackOfOne::kPlainGemm);
  };
  for (int64_t l = stage_.first_layer; l < stage_.end_layer; ++l) {
    const std::string b = block_prefix(l);
    blocks_.push_back({param(b + ".ln1.weight"), optional(b + ".ln1.bias"), linear(b + ".attn.qkv"),
                       linear(b + ".attn.out"), param(b + ".ln2.weight"), optional(b + ".ln2.bias"),
                       linear(b + ".mlp.fc"), linear(b + ".mlp.proj")});
  }
  if (last_stage()) {
    ln_f_weight_ = param("ln_f.weight");
    ln_f_bias_ = optional("ln_f.bias");
    classifier_ = linear("cls");
    if (!options_.tie_lm_head()) lm_head_ = linear("lm");
  }
  reinitialize(options_.seed());
}

const PackedTransformer::Block& PackedTransformer::block(int64_t layer) const {
  TORCH_CHECK(layer >= stage_.first_layer && layer < stage_.end_layer, "transformer block ", layer,
              ": this model holds blocks ", stage_.first_layer, "..", stage_.end_layer - 1);
  return blocks_[static_cast<size_t>(layer - stage_.first_layer)];
}

const PackedLinear& PackedTransformer::classifier() const {
  TORCH_CHECK(last_stage(), "transformer classifier: this stage (blocks ", stage_.first_layer, "..", stage_.end_layer,
              ") does not hold the heads");
  return classifier_;
}

const PackedLinear& PackedTransformer::lm_head() const {
  TORCH_CHECK(last_stage(), "transformer LM head: this stage (blocks ", stage_.first_layer, "..", stage_.end_layer,
              ") does not hold the heads");
  TORCH_CHECK(!options_.tie_lm_head(),
              "transformer LM head: tied to the token embedding, it has no weights of its own");
  return lm_head_;
}

void PackedTransformer::reinitialize(uint64_t seed) {
  at::NoGradGuard no_grad;
  options_.seed(seed);
  // Residual projections are scaled by 1/sqrt(2 * layers), as GPT-2 does.
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(options_.layers()));
  std::vector<at::Tensor> rows;
  std::vector<int64_t> selected;
  // Every parameter of the full model is drawn in its order (a stage draws the ones
  // it does not hold into a scratch buffer), so a stage's values are the full model's.
  const std::vector<ParameterSpec> all = transformer_specs(options_);
  std::map<std::string, size_t> held;
  for (size_t i = 0; i < parameters_.size(); ++i) held[parameters_.spec(i).name] = i;
  for (int64_t k = 0; k < members(); ++k) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(member_seed(seed, k));
    at::Tensor row = at::empty({parameters_.per_member()}, at::kFloat);
    for (const ParameterSpec& spec : all) {
      const std::string& name = spec.name;
      const auto it = held.find(name);
      int64_t n = 1;
      for (const int64_t size : spec.shape) n *= size;
      at::Tensor slot =
          it != held.end() ? row.narrow(0, parameters_.row_offset(it->second), n) : at::empty({n}, at::kFloat);
      const bool is_norm = name.find(".ln") != std::string::npos || name.starts_with("ln_f");
      if (is_norm) {
        slot.fill_(name.ends_with(".weight") ? 1.0 : 0.0);
      } else if (name.ends_with(".bias")) {
        slot.zero_();
      } else {
        const bool residual = name.ends_with("attn.out.weight") || name.ends_with("mlp.proj.weight");
        slot.normal_(0.0, residual ? residual_std : 0.02, generator);
      }
    }
    rows.push_back(row);
    selected.push_back(k);
  }
  parameters_.write_member_rows(at::stack(rows), selected);
}

// A pack of one is one model: its norms and matmuls run on (d) and (I, O) views of
// its parameters as at::layer_norm with weight and bias (one kernel each way, which
// also reduces the weight and bias gradients) and plain GEMMs (addmm, mm: the linear
// layers' PackOfOne::kPlainGemm). Views, not select(0, 0): a view's gradient is a
// reshape, a select's a zero-filled copy. K > 1 members need per-member scales:
// layer_norm, then one addcmul; baddbmm.
at::Tensor PackedTransformer::norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const {
  const int64_t d = options_.width();
  const double eps = options_.norm_eps();
  if (options_.rms_norm()) {  // Llama's: x / sqrt(mean(x^2) + eps) * weight
    if (members() == 1) return at::rms_norm(x, {d}, weight.view({d}), eps);
    return at::rms_norm(x, {d}, {}, eps) * weight;
  }
  if (members() == 1) return at::layer_norm(x, {d}, weight.view({d}), bias.view({d}), eps);
  return at::addcmul(bias, at::layer_norm(x, {d}, {}, {}, eps), weight);
}

at::Tensor PackedTransformer::mlp_residual(const at::Tensor& x, const Block& block) const {
  const at::Tensor fc = block.mlp_fc.forward(norm(x, block.ln2_weight, block.ln2_bias));
  if (options_.gated_mlp()) {  // SwiGLU: columns [gate | up]
    const int64_t r = options_.mlp_width();
    return block.mlp_proj.forward_onto(x, at::silu(fc.narrow(-1, 0, r)) * fc.narrow(-1, r, r));
  }
  return block.mlp_proj.forward_onto(x, at::gelu(fc, options_.gelu_tanh() ? "tanh" : "none"));
}

at::Tensor PackedTransformer::embed(const at::Tensor& tokens) const {
  TORCH_CHECK(first_stage(), "transformer embed: this stage (blocks ", stage_.first_layer, "..", stage_.end_layer,
              ") does not hold the embeddings");
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong,
              "transformer trunk: tokens must be (B, T) int64, got ", tokens.scalar_type(), " ", tokens.sizes());
  const int64_t K = members(), B = tokens.size(0), T = tokens.size(1), d = options_.width();
  TORCH_CHECK(T >= 1 && T <= options_.max_length(), "transformer trunk: ", T, " tokens per row, the model has ",
              options_.max_length(), " positions");
  TORCH_CHECK(tokens.device() == parameters_.flat().device(), "transformer trunk: tokens are on ", tokens.device(),
              " but the model is on ", parameters_.flat().device());
  const at::Tensor embedded = param("tok_emb.weight").index_select(1, tokens.reshape({-1})).view({K, B, T, d});
  if (options_.rope_theta() > 0) return embedded;  // rotary positions enter in attention
  return embedded + param("pos_emb.weight").narrow(1, 0, T).unsqueeze(1);
}

// Llama's attention on the qkv projection (K, B*T, (H + 2 KV) dh): rotary positions
// 0..T-1 on q and k (transformers' rotate_half form, frequencies in float32 as it
// computes them), each key/value head shared by H / KV query heads. (K*B, H, T, dh).
at::Tensor PackedTransformer::rotary_gqa_attention(const at::Tensor& projected, int64_t B, int64_t T) const {
  const int64_t K = members(), H = options_.heads(), KV = options_.key_value_heads(), dh = options_.width() / H;
  const auto heads = [&](int64_t first, int64_t count) {
    return projected.narrow(-1, first * dh, count * dh).reshape({K * B, T, count, dh}).transpose(1, 2);
  };
  at::Tensor q = heads(0, H), k = heads(H, KV), v = heads(H + KV, KV);
  if (options_.rope_theta() > 0) {
    const auto f32 = projected.options().dtype(at::kFloat);
    const at::Tensor inverse =
        1.0 / at::pow(options_.rope_theta(), at::arange(0, dh, 2, f32) / static_cast<double>(dh));
    const at::Tensor angles = at::outer(at::arange(T, f32), inverse);  // (T, dh/2)
    const at::Tensor both = at::cat({angles, angles}, -1);             // (T, dh)
    const at::Tensor cos = both.cos().to(projected.scalar_type()), sin = both.sin().to(projected.scalar_type());
    const auto rotate = [&](const at::Tensor& x) {
      const at::Tensor half = at::cat({-x.narrow(-1, dh / 2, dh / 2), x.narrow(-1, 0, dh / 2)}, -1);
      return x * cos + half * sin;
    };
    q = rotate(q);
    k = rotate(k);
  }
  if (KV < H) {
    k = k.repeat_interleave(H / KV, 1);
    v = v.repeat_interleave(H / KV, 1);
  }
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
}

at::Tensor PackedTransformer::run_blocks(const at::Tensor& hidden) const {
  const int64_t K = members(), d = options_.width(), H = options_.heads(), dh = d / H;
  TORCH_CHECK(hidden.dim() == 4 && hidden.size(0) == K && hidden.size(3) == d, "transformer blocks: input must be (", K,
              ", B, T, ", d, "), got ", hidden.sizes());
  const int64_t B = hidden.size(1), T = hidden.size(2);
  at::Tensor x = hidden.reshape({K, B * T, d});
  for (const Block& block : blocks_) {
    // q, k, v: (K*B, H, T, dh) strided views of the qkv output (columns [3][H][dh]),
    // which SDPA reads in place. Unbinding dim 2 of (K*B, T, 3, H, dh) makes the
    // backward one stack of the three gradients straight into the qkv output's layout
    // (a copy into (3, K*B, H, T, dh) and three selects would cost a zeroed buffer and
    // a copy per tensor, and the stack then a permuting copy).
    const at::Tensor projected = block.qkv.forward(norm(x, block.ln1_weight, block.ln1_bias));
    at::Tensor attended;
    if (options_.rope_theta() == 0 && options_.key_value_heads() == H) {
      const std::vector<at::Tensor> qkv = projected.view({K * B, T, 3, H, dh}).unbind(2);
      attended = at::scaled_dot_product_attention(qkv[0].transpose(1, 2), qkv[1].transpose(1, 2),
                                                  qkv[2].transpose(1, 2), {}, 0.0, /*is_causal=*/true);
    } else {
      attended = rotary_gqa_attention(projected, B, T);
    }
    // (K*B, H, T, dh) -> (K, B*T, d): a view where the kernel returns it (K*B, T, H, dh)-major,
    // as the fused CPU one does.
    x = block.attn_out.forward_onto(x, attended.transpose(1, 2).reshape({K, B * T, d}));
    x = mlp_residual(x, block);
  }
  return x.view({K, B, T, d});
}

at::Tensor PackedTransformer::final_norm(const at::Tensor& x) const {
  TORCH_CHECK(last_stage(), "transformer final norm: this stage (blocks ", stage_.first_layer, "..", stage_.end_layer,
              ") does not hold it");
  const int64_t K = x.size(0), B = x.size(1), T = x.size(2), d = x.size(3);
  return norm(x.reshape({K, B * T, d}), ln_f_weight_, ln_f_bias_).view({K, B, T, d});
}

at::Tensor PackedTransformer::trunk(const at::Tensor& tokens) const {
  TORCH_CHECK(whole(), "transformer trunk: this model is a pipeline stage (blocks ", stage_.first_layer, "..",
              stage_.end_layer, " of ", options_.layers(), "): run embed, run_blocks and final_norm on the stages");
  return final_norm(run_blocks(embed(tokens)));
}

at::Tensor PackedTransformer::classify(const at::Tensor& hidden, const at::Tensor& lengths) const {
  const int64_t K = hidden.size(0), B = hidden.size(1), d = hidden.size(3);
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == B && lengths.scalar_type() == at::kLong,
              "transformer classify: lengths must be (", B, ") int64, got ", lengths.scalar_type(), " ",
              lengths.sizes());
  const at::Tensor last = (lengths - 1).view({1, B, 1, 1}).expand({K, B, 1, d});
  const at::Tensor pooled = hidden.gather(2, last).squeeze(2);  // (K, B, d)
  return classifier_.forward(pooled);
}

at::Tensor PackedTransformer::lm_logits(const at::Tensor& hidden) const {
  const int64_t K = hidden.size(0), B = hidden.size(1), T = hidden.size(2), d = hidden.size(3);
  const at::Tensor h = hidden.reshape({K, B * T, d});
  at::Tensor logits;
  if (!options_.tie_lm_head()) {
    logits = lm_head_.forward(h);
  } else if (K == 1) {
    logits = at::mm(h.reshape({B * T, d}), param("tok_emb.weight").view({options_.vocab(), d}).t());
  } else {
    logits = at::bmm(h, param("tok_emb.weight").transpose(1, 2));
  }
  return logits.view({K, B, T, options_.vocab()});
}

KvCache PackedTransformer::make_cache(int64_t rows) const {
  TORCH_CHECK(whole(), "KV cache: decoding needs the whole model, not a pipeline stage");
  TORCH_CHECK(rows >= 1, "KV cache: rows must be >= 1, got ", rows);
  const int64_t H = options_.heads(), dh = options_.width() / H;
  const auto opts = parameters_.flat().options();
  KvCache cache;
  cache.keys = at::zeros({options_.layers(), members() * rows, H, options_.max_length(), dh}, opts);
  cache.values = at::zeros_like(cache.keys);
  cache.rows = rows;
  return cache;
}

at::Tensor PackedTransformer::decode_step(const at::Tensor& tokens, const at::Tensor& position, KvCache& cache) const {
  TORCH_CHECK(whole(), "decode step: decoding needs the whole model, not a pipeline stage");
  TORCH_CHECK(options_.rope_theta() == 0 && options_.key_value_heads() == options_.heads(),
              "decode step: KV-cached decoding of rotary or grouped-query attention (a Llama trunk) is not "
              "supported yet");
  const int64_t K = members(), R = cache.rows, d = options_.width(), H = options_.heads(), dh = d / H;
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == K && tokens.size(1) == R && tokens.scalar_type() == at::kLong,
              "decode step: tokens must be (", K, ", ", R, ") int64, got ", tokens.scalar_type(), " ", tokens.sizes());
  TORCH_CHECK(position.numel() == 1 && position.scalar_type() == at::kLong,
              "decode step: position must be a 1-element int64 tensor");
  const at::Tensor index = tokens.unsqueeze(-1).expand({K, R, d});
  at::Tensor x = param("tok_emb.weight").gather(1, index) + param("pos_emb.weight").index_select(1, position.view({1}));
  const at::Tensor visible =
      (at::arange(options_.max_length(), position.options()) <= position.view({1})).view({1, 1, 1, -1});
  for (int64_t l = 0; l < options_.layers(); ++l) {
    const Block& block = blocks_[static_cast<size_t>(l)];
    const at::Tensor qkv = block.qkv.forward(norm(x, block.ln1_weight, block.ln1_bias))
                               .view({K, R, 3, H, dh})
                               .permute({2, 0, 1, 3, 4})
                               .reshape({3, K * R, H, 1, dh});
    at::Tensor keys = cache.keys[l], values = cache.values[l];  // (K*R, H, max_length, dh) views
    keys.index_copy_(2, position.view({1}), qkv[1]);
    values.index_copy_(2, position.view({1}), qkv[2]);
    const at::Tensor attended = at::scaled_dot_product_attention(qkv[0], keys, values, visible);
    x = block.attn_out.forward_onto(x, attended.reshape({K, R, d}));
    x = mlp_residual(x, block);
  }
  return norm(x, ln_f_weight_, ln_f_bias_);
}

}  // namespace packtrain::ensemble
