#include "packtrain/ensemble/packed_transformer.h"

#include "packtrain/ensemble/member_seed.h"
#include "packtrain/ensemble/precision.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <utility>
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

// The four adapted projections of a block: name, in and out widths.
struct AdaptedSite {
  const char* name;
  int64_t in, out;
};
std::vector<AdaptedSite> adapted_sites(const PackedTransformerOptions& o) {
  const int64_t d = o.width(), r = o.mlp_width(), dh = d / o.heads();
  return {{"attn.qkv", d, (o.heads() + 2 * o.key_value_heads()) * dh},
          {"attn.out", d, d},
          {"mlp.fc", d, o.gated_mlp() ? 2 * r : r},
          {"mlp.proj", r, d}};
}

// What adapter members train: each block's four adapters, then the classifier.
std::vector<ParameterSpec> adapter_specs(const PackedTransformerOptions& o) {
  std::vector<ParameterSpec> specs;
  for (int64_t l = 0; l < o.layers(); ++l) {
    for (const AdaptedSite& site : adapted_sites(o)) {
      const std::string name = block_prefix(l) + "." + site.name;
      specs.push_back({name + ".lora_a", {site.in, o.lora_rank()}});
      specs.push_back({name + ".lora_b", {o.lora_rank(), site.out}});
    }
  }
  specs.push_back({"cls.weight", {o.width(), o.classes()}});
  specs.push_back({"cls.bias", {1, o.classes()}});
  return specs;
}

// What each member holds: the stage's part of the model, or (adapters) its adapters.
std::vector<ParameterSpec> stage_specs(const PackedTransformerOptions& o, const TransformerStage& stage) {
  if (o.lora_rank() > 0) return adapter_specs(o);
  std::vector<ParameterSpec> out;
  for (ParameterSpec& spec : transformer_specs(o)) {
    if (stage_holds(spec.name, stage, o)) out.push_back(std::move(spec));
  }
  return out;
}

// The frozen shared trunk of adapter members: the whole model but the classifier.
std::vector<ParameterSpec> shared_trunk_specs(const PackedTransformerOptions& o) {
  std::vector<ParameterSpec> out;
  if (o.lora_rank() == 0) return out;
  for (ParameterSpec& spec : transformer_specs(o)) {
    if (!spec.name.starts_with("cls.")) out.push_back(std::move(spec));
  }
  return out;
}

// Draws `all` (a full model's parameters, in order) for each member of `pack` from
// member_seed(seed, first_member + k) — GPT-2's scheme; the parameters `pack` does not
// hold are drawn into scratch, so a stage's values are the full model's.
void draw_gpt2(PackedParameters& pack, const std::vector<ParameterSpec>& all, uint64_t seed, int64_t first_member,
               int64_t layers) {
  // Residual projections are scaled by 1/sqrt(2 * layers), as GPT-2 does.
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(layers));
  std::map<std::string, size_t> held;
  for (size_t i = 0; i < pack.size(); ++i) held[pack.spec(i).name] = i;
  std::vector<at::Tensor> rows;
  std::vector<int64_t> selected;
  for (int64_t k = 0; k < pack.members(); ++k) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(member_seed(seed, first_member + k));
    at::Tensor row = at::empty({pack.per_member()}, at::kFloat);
    for (const ParameterSpec& spec : all) {
      const std::string& name = spec.name;
      const auto it = held.find(name);
      int64_t n = 1;
      for (const int64_t size : spec.shape) n *= size;
      at::Tensor slot = it != held.end() ? row.narrow(0, pack.row_offset(it->second), n) : at::empty({n}, at::kFloat);
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
  pack.write_member_rows(at::stack(rows), selected);
}

// Rotary positions (transformers' rotate_half form) on heads x (N, heads, P, dh) at
// positions whose tables cos, sin are (P, dh).
// Halves by chunk, not two narrows: the backward is one cat, not two zero-filled
// full-size gradients.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::vector<at::Tensor> halves = x.chunk(2, -1);
  return x * cos + at::cat({-halves[1], halves[0]}, -1) * sin;
}

