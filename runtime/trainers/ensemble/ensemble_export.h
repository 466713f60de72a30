// An ensemble trainer's members written for Python PyTorch: the members' weights
// with the standardization, head, feature names and classes a user needs to
// predict with them (file format: runtime/io/model_export.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace packtrain::runtime {
class EnsembleTrainer;

// Writes `members` (when empty: the ensemble's members — those predict uses, so a
// sweep's deselected configurations are left out); returns how many it wrote.
// DataError naming a member the pack lacks or one that is not in the ensemble.
int64_t export_members(const std::string& path, const EnsembleTrainer& trainer,
                       const std::vector<std::string>& feature_names, const std::vector<int64_t>& members);

}  // namespace packtrain::runtime
