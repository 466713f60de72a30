#include "packtrain/runtime/trainers/ensemble_export.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/io/model_export.h"
#include "packtrain/runtime/trainers/ensemble_trainer.h"

#include <fmt/format.h>

namespace packtrain::runtime {

void export_members(const std::string& path, const EnsembleTrainer& trainer,
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
  for (int64_t k : members) {
    if (k < 0 || k >= trainer.options().members()) {
      throw DataError(fmt::format("member {} does not exist (the pack has members 0..{})", k,
                                   trainer.options().members() - 1));
    }
  }
  export_for_pytorch(path, trainer.model(), members, extras);
}

}  // namespace packtrain::runtime
