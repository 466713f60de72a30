// Test metrics of a trained ensemble as a table (stdout) or JSON, shared by
// `train`, `resume` and `evaluate`.
#pragma once

#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "packtrain/runtime/trainers/ensemble/hyperparameter_sweep.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace packtrain::cli {

void print_metrics(const runtime::EnsembleTrainer& trainer, const runtime::EnsembleMetrics& metrics,
                   const std::string& what);
nlohmann::json metrics_json(const runtime::EnsembleTrainer& trainer, const runtime::EnsembleMetrics& metrics);

// Metrics of members gathered from several checkpoints or ranks (member parallel),
// where no single trainer holds them all: {"members": [{member, rmse|accuracy, nll}],
// "ensemble"} and the same as a table under `title`.
nlohmann::json gathered_metrics_json(const runtime::EnsembleMetrics& metrics, runtime::Head head);
void print_gathered_metrics(const runtime::EnsembleMetrics& metrics, runtime::Head head, const std::string& title);

// The ensemble's reliability diagram as an SVG document: observed against expected
// coverage of its central intervals (regression), accuracy against confidence per
// non-empty bin (classification), with the diagonal a calibrated model follows.
std::string reliability_svg(const runtime::EnsembleMetrics& metrics, runtime::Head head, const std::string& title);

// A sweep's configurations (runtime/trainers/ensemble/hyperparameter_sweep.h): one JSON object
// each, and the same as a table with the deselected ones marked.
nlohmann::json sweep_json(const std::vector<runtime::ConfigurationReport>& reports, runtime::Head head);
void print_sweep(const std::vector<runtime::ConfigurationReport>& reports, runtime::Head head,
                 const runtime::EnsembleTrainer& trainer);

}  // namespace packtrain::cli
