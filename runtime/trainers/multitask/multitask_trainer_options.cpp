// MultiTaskTrainerOptions: validation and JSON both ways (merged over the defaults).
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"

#include "packtrain/base/option_schema.h"
#include "packtrain/base/user_error.h"
#include "packtrain/runtime/trainers/multitask/pretrained_trunk.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace packtrain::runtime {

namespace {

using Schema = OptionSchema<MultiTaskTrainerOptions>;

inline constexpr EnumNames<c10::ScalarType, 2> kDtypeNames{
    "dtype", {{{c10::ScalarType::Float, "float32"}, {c10::ScalarType::Double, "float64"}}}};

// K adapters on one frozen trunk instead of K full copies (PackedTransformerOptions).
void describe_adapters(Schema& s) {
  s.option(PACKTRAIN_NESTED_OPTION(model, lora_rank))
      .help_text(
          "Train each member as a low-rank adapter of this rank (LoRA on every block's qkv, attention output and "
          "MLP projections, plus its own classifier) on one frozen --trunk held once, instead of a full copy per "
          "member; 0: full copies")
      .in_group("Model")
      .at_least(0)
      .added_in(4, 0);
  s.option(PACKTRAIN_NESTED_OPTION(model, lora_alpha))
      .help_text("The adapters' scale: each adds (lora_alpha / lora_rank) x A B to its projection")
      .in_group("Model")
      .above(0)
      .finite_only()
      .added_in(4, 16.0);
  s.option(PACKTRAIN_NESTED_OPTION(model, first_member))
      .help_text(
          "The global index of member 0: member k draws its start from the seed as member first_member + k of a "
          "larger pack would (to train one member of a pack alone)")
      .in_group("Model")
      .at_least(0)
      .added_in(4, 0);
}

// The transformer's shape (the model's own fields, at the top level of the JSON).
void describe_model(Schema& s) {
  s.option(PACKTRAIN_NESTED_OPTION(model, members))
      .help_text("Models trained as one pack (1: an ordinary model)")
      .in_group("Model")
      .above(0);
  s.option(PACKTRAIN_NESTED_OPTION(model, vocab))
      .help_text("Tokens (the byte tokenizer's 259; a --trunk's from its config)")
      .no_flag()
      .above(0);
  s.option(PACKTRAIN_NESTED_OPTION(model, width)).help_text("Model width").in_group("Model").above(0);
  s.option(PACKTRAIN_NESTED_OPTION(model, layers)).help_text("Transformer blocks").in_group("Model").above(0);
  s.option(PACKTRAIN_NESTED_OPTION(model, heads))
      .help_text("Attention heads (width must be a multiple)")
      .in_group("Model")
      .above(0);
  s.option(PACKTRAIN_NESTED_OPTION(model, mlp_ratio)).help_text("MLP hidden width / width").no_flag().above(0);
  s.option(PACKTRAIN_NESTED_OPTION(model, max_length))
      .help_text("Positions (tokens, BOS/EOS included)")
      .in_group("Model")
      .above(0);
  s.option(PACKTRAIN_NESTED_OPTION(model, classes))
      .help_text("Classes C (the CLI sets it from the data)")
      .no_flag()
      .above(0);
  s.option(PACKTRAIN_NESTED_OPTION(model, tie_lm_head)).help_text("LM logits from the token embedding").no_flag();
  s.option(PACKTRAIN_NESTED_OPTION(model, gelu_tanh))
      .help_text("The MLP's GELU in its tanh form (a GPT-2 trunk's)")
      .no_flag()
      .added_in(3, false);
  s.option(PACKTRAIN_NESTED_OPTION(model, norm_eps))
      .help_text("LayerNorm epsilon")
      .no_flag()
      .above(0)
      .finite_only()
      .added_in(3, 1e-5);
  // Llama's block (a --trunk's config sets them; PackedTransformerOptions).
  s.option(PACKTRAIN_NESTED_OPTION(model, rms_norm))
      .help_text("RMSNorm instead of LayerNorm")
      .no_flag()
      .added_in(3, false);
  s.option(PACKTRAIN_NESTED_OPTION(model, linear_bias))
      .help_text("Biases on the projections")
      .no_flag()
      .added_in(3, true);
  s.option(PACKTRAIN_NESTED_OPTION(model, kv_heads))
      .help_text("Key/value heads of grouped-query attention (0: heads)")
      .no_flag()
      .at_least(0)
      .added_in(3, 0);
  s.option(PACKTRAIN_NESTED_OPTION(model, rope_theta))
      .help_text("Rotary positions' base (0: learned positions)")
      .no_flag()
      .at_least(0)
      .finite_only()
      .added_in(3, 0.0);
  s.option(PACKTRAIN_NESTED_OPTION(model, gated_mlp)).help_text("SwiGLU MLP").no_flag().added_in(3, false);
  s.option(PACKTRAIN_NESTED_OPTION(model, mlp_hidden))
      .help_text("MLP hidden width (0: mlp_ratio x width)")
      .no_flag()
      .at_least(0)
      .added_in(3, 0);
  s.option(PACKTRAIN_OPTION(trunk))
      .help_text(
          "A Hugging Face GPT-2 or Llama checkpoint folder (config.json, model.safetensors or a sharded index, "
          "Llama's tokenizer.model or GPT-2's tokenizer.json or vocab.json + merges.txt) as the trunk: its config "
          "replaces the width, layers, heads and positions, its weights the trunk and LM head, its tokenizer the byte "
          "tokenizer; \"\": train "
          "packtrain's own trunk from scratch")
      .in_group("Model")
      .added_in(3, "");
  describe_adapters(s);
  s.choice(PACKTRAIN_NESTED_OPTION(model, dtype), kDtypeNames).help_text("Parameter dtype").no_flag();
}

void describe_training(Schema& s) {
  s.option(PACKTRAIN_OPTION(batch_size))
      .flag_name("--batch")
      .help_text("Sentences per step")
      .in_group("Training")
      .above(0);
  s.option(PACKTRAIN_OPTION(buckets))
      .help_text("Padded lengths, ascending; one captured graph each")
      .in_group("Training")
      .at_least(3);
  s.option(PACKTRAIN_OPTION(lr)).help_text("AdamW learning rate").in_group("Training").at_least(0).finite_only();
  s.option(PACKTRAIN_OPTION(member_lrs))
      .help_text("One AdamW learning rate per member (K comma-separated values) in place of --lr; empty: --lr for all")
      .in_group("Training")
      .added_in(4, std::vector<double>{});
  s.option(PACKTRAIN_OPTION(weight_decay))
      .help_text("AdamW weight decay")
      .in_group("Training")
      .at_least(0)
      .finite_only();
  s.option(PACKTRAIN_OPTION(warmup_steps))
      .flag_name("--warmup")
      .help_text("Linear warm-up steps")
      .in_group("Training")
      .at_least(0);
  s.option(PACKTRAIN_OPTION(classification_weight))
      .flag_name("--cls-weight")
      .help_text("Weight of the classification loss")
      .in_group("Training")
      .at_least(0)
      .finite_only();
  s.option(PACKTRAIN_OPTION(lm_weight))
      .help_text("Weight of the LM loss")
      .in_group("Training")
      .at_least(0)
      .finite_only();
  s.option(PACKTRAIN_OPTION(balance_classes))
      .help_text(
          "Weight each sentence's classification loss by N / (C x its class's count), so the majority "
          "class alone is no longer the cheapest answer (the dev metrics are never weighted)")
      .in_group("Training");
  s.option(PACKTRAIN_OPTION(shared_inputs))
      .flag_name("--separate-lm-texts")
      .sets_false()
      .help_text("The LM task reads another order of the sentences (two trunk forwards, still one backward)")
      .in_group("Training");
  s.option(PACKTRAIN_OPTION(eval_batch_size)).help_text("Sentences per evaluation batch").no_flag().above(0);
  s.option(PACKTRAIN_OPTION(patience))
      .help_text(
          "Early stopping per member: a member whose dev classification loss has not improved for this many "
          "epochs stops at its best epoch's weights; the run ends when none trains (0: off)")
      .in_group("Training")
      .at_least(0)
      .added_in(5, int64_t{0});
  s.option(PACKTRAIN_OPTION(seed)).help_text("Initialization and batch order").in_group("Training");
  s.option(PACKTRAIN_OPTION(capture))
      .flag_name("--no-capture")
      .sets_false()
      .help_text("Run the steps eagerly on a GPU too")
      .in_group("Training");
  s.choice(PACKTRAIN_OPTION(precision), ensemble::kPrecisionNames)
      .help_text(
          "Arithmetic: fp32, or bf16-mixed (torch.autocast's bfloat16 policy: matrix products in bfloat16 with "
          "float32 accumulation; weights, optimizer, losses and metrics stay float32)")
      .in_group("Training")
      .added_in(6, "fp32");
}

void describe_pipeline(Schema& s) {
  s.option(PACKTRAIN_OPTION(pipeline_stages))
      .help_text(
          "Split the model's blocks over this many processes (run under launch/torchrun/srun with as many "
          "ranks, or R times as many for R data-parallel replicas of the pipeline; embeddings with the "
          "first stage, heads with the last; the placement is printed)")
      .in_group("Training")
      .at_least(1);
  s.option(PACKTRAIN_OPTION(micro_batches))
      .help_text(
          "Pipeline: run each batch as this many equal micro-batches (1F1B on CPU, GPipe on a GPU); more "
          "shrink the idle fraction (S-1)/(M+S-1)")
      .in_group("Training")
      .at_least(1);
  s.choice(PACKTRAIN_OPTION(pipeline_balance), distributed::kPlacementBalanceNames)
      .help_text(
          "Pipeline: place blocks so the stages hold equal parameters (memory), or take equal measured "
          "forward + backward time (rank 0 times an embedding, a block and the heads first)")
      .in_group("Training");
  s.option(PACKTRAIN_OPTION(pipeline_boundaries)).internal();  // the placement a pipeline run recorded
}

// The checks across fields, after each field's own range (the schema's).
void check_buckets(const MultiTaskTrainerOptions& o) {
  const std::vector<int64_t>& b = o.buckets();
  if (b.empty()) throw UserError("buckets must name at least one padded length, got buckets=[]");
  for (size_t i = 1; i < b.size(); ++i) {
    if (b[i] <= b[i - 1]) {
      throw UserError(fmt::format("bucket lengths must be strictly ascending, got buckets[{}]={} then buckets[{}]={}",
                                  i - 1, b[i - 1], i, b[i]));
    }
  }
  if (b.back() > o.model().max_length()) {
    throw UserError(
        fmt::format("the longest bucket (buckets[{}]={}) exceeds the model's max_length "
                    "(model.max_length={})",
                    b.size() - 1, b.back(), o.model().max_length()));
  }
}

void check_pipeline(const MultiTaskTrainerOptions& o) {
  const int64_t S = o.pipeline_stages(), layers = o.model().layers();
  if (S > layers) {
    throw UserError(
        fmt::format("pipeline_stages={} exceeds the model's blocks (model.layers={}): each stage holds at "
                    "least one",
                    S, layers));
  }
  if (o.batch_size() % o.micro_batches() != 0) {
    throw UserError(fmt::format("micro_batches must divide batch_size={}, got micro_batches={}", o.batch_size(),
                                o.micro_batches()));
  }
  const std::vector<int64_t>& bounds = o.pipeline_boundaries();
  if (!bounds.empty() && static_cast<int64_t>(bounds.size()) != S - 1) {
    throw UserError(
        fmt::format("pipeline_boundaries holds stages 1..S-1's first blocks: {} of them for {} stages, got {}", S - 1,
                    S, bounds.size()));
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (bounds[i] < 1 || bounds[i] >= layers || (i > 0 && bounds[i] <= bounds[i - 1])) {
      throw UserError(
          fmt::format("pipeline_boundaries must be strictly ascending blocks in [1, model.layers={}), got "
                      "pipeline_boundaries[{}]={}",
                      layers, i, bounds[i]));
    }
  }
  if (S > 1 && !o.shared_inputs()) {
    throw UserError("a pipeline run reads the same sentences for both tasks (shared_inputs=true)");
  }
}

}  // namespace

