#include "packtrain/runtime/trainers/ensemble/ensemble_export.h"

#include "packtrain/ensemble/packed_cnn.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/io/model_export.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"

#include <fmt/format.h>

namespace packtrain::runtime {

int64_t export_members(const std::string& path, const EnsembleTrainer& trainer,
                       const std::vector<std::string>& feature_names, const std::vector<int64_t>& members) {
  ExportExtras extras;
  extras.x_mean = trainer.x_scale().mean;
  extras.x_std = trainer.x_scale().std;
  extras.y_mean = trainer.y_scale().mean;
  extras.y_std = trainer.y_scale().std;
  extras.head = std::string(to_string(trainer.options().head()));
  extras.min_variance = trainer.options().min_variance();
  extras.feature_names = feature_names;
  extras.classes = trainer.classes();
  extras.variance_scale = trainer.variance_scale();
  extras.precision = std::string(ensemble::to_string(trainer.options().precision()));
  const std::vector<MemberState>& states = trainer.member_states();
  for (int64_t k : members) {
    if (k < 0 || k >= trainer.options().members()) {
      throw DataError(
          fmt::format("member {} does not exist (the pack has members 0..{})", k, trainer.options().members() - 1));
    }
    const MemberState& m = states[static_cast<size_t>(k)];
    if (!m.usable) {
      throw DataError(fmt::format(
          "member {} is not part of the ensemble ({}{}): export its usable members", k, to_string(m.status),
          m.status == MemberStatus::kDeselected ? ": the sweep kept another configuration" : " with no good weights"));
    }
  }
  // The ensemble every reader sees: predict, evaluate and the export hold the same
  // members (a sweep's deselected configurations and members that diverged before any
  // good epoch are left out).
  std::vector<int64_t> chosen = members;
  if (chosen.empty()) {
    for (size_t k = 0; k < states.size(); ++k) {
      if (states[k].usable) chosen.push_back(static_cast<int64_t>(k));
    }
    if (chosen.empty()) throw DataError("every member diverged: there is no usable member to export");
  }
  // MLP members: Linear layers as export format 1 has always described them
  // (scripts/load_packtrain_export.py). Convolutional members: their standalone
  // torch::nn::Sequential, layer by layer (format 2). Another architecture's pack
  // stays a checkpoint.
  if (const auto* cnn = dynamic_cast<const ensemble::PackedCNN*>(&trainer.model())) {
    export_layers_for_pytorch(path, *cnn, {cnn->options().input_shape(), cnn->options().out_features()}, chosen,
                              extras);
    return static_cast<int64_t>(chosen.size());
  }
  const auto* mlp = dynamic_cast<const ensemble::PackedMLP*>(&trainer.model());
  if (mlp == nullptr) {
    throw DataError("export writes MLP and CNN members only: this ensemble's members are " +
                    std::string(trainer.model().kind()) + " (predict and evaluate read its checkpoint)");
  }
  export_for_pytorch(path, *mlp, chosen, extras);
  return static_cast<int64_t>(chosen.size());
}

}  // namespace packtrain::runtime
