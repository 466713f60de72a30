// MultiTaskTrainerOptions: validation and JSON both ways (merged over the defaults).
#include "packtrain/runtime/trainers/multitask_trainer.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace packtrain::runtime {

namespace {

std::string dtype_name(c10::ScalarType t) { return t == at::kDouble ? "float64" : "float32"; }

// Whether a JSON value may stand where the defaults hold `like`: any number for a
// fractional default, a whole number for a whole one, an array of whole numbers for
// an array (the buckets), otherwise the same JSON type.
bool same_kind(const nlohmann::json& value, const nlohmann::json& like) {
  if (like.is_number_float()) return value.is_number();
  if (like.is_number_integer()) return value.is_number_integer();
  if (like.is_array()) {
    return value.is_array() &&
           std::all_of(value.begin(), value.end(), [](const nlohmann::json& v) { return v.is_number_integer(); });
  }
  return value.type() == like.type();
}

}  // namespace

void MultiTaskTrainerOptions::validate() const {
  model().validate();  // "transformer: <field> must be ..., got <value>"
  TORCH_CHECK(batch_size() > 0, "batch_size must be positive, got batch_size=", batch_size());
  TORCH_CHECK(eval_batch_size() > 0, "eval_batch_size must be positive, got eval_batch_size=", eval_batch_size());
  TORCH_CHECK(!buckets().empty(), "buckets must name at least one padded length, got buckets=[]");
  for (size_t i = 0; i < buckets().size(); ++i) {
    TORCH_CHECK(buckets()[i] >= 3, "bucket lengths must be >= 3 (BOS, a token, EOS), got buckets[", i,
                "]=", buckets()[i]);
    TORCH_CHECK(i == 0 || buckets()[i] > buckets()[i - 1], "bucket lengths must be strictly ascending, got buckets[",
                i - 1, "]=", buckets()[i - 1], " then buckets[", i, "]=", buckets()[i]);
  }
  TORCH_CHECK(buckets().back() <= model().max_length(), "the longest bucket (buckets[", buckets().size() - 1,
              "]=", buckets().back(), ") exceeds the model's max_length (model.max_length=", model().max_length(),
              ")");
  TORCH_CHECK(lr() >= 0, "lr must be >= 0, got lr=", lr());
  TORCH_CHECK(std::isfinite(lr()), "lr must be finite, got lr=", lr());
  TORCH_CHECK(weight_decay() >= 0, "weight_decay must be >= 0, got weight_decay=", weight_decay());
  TORCH_CHECK(std::isfinite(weight_decay()), "weight_decay must be finite, got weight_decay=", weight_decay());
  TORCH_CHECK(warmup_steps() >= 0, "warmup_steps must be >= 0, got warmup_steps=", warmup_steps());
  TORCH_CHECK(pipeline_stages() >= 1, "pipeline_stages must be >= 1, got pipeline_stages=", pipeline_stages());
  TORCH_CHECK(pipeline_stages() <= model().layers(), "pipeline_stages=", pipeline_stages(),
              " exceeds the model's blocks (model.layers=", model().layers(), "): each stage holds at least one");
  TORCH_CHECK(micro_batches() >= 1 && batch_size() % micro_batches() == 0, "micro_batches must divide batch_size=",
              batch_size(), ", got micro_batches=", micro_batches());
  TORCH_CHECK(pipeline_boundaries().empty() ||
                  static_cast<int64_t>(pipeline_boundaries().size()) == pipeline_stages() - 1,
              "pipeline_boundaries holds stages 1..S-1's first blocks: ", pipeline_stages() - 1, " of them for ",
              pipeline_stages(), " stages, got ", pipeline_boundaries().size());
  for (size_t i = 0; i < pipeline_boundaries().size(); ++i) {
    const int64_t b = pipeline_boundaries()[i];
    TORCH_CHECK(b >= 1 && b < model().layers() && (i == 0 || b > pipeline_boundaries()[i - 1]),
                "pipeline_boundaries must be strictly ascending blocks in [1, model.layers=", model().layers(),
                "), got pipeline_boundaries[", i, "]=", b);
  }
  TORCH_CHECK(pipeline_stages() == 1 || shared_inputs(),
              "a pipeline run reads the same sentences for both tasks (shared_inputs=true)");
  TORCH_CHECK(classification_weight() >= 0 && lm_weight() >= 0 && classification_weight() + lm_weight() > 0,
              "task weights must be >= 0 and not both 0, got classification_weight=", classification_weight(),
              ", lm_weight=", lm_weight());
}