const OptionSchema<MultiTaskTrainerOptions>& multitask_option_schema() {
  static const Schema schema = [] {
    // Version 1 (no format_version) was read merged over the defaults; so is this.
    Schema s("multi-task options", kMultiTaskOptionsFormat);
    s.missing_keys_take_defaults();
    describe_model(s);
    describe_training(s);
    describe_pipeline(s);
    return s;
  }();
  return schema;
}

void MultiTaskTrainerOptions::validate() const {
  try {
    model().validate();  // "transformer: <field> must be ..., got <value>"
  } catch (const c10::Error& e) {
    throw UserError(e.what_without_backtrace());
  }
  multitask_option_schema().check_ranges(*this);
  check_buckets(*this);
  check_pipeline(*this);
  if (classification_weight() + lm_weight() <= 0) {
    throw UserError(fmt::format("task weights must be >= 0 and not both 0, got classification_weight={}, lm_weight={}",
                                classification_weight(), lm_weight()));
  }
  if (!member_lrs().empty() && static_cast<int64_t>(member_lrs().size()) != model().members()) {
    throw UserError(fmt::format("member_lrs holds {} learning rates for {} members: give one per member",
                                member_lrs().size(), model().members()));
  }
  for (size_t k = 0; k < member_lrs().size(); ++k) {
    if (!(member_lrs()[k] >= 0) || !std::isfinite(member_lrs()[k])) {
      throw UserError(fmt::format("member_lrs[{}] must be >= 0 and finite, got {}", k, member_lrs()[k]));
    }
  }
  if (model().lora_rank() > 0 && trunk().empty()) {
    throw UserError(
        fmt::format("model.lora_rank={} trains adapters on a pretrained trunk: give --trunk DIR (a "
                    "random frozen trunk has nothing to adapt)",
                    model().lora_rank()));
  }
  if (patience() > 0 && pipeline_stages() > 1) {
    throw UserError(
        fmt::format("early stopping (patience={}) watches each member's validation loss in one process: "
                    "pipeline_stages must be 1, got {}",
                    patience(), pipeline_stages()));
  }
  if (model().lora_rank() > 0 && pipeline_stages() > 1) {
    throw UserError(
        fmt::format("adapters (model.lora_rank={}) share one trunk on one rank: pipeline_stages must be 1, "
                    "got {}",
                    model().lora_rank(), pipeline_stages()));
  }
}

