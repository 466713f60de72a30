#include "packtrain/runtime/cli/metrics_report.h"

#include "packtrain/runtime/io/svg_plot.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace packtrain::cli {

namespace {
bool classification(const runtime::EnsembleTrainer& t) { return t.options().head() == runtime::Head::kClassification; }
std::string cell(double v) { return std::isnan(v) ? "-" : fmt::format("{:.4f}", v); }
nlohmann::json number(double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); }

// The ensemble's proper scores and calibration, then the verdict in words.
void print_calibration(const runtime::EnsembleMetrics& m, runtime::Head head) {
  std::string summary;
  if (head == runtime::Head::kClassification) {
    const runtime::ClassificationCalibration& c = m.classification;
    if (c.rows == 0) return;
    fmt::print("\n  Ensemble scores: accuracy {}, NLL {}, Brier score {}, expected calibration error {} ({} bins)\n",
               cell(c.accuracy), cell(c.nll), cell(c.brier), cell(c.ece), c.bins.size());
    summary = runtime::calibration_summary(c);
  } else {
    const runtime::RegressionCalibration& c = m.regression;
    if (c.rows == 0) return;
    fmt::print("\n  Ensemble scores: RMSE {}, NLL of the mixture {}, NLL of the moment-matched Gaussian {}, CRPS {}\n",
               cell(c.rmse), cell(c.mixture_nll), cell(c.gaussian_nll), cell(c.crps));
    summary = runtime::calibration_summary(c);
  }
  fmt::print("  Calibration:\n");
  for (size_t start = 0; start < summary.size();) {
    const size_t end = summary.find('\n', start);
    fmt::print("    {}\n", summary.substr(start, end - start));
    start = end == std::string::npos ? summary.size() : end + 1;
  }
}

nlohmann::json calibration_json(const runtime::EnsembleMetrics& m, runtime::Head head) {
  if (head == runtime::Head::kClassification) {
    const runtime::ClassificationCalibration& c = m.classification;
    nlohmann::json bins = nlohmann::json::array();
    for (const runtime::ConfidenceBin& b : c.bins) {
      bins.push_back({{"lower", b.lower},
                      {"upper", b.upper},
                      {"count", b.count},
                      {"confidence", b.confidence},
                      {"accuracy", b.accuracy}});
    }
    return {{"rows", c.rows},
            {"accuracy", number(c.accuracy)},
            {"nll", number(c.nll)},
            {"brier", number(c.brier)},
            {"ece", number(c.ece)},
            {"ece_bins", c.bins.size()},
            {"mean_confidence", number(c.mean_confidence)},
            {"reliability", bins},
            {"summary", runtime::calibration_summary(c)}};
  }
  const runtime::RegressionCalibration& c = m.regression;
  nlohmann::json intervals = nlohmann::json::array();
  for (const runtime::IntervalCoverage& i : c.intervals) {
    intervals.push_back({{"level", i.level}, {"coverage", i.coverage}, {"mean_width", i.mean_width}});
  }
  return {{"rows", c.rows},
          {"rmse", number(c.rmse)},
          {"mixture_nll", number(c.mixture_nll)},
          {"gaussian_nll", number(c.gaussian_nll)},
          {"crps", number(c.crps)},
          {"intervals", intervals},
          {"miscalibration_area", number(c.miscalibration_area)},
          {"reliability", {{"expected", c.expected}, {"observed", c.observed}}},
          {"summary", runtime::calibration_summary(c)}};
}
}  // namespace

void print_metrics(const runtime::EnsembleTrainer& trainer, const runtime::EnsembleMetrics& m,
                   const std::string& what) {
  const bool cls = classification(trainer);
  const char* first = cls ? "accuracy" : "RMSE";
  fmt::print("\n{}:\n  {:>8}  {:>10}  {:>10}  {:>9}  {}\n", what, "member", first, "NLL", "status", "best epoch");
  // The mean of the ensemble's members only (a sweep's deselected ones are shown, not counted).
  double sum_first = 0;
  int64_t usable = 0;
  for (size_t k = 0; k < m.members.size(); ++k) {
    const runtime::MemberState& s = trainer.member_states()[k];
    const double v = cls ? m.members[k].accuracy : m.members[k].rmse;
    if (s.usable) {
      sum_first += v;
      ++usable;
    }
    fmt::print("  {:>8}  {:>10}  {:>10}  {:>9}  {}\n", k, cell(v), cell(m.members[k].nll), runtime::to_string(s.status),
               s.best_epoch > 0 ? std::to_string(s.best_epoch) : "-");
  }
  const double mean_first = usable > 0 ? sum_first / static_cast<double>(usable) : std::nan("");
  fmt::print("  {:>8}  {:>10}{}\n", "mean", cell(mean_first),
             usable < static_cast<int64_t>(m.members.size())
                 ? fmt::format("   <- of the {} members in the ensemble", usable)
                 : "");
  fmt::print("  {:>8}  {:>10}  {:>10}   <- the ensemble (uniform mixture){}\n", "ensemble",
             cell(cls ? m.ensemble.accuracy : m.ensemble.rmse), cell(m.ensemble.nll),
             cls ? "" : "; NLL: its moment-matched Gaussian's");
  if (trainer.variance_scale() != 1) {
    fmt::print(
        "  Recalibrated on the validation rows: predictive variance x {:.4g} (std x {:.4g}), the mixture "
        "stretched about its mean; members shown as recalibrated (--recalibrate none: as trained)\n",
        trainer.variance_scale(), std::sqrt(trainer.variance_scale()));
  }
  print_calibration(m, trainer.options().head());
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
  nlohmann::json out{{"members", members}, {"ensemble", one(metrics.ensemble)}};
  out["calibration"] = calibration_json(metrics, head);
  return out;
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
  print_calibration(metrics, head);
}

