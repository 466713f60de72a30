#include "packtrain/runtime/cli/metrics_report.h"

#include <fmt/format.h>

#include <cmath>

namespace packtrain::cli {

namespace {
bool classification(const runtime::EnsembleTrainer& t) { return t.options().head() == runtime::Head::kClassification; }
std::string cell(double v) { return std::isnan(v) ? "-" : fmt::format("{:.4f}", v); }
nlohmann::json number(double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); }
}  // namespace

void print_metrics(const runtime::EnsembleTrainer& trainer, const runtime::EnsembleMetrics& m, const std::string& what) {
  const bool cls = classification(trainer);
  const char* first = cls ? "accuracy" : "RMSE";
  fmt::print("\n{}:\n  {:>8}  {:>10}  {:>10}  {:>9}  {}\n", what, "member", first, "NLL", "status", "best epoch");
  double mean_first = 0;
  for (size_t k = 0; k < m.members.size(); ++k) {
    const runtime::MemberState& s = trainer.member_states()[k];
    const double v = cls ? m.members[k].accuracy : m.members[k].rmse;
    mean_first += v / static_cast<double>(m.members.size());
    fmt::print("  {:>8}  {:>10}  {:>10}  {:>9}  {}\n", k, cell(v), cell(m.members[k].nll), runtime::to_string(s.status),
               s.best_epoch > 0 ? std::to_string(s.best_epoch) : "-");
  }
  fmt::print("  {:>8}  {:>10}\n", "mean", cell(mean_first));
  fmt::print("  {:>8}  {:>10}  {:>10}   <- the ensemble (uniform mixture)\n", "ensemble",
             cell(cls ? m.ensemble.accuracy : m.ensemble.rmse), cell(m.ensemble.nll));
}

nlohmann::json gathered_metrics_json(const runtime::EnsembleMetrics& metrics, runtime::Head head) {
  const bool cls = head == runtime::Head::kClassification;
  const auto one = [&](const runtime::Metrics& x) {
    return cls ? nlohmann::json{{"accuracy", number(x.accuracy)}, {"nll", number(x.nll)}}
               : nlohmann::json{{"rmse", number(x.rmse)}, {"nll", number(x.nll)}};
  };
  nlohmann::json members = nlohmann::json::array();
  for (size_t k = 0; k < metrics.members.size(); ++k) {
    nlohmann::json j = one(metrics.members[k]);
    j["member"] = k;
    members.push_back(j);
  }
  return {{"members", members}, {"ensemble", one(metrics.ensemble)}};
}

void print_gathered_metrics(const runtime::EnsembleMetrics& metrics, runtime::Head head, const std::string& title) {
  const bool cls = head == runtime::Head::kClassification;
  const char* first = cls ? "accuracy" : "RMSE";
  const auto value = [&](const runtime::Metrics& x) { return cell(cls ? x.accuracy : x.rmse); };
  fmt::print("{}:\n", title);
  for (size_t k = 0; k < metrics.members.size(); ++k) {
    fmt::print("  member {:>3}  {} {}  NLL {}\n", k, first, value(metrics.members[k]), cell(metrics.members[k].nll));
  }
  fmt::print("  ensemble    {} {}  NLL {}\n", first, value(metrics.ensemble), cell(metrics.ensemble.nll));
}

nlohmann::json metrics_json(const runtime::EnsembleTrainer& trainer, const runtime::EnsembleMetrics& m) {
  // The gathered form plus what this trainer knows of each member.
  nlohmann::json out = gathered_metrics_json(m, trainer.options().head());
  for (size_t k = 0; k < m.members.size(); ++k) {
    const runtime::MemberState& s = trainer.member_states()[k];
    out["members"][k]["status"] = std::string(runtime::to_string(s.status));
    out["members"][k]["best_epoch"] = s.best_epoch;
  }
  return out;
}

}  // namespace packtrain::cli