// cos and sin (max_length, dh) of every position's rotary angles, computed in float32
// as transformers computes them, then cast to the model's dtype.
std::pair<at::Tensor, at::Tensor> rotary_tables(const PackedTransformerOptions& o) {
  const int64_t dh = o.width() / o.heads();
  const auto f32 = c10::TensorOptions().dtype(at::kFloat).device(o.device());
  const at::Tensor inverse = 1.0 / at::pow(o.rope_theta(), at::arange(0, dh, 2, f32) / static_cast<double>(dh));
  const at::Tensor angles = at::outer(at::arange(o.max_length(), f32), inverse);  // (P, dh/2)
  const at::Tensor both = at::cat({angles, angles}, -1);                          // (P, dh)
  return {both.cos().to(o.dtype()), both.sin().to(o.dtype())};
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
  TORCH_CHECK(lora_rank() >= 0, "transformer: lora_rank must be >= 0, got ", lora_rank());
  TORCH_CHECK(lora_alpha() > 0 && std::isfinite(lora_alpha()), "transformer: lora_alpha must be positive, got ",
              lora_alpha());
  TORCH_CHECK(first_member() >= 0, "transformer: first_member must be >= 0, got ", first_member());
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
  TORCH_CHECK(!adapted() || whole(), "transformer: adapters (lora_rank ", options_.lora_rank(),
              ") need the whole model, not a pipeline stage");
  if (adapted()) {
    trunk_ = PackedParameters(1, shared_trunk_specs(options_), parameters_.flat().options());
    for (const at::Tensor& t : trunk_.tensors()) t.requires_grad_(false);  // frozen: no weight gradients
  }
  for (const PackedParameters* pack : {&parameters_, &trunk_}) {
    for (size_t i = 0; i < pack->size(); ++i) by_name_.emplace(pack->spec(i).name, (*pack)[i]);
  }
  const auto optional = [&](const std::string& name) {  // a bias this shape has, or undefined
    const auto it = by_name_.find(name);
    return it == by_name_.end() ? at::Tensor() : it->second;
  };
  const auto linear = [&](const std::string& prefix) {
    return PackedLinear(param(prefix + ".weight"), optional(prefix + ".bias"), PackOfOne::kPlainGemm);
  };
  const auto adapter = [&](const std::string& prefix) -> Block::Adapter {
    if (!adapted()) return {};
    return {PackedLinear(param(prefix + ".lora_a"), {}), PackedLinear(param(prefix + ".lora_b"), {})};
  };
  for (int64_t l = stage_.first_layer; l < stage_.end_layer; ++l) {
    const std::string b = block_prefix(l);
    blocks_.push_back({param(b + ".ln1.weight"), optional(b + ".ln1.bias"), linear(b + ".attn.qkv"),
                       linear(b + ".attn.out"), param(b + ".ln2.weight"), optional(b + ".ln2.bias"),
                       linear(b + ".mlp.fc"), linear(b + ".mlp.proj"), adapter(b + ".attn.qkv"),
                       adapter(b + ".attn.out"), adapter(b + ".mlp.fc"), adapter(b + ".mlp.proj")});
  }
  if (last_stage()) {
    ln_f_weight_ = param("ln_f.weight");
    ln_f_bias_ = optional("ln_f.bias");
    classifier_ = linear("cls");
    if (!options_.tie_lm_head()) lm_head_ = linear("lm");
  }
  if (options_.rope_theta() > 0) std::tie(rotary_cos_, rotary_sin_) = rotary_tables(options_);
  reinitialize(options_.seed());
}

at::Tensor PackedTransformer::param(const std::string& name) const {
  const auto it = by_name_.find(name);
  TORCH_CHECK(it != by_name_.end(), "transformer: no parameter '", name, "'");
  return it->second;
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
  if (!adapted()) {
    draw_gpt2(parameters_, transformer_specs(options_), seed, options_.first_member(), options_.layers());
    return;
  }
  // The shared trunk as a pack of one of this seed; the members' adapters as LoRA starts them.
  draw_gpt2(trunk_, transformer_specs(options_), seed, 0, options_.layers());
  draw_adapters(seed);
}

