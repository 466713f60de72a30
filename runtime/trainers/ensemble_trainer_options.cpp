#include "packtrain/runtime/trainers/ensemble_trainer_options.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cmath>

namespace packtrain::runtime {

void EnsembleTrainerOptions::validate() const {
  TORCH_CHECK(members() > 0, "members must be positive, got ", members());
  TORCH_CHECK(first_member() >= 0, "first_member must be >= 0, got ", first_member());
  TORCH_CHECK(hidden() > 0, "hidden must be positive, got ", hidden());
  TORCH_CHECK(depth() >= 0, "depth must be >= 0, got ", depth());
  TORCH_CHECK(dropout() >= 0 && dropout() < 1, "dropout must be in [0, 1), got ", dropout());
  TORCH_CHECK(epochs() > 0, "epochs must be positive, got ", epochs());
  TORCH_CHECK(batch_size() > 0, "batch size must be positive, got ", batch_size());
  // Infinite rates pass a sign check and make every member diverge: finite, always.
  TORCH_CHECK(lr() > 0 && std::isfinite(lr()), "learning rate must be positive and finite, got ", lr());
  TORCH_CHECK(weight_decay() >= 0 && std::isfinite(weight_decay()), "weight decay must be >= 0 and finite, got ",
              weight_decay());
  TORCH_CHECK(momentum() >= 0 && momentum() < 1, "momentum must be in [0, 1), got ", momentum());
  TORCH_CHECK(member_lr().empty() || static_cast<int64_t>(member_lr().size()) == members(),
              "per-member learning rates: expected one per member (", members(), "), got ", member_lr().size());
  for (const double v : member_lr()) {
    TORCH_CHECK(v > 0 && std::isfinite(v), "learning rate must be positive and finite, got ", v);
  }
  TORCH_CHECK(member_weight_decay().empty() || static_cast<int64_t>(member_weight_decay().size()) == members(),
              "per-member weight decays: expected one per member (", members(), "), got ",
              member_weight_decay().size());
  for (const double v : member_weight_decay()) {
    TORCH_CHECK(v >= 0 && std::isfinite(v), "weight decay must be >= 0 and finite, got ", v);
  }
  TORCH_CHECK(member_dropout().empty() || static_cast<int64_t>(member_dropout().size()) == members(),
              "per-member dropout: expected one rate per member (", members(), "), got ", member_dropout().size());
  for (const double v : member_dropout()) TORCH_CHECK(v >= 0 && v < 1, "dropout must be in [0, 1), got ", v);
  TORCH_CHECK(warmup_steps() >= 0, "warm-up steps must be >= 0, got ", warmup_steps());
  TORCH_CHECK(min_lr_factor() >= 0 && min_lr_factor() <= 1, "min lr factor must be in [0, 1], got ",
              min_lr_factor());
  TORCH_CHECK(patience() >= 0, "patience must be >= 0, got ", patience());
  TORCH_CHECK(min_variance() >= 0 && std::isfinite(min_variance()), "min variance must be >= 0 and finite, got ",
              min_variance());
  TORCH_CHECK(unroll() > 0, "unroll must be positive, got ", unroll());
}

EnsembleTrainerOptions train_defaults() {
  return EnsembleTrainerOptions().patience(50).early_stopping(EarlyStopping::kEnsemble);
}

std::string to_json(const EnsembleTrainerOptions& o) {
  const nlohmann::json j = {
      {"members", o.members()},
      {"hidden", o.hidden()},
      {"depth", o.depth()},
      {"activation", std::string(ensemble::to_string(o.activation()))},
      {"layer_norm", o.layer_norm()},
      {"dropout", o.dropout()},
      {"head", std::string(to_string(o.head()))},
      {"optimizer", std::string(to_string(o.optimizer()))},
      {"lr", o.lr()},
      {"weight_decay", o.weight_decay()},
      {"momentum", o.momentum()},
      {"member_lr", o.member_lr()},
      {"member_weight_decay", o.member_weight_decay()},
      {"member_dropout", o.member_dropout()},
      {"schedule", std::string(ensemble::to_string(o.schedule()))},
      {"warmup_steps", o.warmup_steps()},
      {"min_lr_factor", o.min_lr_factor()},
      {"epochs", o.epochs()},
      {"batch_size", o.batch_size()},
      {"order", std::string(graphs::to_string(o.order()))},
      {"patience", o.patience()},
      {"restore_best", o.restore_best()},
      {"early_stopping", std::string(to_string(o.early_stopping()))},
      {"min_variance", o.min_variance()},
      {"recalibration", std::string(to_string(o.recalibration()))},
      {"seed", o.seed()},
      {"first_member", o.first_member()},
      {"device", o.device().str()},
      {"capture", o.capture()},
      {"unroll", o.unroll()},
  };
  return j.dump();
}

EnsembleTrainerOptions options_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TORCH_CHECK(j.is_object(), "trainer options: not a JSON object");
  const nlohmann::json defaults = nlohmann::json::parse(to_json(EnsembleTrainerOptions()));
  for (const auto& [key, value] : j.items()) {
    TORCH_CHECK(defaults.contains(key), "trainer options: unknown key '", key, "'");
  }
  const auto get = [&]<typename T>(const char* key, T*) -> T {
    TORCH_CHECK(j.contains(key), "trainer options: missing key '", key, "'");
    try {
      return j.at(key).get<T>();
    } catch (const nlohmann::json::exception&) {
      TORCH_CHECK(false, "trainer options: key '", key, "' has the wrong type: ", j.at(key).dump());
    }
  };
  const auto i64 = [&](const char* key) { return get(key, static_cast<int64_t*>(nullptr)); };
  const auto f64 = [&](const char* key) { return get(key, static_cast<double*>(nullptr)); };
  const auto str = [&](const char* key) { return get(key, static_cast<std::string*>(nullptr)); };
  const auto flag = [&](const char* key) { return get(key, static_cast<bool*>(nullptr)); };
  EnsembleTrainerOptions o;
  o.members(i64("members")).hidden(i64("hidden")).depth(i64("depth"));
  o.activation(ensemble::parse_activation(str("activation"))).layer_norm(flag("layer_norm")).dropout(f64("dropout"));
  o.head(parse_head(str("head"))).optimizer(parse_optimizer(str("optimizer")));
  o.lr(f64("lr")).weight_decay(f64("weight_decay")).momentum(f64("momentum"));
  o.schedule(ensemble::parse_lr_schedule(str("schedule"))).warmup_steps(i64("warmup_steps"));
  o.min_lr_factor(f64("min_lr_factor")).epochs(i64("epochs")).batch_size(i64("batch_size"));
  o.order(graphs::parse_batch_order(str("order"))).patience(i64("patience")).restore_best(flag("restore_best"));
  o.min_variance(f64("min_variance")).seed(get("seed", static_cast<uint64_t*>(nullptr)));
  o.device(c10::Device(str("device"))).capture(flag("capture")).unroll(i64("unroll"));
  if (j.contains("first_member")) o.first_member(i64("first_member"));  // absent before member parallel
  const auto doubles = [&](const char* key) { return get(key, static_cast<std::vector<double>*>(nullptr)); };
  if (j.contains("early_stopping")) o.early_stopping(parse_early_stopping(str("early_stopping")));  // absent before it
  if (j.contains("member_lr")) o.member_lr(doubles("member_lr"));  // absent before sweeps
  if (j.contains("member_weight_decay")) o.member_weight_decay(doubles("member_weight_decay"));
  if (j.contains("member_dropout")) o.member_dropout(doubles("member_dropout"));  // absent before dropout sweeps
  // Absent before recalibration: those checkpoints predict as they were trained.
  o.recalibration(j.contains("recalibration") ? parse_recalibration(str("recalibration")) : Recalibration::kNone);
  o.validate();
  return o;
}

}  // namespace packtrain::runtime