std::string to_json(const MultiTaskTrainerOptions& o) {
  const auto& m = o.model();
  nlohmann::json j = {
      {"members", m.members()}, {"vocab", m.vocab()}, {"width", m.width()}, {"layers", m.layers()},
      {"heads", m.heads()}, {"mlp_ratio", m.mlp_ratio()}, {"max_length", m.max_length()},
      {"classes", m.classes()}, {"tie_lm_head", m.tie_lm_head()}, {"dtype", dtype_name(m.dtype())},
      {"batch_size", o.batch_size()}, {"buckets", o.buckets()}, {"lr", o.lr()}, {"weight_decay", o.weight_decay()},
      {"warmup_steps", o.warmup_steps()}, {"classification_weight", o.classification_weight()},
      {"lm_weight", o.lm_weight()}, {"balance_classes", o.balance_classes()}, {"shared_inputs", o.shared_inputs()},
      {"eval_batch_size", o.eval_batch_size()},
      {"seed", o.seed()}, {"capture", o.capture()}, {"pipeline_stages", o.pipeline_stages()},
      {"micro_batches", o.micro_batches()},
      {"pipeline_balance", distributed::kPlacementBalanceNames.name(o.pipeline_balance())},
      {"pipeline_boundaries", o.pipeline_boundaries()}};
  return j.dump();
}

MultiTaskTrainerOptions multitask_options_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TORCH_CHECK(j.is_object(), "multi-task options: not a JSON object");
  // The defaults' keys and values, each replaced by the given value where there is one.
  nlohmann::json merged = nlohmann::json::parse(to_json(MultiTaskTrainerOptions()));
  for (const auto& [key, value] : j.items()) {
    TORCH_CHECK(merged.contains(key), "multi-task options: unknown key '", key, "'");
    TORCH_CHECK(same_kind(value, merged.at(key)), "multi-task options: key '", key, "' has the wrong type: ",
                value.dump(), " (its default is ", merged.at(key).dump(), ")");
    merged[key] = value;
  }
  TORCH_CHECK(merged.at("seed").is_number_unsigned(), "multi-task options: seed must be >= 0, got seed=",
              merged.at("seed").dump());
  const std::string dtype = merged.at("dtype").get<std::string>();
  TORCH_CHECK(dtype == "float32" || dtype == "float64",
              "multi-task options: dtype must be float32 or float64, got dtype=", dtype);
  const auto i64 = [&](const char* key) { return merged.at(key).get<int64_t>(); };
  const auto f64 = [&](const char* key) { return merged.at(key).get<double>(); };
  const auto flag = [&](const char* key) { return merged.at(key).get<bool>(); };
  MultiTaskTrainerOptions o;
  o.model(ensemble::PackedTransformerOptions()
              .members(i64("members"))
              .vocab(i64("vocab"))
              .width(i64("width"))
              .layers(i64("layers"))
              .heads(i64("heads"))
              .mlp_ratio(i64("mlp_ratio"))
              .max_length(i64("max_length"))
              .classes(i64("classes"))
              .tie_lm_head(flag("tie_lm_head"))
              .dtype(dtype == "float64" ? at::kDouble : at::kFloat));
  o.batch_size(i64("batch_size")).buckets(merged.at("buckets").get<std::vector<int64_t>>());
  o.lr(f64("lr")).weight_decay(f64("weight_decay")).warmup_steps(i64("warmup_steps"));
  o.classification_weight(f64("classification_weight")).lm_weight(f64("lm_weight"));
  o.balance_classes(flag("balance_classes"));
  o.shared_inputs(flag("shared_inputs")).eval_batch_size(i64("eval_batch_size"));
  o.seed(merged.at("seed").get<uint64_t>()).capture(flag("capture"));
  o.pipeline_stages(i64("pipeline_stages")).micro_batches(i64("micro_batches"));
  o.pipeline_balance(distributed::kPlacementBalanceNames.parse(merged.at("pipeline_balance").get<std::string>()));
  o.pipeline_boundaries(merged.at("pipeline_boundaries").get<std::vector<int64_t>>());
  o.validate();
  return o;
}

}  // namespace packtrain::runtime