// Member k's adapters from member_seed(~seed, first_member + k) (not the trunk's
// stream): A Kaiming-uniform as torch.nn.Linear's default (bound 1 / sqrt(in)), B
// zero — so every member starts as the trunk —, the classifier N(0, 0.02) with a zero
// bias.
void PackedTransformer::draw_adapters(uint64_t seed) {
  std::vector<at::Tensor> rows;
  std::vector<int64_t> selected;
  for (int64_t k = 0; k < members(); ++k) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(member_seed(~seed, options_.first_member() + k));
    at::Tensor row = at::zeros({parameters_.per_member()}, at::kFloat);
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const ParameterSpec& spec = parameters_.spec(i);
      at::Tensor slot = row.narrow(0, parameters_.row_offset(i), parameters_.numel(i));
      if (spec.name.ends_with(".lora_a")) {
        const double bound = 1.0 / std::sqrt(static_cast<double>(spec.shape[0]));
        slot.uniform_(-bound, bound, generator);
      } else if (spec.name == "cls.weight") {
        slot.normal_(0.0, 0.02, generator);
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
  const bool one = weight.size(0) == 1;  // a pack of one, or the adapters' shared trunk
  if (options_.rms_norm()) {             // Llama's: x / sqrt(mean(x^2) + eps) * weight
    if (one) return at::rms_norm(x, {d}, weight.view({d}), eps);
    return at::rms_norm(x, {d}, {}, eps) * weight;
  }
  if (one) return at::layer_norm(x, {d}, weight.view({d}), bias.view({d}), eps);
  return at::addcmul(bias, at::layer_norm(x, {d}, {}, {}, eps), weight);
}

at::Tensor PackedTransformer::project(const PackedLinear& linear, const Block::Adapter* adapter,
                                      const at::Tensor& x) const {
  if (!adapted()) return linear.forward(x);
  // The trunk's one GEMM over every member's rows: (Kx, N, in) -> (1, Kx * N, in).
  const int64_t Kx = x.size(0), N = x.size(1);
  const at::Tensor shared = linear.forward(x.reshape({1, Kx * N, x.size(2)})).view({Kx, N, linear.out_features()});
  if (adapter == nullptr) return shared;
  const at::Tensor in = Kx == 1 ? x.reshape({N, x.size(2)}) : x;  // one shared input: broadcast to the members
  const double scale = options_.lora_alpha() / static_cast<double>(options_.lora_rank());
  return shared + adapter->up.forward(adapter->down.forward(in) * scale);
}

at::Tensor PackedTransformer::project_onto(const at::Tensor& residual, const PackedLinear& linear,
                                           const Block::Adapter* adapter, const at::Tensor& x) const {
  if (!adapted()) return linear.forward_onto(residual, x);
  return residual + project(linear, adapter, x);
}

at::Tensor PackedTransformer::mlp_residual(const at::Tensor& x, const Block& block) const {
  const at::Tensor fc = project(block.mlp_fc, &block.mlp_fc_adapter, norm(x, block.ln2_weight, block.ln2_bias));
  at::Tensor activated;
  if (options_.gated_mlp()) {  // SwiGLU: columns [gate | up] (chunk: one cat backward)
    const std::vector<at::Tensor> gate_up = fc.chunk(2, -1);
    activated = at::silu(gate_up[0]) * gate_up[1];
  } else {
    activated = at::gelu(fc, options_.gelu_tanh() ? "tanh" : "none");
  }
  return project_onto(x, block.mlp_proj, &block.mlp_proj_adapter, activated);
}

at::Tensor PackedTransformer::embed(const at::Tensor& tokens) const {
  TORCH_CHECK(first_stage(), "transformer embed: this stage (blocks ", stage_.first_layer, "..", stage_.end_layer,
              ") does not hold the embeddings");
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong,
              "transformer trunk: tokens must be (B, T) int64, got ", tokens.scalar_type(), " ", tokens.sizes());
  const at::Tensor table = param("tok_emb.weight");  // (K or, adapters, 1, V, d)
  const int64_t K = table.size(0), B = tokens.size(0), T = tokens.size(1), d = options_.width();
  TORCH_CHECK(T >= 1 && T <= options_.max_length(), "transformer trunk: ", T, " tokens per row, the model has ",
              options_.max_length(), " positions");
  TORCH_CHECK(tokens.device() == parameters_.flat().device(), "transformer trunk: tokens are on ", tokens.device(),
              " but the model is on ", parameters_.flat().device());
  const at::Tensor embedded = table.index_select(1, tokens.reshape({-1})).view({K, B, T, d});
  if (options_.rope_theta() > 0) return embedded;  // rotary positions enter in attention
  return embedded + param("pos_emb.weight").narrow(1, 0, T).unsqueeze(1);
}

// Llama's attention on the qkv projection (K, B*T, (H + 2 KV) dh): rotary positions
// 0..T-1 on q and k, each key/value head shared by H / KV query heads (SDPA's
// enable_gqa: no repeated copies). (K*B, H, T, dh). q, k, v are one split of the
// projection (its backward one cat; narrows would each zero-fill a full gradient).
at::Tensor PackedTransformer::rotary_gqa_attention(const at::Tensor& projected, int64_t B, int64_t T) const {
  const int64_t K = projected.size(0), H = options_.heads(), KV = options_.key_value_heads();
  const int64_t dh = options_.width() / H;
  std::vector<at::Tensor> qkv = projected.reshape({K * B, T, H + 2 * KV, dh}).split_with_sizes({H, KV, KV}, 2);
  for (at::Tensor& part : qkv) part = part.transpose(1, 2);
  if (options_.rope_theta() > 0) {
    const at::Tensor cos = rotary_cos_.narrow(0, 0, T), sin = rotary_sin_.narrow(0, 0, T);
    qkv[0] = rotate(qkv[0], cos, sin);
    qkv[1] = rotate(qkv[1], cos, sin);
  }
  return at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], {}, 0.0, /*is_causal=*/true, std::nullopt,
                                          /*enable_gqa=*/KV < H);
}