nlohmann::json metrics_json(const runtime::EnsembleTrainer& trainer, const runtime::EnsembleMetrics& m) {
  // The gathered form plus what this trainer knows of each member.
  nlohmann::json out = gathered_metrics_json(m, trainer.options().head());
  for (size_t k = 0; k < m.members.size(); ++k) {
    const runtime::MemberState& s = trainer.member_states()[k];
    out["members"][k]["status"] = std::string(runtime::to_string(s.status));
    out["members"][k]["best_epoch"] = s.best_epoch;
    out["members"][k]["in_ensemble"] = s.usable;  // what predict, the mean and export use
  }
  if (!classification(trainer)) out["variance_scale"] = trainer.variance_scale();  // 1: as trained
  out["precision"] = std::string(ensemble::to_string(trainer.options().precision()));
  return out;
}

std::string reliability_svg(const runtime::EnsembleMetrics& m, runtime::Head head, const std::string& title) {
  runtime::PlotOptions options;
  options.title = title;
  runtime::PlotSeries observed, ideal{"calibrated", {0, 1}, {0, 1}, {}};
  if (head == runtime::Head::kClassification) {
    options.x_label = "confidence (top-class probability)";
    options.y_label = "accuracy";
    observed.name =
        fmt::format("ensemble, {} equal-width bins (ECE {:.4f})", m.classification.bins.size(), m.classification.ece);
    for (const runtime::ConfidenceBin& b : m.classification.bins) {
      if (b.count == 0) continue;
      observed.x.push_back(b.confidence);
      observed.y.push_back(b.accuracy);
    }
  } else {
    options.x_label = "central interval level";
    options.y_label = "fraction of rows inside";
    observed.name = fmt::format("ensemble mixture (miscalibration area {:.4f})", m.regression.miscalibration_area);
    observed.x = m.regression.expected;
    observed.y = m.regression.observed;
  }
  if (observed.x.empty()) throw std::invalid_argument("no rows to draw a reliability diagram of");
  return runtime::line_plot_svg({observed, ideal}, options);
}

nlohmann::json sweep_json(const std::vector<runtime::ConfigurationReport>& reports, runtime::Head head) {
  nlohmann::json out = nlohmann::json::array();
  for (const runtime::ConfigurationReport& r : reports) {
    const runtime::SweepConfiguration& c = r.configuration;
    nlohmann::json j{{"hidden", c.hidden},
                     {"lr", c.lr},
                     {"weight_decay", c.weight_decay},
                     {"dropout", c.dropout},
                     {"first_member", c.first_member},
                     {"members", c.members},
                     {"usable", r.usable},
                     {"val_loss", number(r.val_loss)}};
    if (!c.channels.empty()) j["channels"] = c.channels;
    if (!r.test.members.empty()) j["test"] = gathered_metrics_json(r.test, head)["ensemble"];
    out.push_back(j);
  }
  return out;
}

void print_sweep(const std::vector<runtime::ConfigurationReport>& reports, runtime::Head head,
                 const runtime::EnsembleTrainer& trainer) {
  const bool cls = head == runtime::Head::kClassification;
  // A channels column when the configurations differ in their cnn channels.
  const bool channels = !reports.front().configuration.channels.empty();
  size_t width = 8;
  for (const runtime::ConfigurationReport& r : reports) {
    width = std::max(width, fmt::format("{}", fmt::join(r.configuration.channels, ",")).size());
  }
  const std::string channels_header = channels ? fmt::format("  {:>{}}", "channels", width) : "";
  fmt::print(
      "\nSweep: {} configurations x {} members (validation loss: mean member {} on the validation rows; "
      "test: each configuration's members as one ensemble)\n{}  {:>6}  {:>10}  {:>12}  {:>8}  {:>10}  {:>10}  {:>10}\n",
      reports.size(), reports.front().configuration.members, head == runtime::Head::kMean ? "RMSE" : "NLL",
      channels_header, "hidden", "lr", "weight decay", "dropout", "val loss", cls ? "test acc" : "test RMSE",
      "test NLL");
  for (const runtime::ConfigurationReport& r : reports) {
    const runtime::SweepConfiguration& c = r.configuration;
    const bool kept =
        trainer.member_states()[static_cast<size_t>(c.first_member)].status != runtime::MemberStatus::kDeselected;
    const std::string channels_cell =
        channels ? fmt::format("  {:>{}}", fmt::format("{}", fmt::join(c.channels, ",")), width) : "";
    fmt::print("{}  {:>6}  {:>10g}  {:>12g}  {:>8g}  {:>10}  {:>10}  {:>10}  {}\n", channels_cell, c.hidden, c.lr,
               c.weight_decay, c.dropout, cell(r.val_loss), cell(cls ? r.test.ensemble.accuracy : r.test.ensemble.rmse),
               cell(r.test.ensemble.nll), kept ? "" : "(deselected)");
  }
}

}  // namespace packtrain::cli
