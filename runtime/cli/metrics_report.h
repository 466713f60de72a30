// Test metrics of a trained ensemble as a table (stdout) or JSON, shared by
// `train`, `resume` and `evaluate`.
#pragma once

#include "packtrain/runtime/trainers/ensemble_trainer.h"

#include <nlohmann/json.hpp>

#include <string>

namespace packtrain::cli {

void print_metrics(const runtime::EnsembleTrainer& trainer, const runtime::EnsembleMetrics& metrics,
                   const std::string& what);
nlohmann::json metrics_json(const runtime::EnsembleTrainer& trainer, const runtime::EnsembleMetrics& metrics);

// Metrics of members gathered from several checkpoints or ranks (member parallel),
// where no single trainer holds them all: {"members": [{member, rmse|accuracy, nll}],
// "ensemble"} and the same as a table under `title`.
nlohmann::json gathered_metrics_json(const runtime::EnsembleMetrics& metrics, runtime::Head head);
void print_gathered_metrics(const runtime::EnsembleMetrics& metrics, runtime::Head head, const std::string& title);

}  // namespace packtrain::cli