at::Tensor PackedTransformer::attention_residual(const at::Tensor& x, const Block& block, int64_t B, int64_t T) const {
  const int64_t d = options_.width(), H = options_.heads(), dh = d / H;
  // q, k, v: (K*B, H, T, dh) strided views of the qkv output (columns [3][H][dh]),
  // which SDPA reads in place. Unbinding dim 2 of (K*B, T, 3, H, dh) makes the
  // backward one stack of the three gradients straight into the qkv output's layout
  // (a copy into (3, K*B, H, T, dh) and three selects would cost a zeroed buffer and
  // a copy per tensor, and the stack then a permuting copy).
  const at::Tensor projected = project(block.qkv, &block.qkv_adapter, norm(x, block.ln1_weight, block.ln1_bias));
  const int64_t Kq = projected.size(0);  // K, or (adapters) the members
  at::Tensor attended;
  if (options_.rope_theta() == 0 && options_.key_value_heads() == H) {
    const std::vector<at::Tensor> qkv = projected.view({Kq * B, T, 3, H, dh}).unbind(2);
    attended = at::scaled_dot_product_attention(qkv[0].transpose(1, 2), qkv[1].transpose(1, 2), qkv[2].transpose(1, 2),
                                                {}, 0.0, /*is_causal=*/true);
  } else {
    attended = rotary_gqa_attention(projected, B, T);
  }
  // (K*B, H, T, dh) -> (K, B*T, d): a view where the kernel returns it (K*B, T, H, dh)-major,
  // as the fused CPU one does.
  return project_onto(x, block.attn_out, &block.attn_out_adapter, attended.transpose(1, 2).reshape({Kq, B * T, d}));
}

at::Tensor PackedTransformer::run_blocks(const at::Tensor& hidden) const {
  const PrecisionScope scope(precision_, hidden.device().type());
  const int64_t K = members(), d = options_.width();
  // Adapters: the shared embedding (one member) enters; the members' adapters fan it out.
  TORCH_CHECK(hidden.dim() == 4 && (hidden.size(0) == K || (adapted() && hidden.size(0) == 1)) && hidden.size(3) == d,
              "transformer blocks: input must be (", K, ", B, T, ", d, "), got ", hidden.sizes());
  const int64_t B = hidden.size(1), T = hidden.size(2);
  at::Tensor x = hidden.reshape({hidden.size(0), B * T, d});
  for (const Block& block : blocks_) {
    x = attention_residual(x, block, B, T);
    x = mlp_residual(x, block);
  }
  return x.view({x.size(0), B, T, d}).to(parameters_.flat().scalar_type());
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
  const PrecisionScope scope(precision_, hidden.device().type());
  return classifier_.forward(pooled).to(hidden.scalar_type());
}

at::Tensor PackedTransformer::lm_logits(const at::Tensor& hidden) const {
  const int64_t K = hidden.size(0), B = hidden.size(1), T = hidden.size(2), d = hidden.size(3);
  const at::Tensor h = hidden.reshape({K, B * T, d});
  const PrecisionScope scope(precision_, hidden.device().type());
  at::Tensor logits;
  if (!options_.tie_lm_head()) {
    logits = project(lm_head_, nullptr, h);
  } else if (const at::Tensor table = param("tok_emb.weight"); table.size(0) == 1) {  // one table for every row
    logits = at::mm(h.reshape({K * B * T, d}), table.view({options_.vocab(), d}).t());
  } else {
    logits = at::bmm(h, table.transpose(1, 2));
  }
  return logits.view({K, B, T, options_.vocab()}).to(hidden.scalar_type());
}

KvCache PackedTransformer::make_cache(int64_t rows) const {
  TORCH_CHECK(whole(), "KV cache: decoding needs the whole model, not a pipeline stage");
  TORCH_CHECK(rows >= 1, "KV cache: rows must be >= 1, got ", rows);
  const int64_t KV = options_.key_value_heads(), dh = options_.width() / options_.heads();
  const auto opts = parameters_.flat().options();
  KvCache cache;
  cache.keys = at::zeros({options_.layers(), members() * rows, KV, options_.max_length(), dh}, opts);
  cache.values = at::zeros_like(cache.keys);
  cache.rows = rows;
  return cache;
}