MultiTaskTrainerOptions with_trunk_shape(MultiTaskTrainerOptions o) {
  if (o.trunk().empty()) return o;
  // Absolute, so a checkpoint names the same folder whatever directory reads it.
  o.trunk(std::filesystem::absolute(o.trunk()).lexically_normal().string());
  const ensemble::PackedTransformerOptions loaded = pretrained_trunk_options(o.trunk(), o.model().classes());
  o.model(ensemble::PackedTransformerOptions(o.model())
              .vocab(loaded.vocab())
              .width(loaded.width())
              .layers(loaded.layers())
              .heads(loaded.heads())
              .mlp_ratio(loaded.mlp_ratio())
              .max_length(loaded.max_length())
              .tie_lm_head(loaded.tie_lm_head())
              .gelu_tanh(loaded.gelu_tanh())
              .norm_eps(loaded.norm_eps())
              .rms_norm(loaded.rms_norm())
              .linear_bias(loaded.linear_bias())
              .kv_heads(loaded.kv_heads())
              .rope_theta(loaded.rope_theta())
              .gated_mlp(loaded.gated_mlp())
              .mlp_hidden(loaded.mlp_hidden()));
  return o;
}

std::string to_json(const MultiTaskTrainerOptions& o) { return multitask_option_schema().to_json(o).dump(); }

MultiTaskTrainerOptions multitask_options_from_json(const std::string& text) {
  MultiTaskTrainerOptions o = multitask_option_schema().parse(text);
  o.validate();
  return o;
}

}  // namespace packtrain::runtime
