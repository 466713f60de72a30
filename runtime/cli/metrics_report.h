// Test metrics of a trained ensemble as a table (stdout) or JSON, shared by
// `train`, `resume` and `evaluate`.
#pragma once

#include "runtime/ensemble_trainer.h"

#include <nlohmann/json.hpp>

#include <string>

namespace packtrain::cli {

void print_metrics(const runtime::EnsembleTrainer& trainer, const runtime::EnsembleMetrics& metrics,
                   const std::string& what);
nlohmann::json metrics_json(const runtime::EnsembleTrainer& trainer, const runtime::EnsembleMetrics& metrics);

}  // namespace packtrain::cli