at::Tensor PackedTransformer::decode_step(const at::Tensor& tokens, const at::Tensor& position, KvCache& cache) const {
  TORCH_CHECK(whole(), "decode step: decoding needs the whole model, not a pipeline stage");
  const int64_t K = members(), R = cache.rows, d = options_.width(), H = options_.heads(), dh = d / H;
  const int64_t KV = options_.key_value_heads();
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == K && tokens.size(1) == R && tokens.scalar_type() == at::kLong,
              "decode step: tokens must be (", K, ", ", R, ") int64, got ", tokens.scalar_type(), " ", tokens.sizes());
  TORCH_CHECK(position.numel() == 1 && position.scalar_type() == at::kLong,
              "decode step: position must be a 1-element int64 tensor");
  const at::Tensor at_position = position.view({1});
  const PrecisionScope scope(precision_, tokens.device().type());
  const at::Tensor table = param("tok_emb.weight");
  at::Tensor x = table.size(0) == 1
                     ? table.view({options_.vocab(), d}).index_select(0, tokens.reshape({-1})).view({K, R, d})
                     : table.gather(1, tokens.unsqueeze(-1).expand({K, R, d}));
  if (options_.rope_theta() == 0) x = x + param("pos_emb.weight").index_select(1, at_position);
  at::Tensor cos, sin;  // (1, dh): the rotary angles at this position
  if (options_.rope_theta() > 0) {
    cos = rotary_cos_.index_select(0, at_position);
    sin = rotary_sin_.index_select(0, at_position);
  }
  const at::Tensor visible = (at::arange(options_.max_length(), position.options()) <= at_position).view({1, 1, 1, -1});
  for (int64_t l = 0; l < options_.layers(); ++l) {
    const Block& block = blocks_[static_cast<size_t>(l)];
    // (K, R, (H + 2 KV) dh) -> q (K*R, H, 1, dh), k and v (K*R, KV, 1, dh).
    const at::Tensor projected = project(block.qkv, &block.qkv_adapter, norm(x, block.ln1_weight, block.ln1_bias));
    const auto heads = [&](int64_t first, int64_t count) {
      return projected.narrow(-1, first * dh, count * dh).reshape({K * R, count, 1, dh});
    };
    at::Tensor q = heads(0, H), k = heads(H, KV);
    if (options_.rope_theta() > 0) {
      q = rotate(q, cos, sin);
      k = rotate(k, cos, sin);
    }
    at::Tensor keys = cache.keys[l], values = cache.values[l];   // (K*R, KV, max_length, dh) views
    keys.index_copy_(2, at_position, k.to(keys.scalar_type()));  // bf16-mixed: the cache stays float32
    values.index_copy_(2, at_position, heads(H + KV, KV).to(values.scalar_type()));
    const at::Tensor attended = at::scaled_dot_product_attention(q, keys, values, visible, 0.0, false, std::nullopt,
                                                                 /*enable_gqa=*/KV < H);
    x = project_onto(x, block.attn_out, &block.attn_out_adapter, attended.reshape({K, R, d}));
    x = mlp_residual(x, block);
  }
  return norm(x, ln_f_weight_, ln_f_bias_).to(parameters_.flat().scalar_type());
}

std::vector<std::pair<std::string, at::Tensor>> PackedTransformer::member_tensors(int64_t member,
                                                                                  bool gradients) const {
  TORCH_CHECK(whole(), "member tensors: a pipeline stage holds part of the model; use the whole model");
  TORCH_CHECK(member >= 0 && member < members(), "member tensors: member ", member, " out of range for ", members(),
              " members");
  TORCH_CHECK(!(gradients && adapted()), "member tensors: adapter members have no trunk gradients");
  at::NoGradGuard no_grad;
  const double scale = adapted() ? options_.lora_alpha() / static_cast<double>(options_.lora_rank()) : 0.0;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const ParameterSpec& spec : transformer_specs(options_)) {
    const at::Tensor source = param(spec.name);
    const bool shared = source.size(0) == 1 && adapted();
    at::Tensor value = gradients ? source.grad() : source;
    TORCH_CHECK(value.defined(), "member tensors: parameter ", spec.name, " has no gradient");
    value = value[shared ? 0 : member].detach();
    const std::string prefix = spec.name.substr(0, spec.name.size() - std::string(".weight").size());
    if (adapted() && spec.name.ends_with(".weight") && by_name_.contains(prefix + ".lora_a")) {
      value = value + at::mm(param(prefix + ".lora_a")[member], param(prefix + ".lora_b")[member]) * scale;
    }
    out.emplace_back(spec.name, value);
  }
  return out;
}

}  // namespace packtrain::ensemble
