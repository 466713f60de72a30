// Export of a trained pack for Python PyTorch: one file that `torch.load(path)`
// reads with its default weights_only=True, holding each member's
// torch.nn.Sequential state_dict plus what is needed to reproduce predictions.
// scripts/load_packtrain_export.py rebuilds the members and predicts.
#pragma once

#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/ensemble/packed_model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace packtrain::runtime {

// What a Python user needs besides the weights to reproduce predictions.
struct ExportExtras {
  at::Tensor x_mean, x_std;    // (I) feature standardization: original = standardized * std + mean
  at::Tensor y_mean, y_std;    // (T) target standardization (regression); undefined for classification
  std::string head;            // "mean", "gaussian" or "classification"
  double min_variance = 1e-6;  // gaussian head: variance = softplus(raw) + min_variance (standardized units)
  std::vector<std::string> feature_names;  // (I) or empty
  std::vector<double> classes;             // classification: the original label value of each class index (O)
  // Regression: the ensemble's recalibration (runtime/trainers/uncertainty/variance_calibration.h),
  // fitted to the members it predicts with; 1: none.
  double variance_scale = 1.0;
  // The arithmetic the members trained in ("fp32" or "bf16-mixed", ensemble/precision.h):
  // the loader predicts in it.
  std::string precision = "fp32";
};

// Writes, atomically (write_file_atomically), a dict torch.load reads with
// weights_only=True:
//   "format": "packtrain-export-1"
//   "members": [state_dict, ...]   one per listed member: name -> CPU float32 tensor,
//              named as torch.nn.Sequential(...).state_dict() names them ("0.weight" (O, I), "0.bias" (O))
//   "member_ids": [int, ...]
//   "architecture": {"in_features", "out_features", "hidden", "depth",
//                    "activation" ("relu"/"gelu"/"silu"/"tanh"), "layer_norm": bool, "dropout": float}
//   "x_mean", "x_std", "y_mean", "y_std": float64 tensors ("y_*" omitted when undefined)
//   "head", "min_variance", "feature_names", "classes", "variance_scale", "precision"
// `members` empty exports all. Throws naming the offending value for an unknown
// head, a member out of range, or extras whose sizes do not match the pack.
void export_for_pytorch(const std::filesystem::path& path, const ensemble::PackedMLP& pack,
                        const std::vector<int64_t>& members, const ExportExtras& extras);

// Members of any other architecture whose standalone member (PackedModel::
// standalone_member) is one torch::nn::Sequential — the cnn's Unflatten, Conv1d/Conv2d,
// GroupNorm, ReLU, MaxPool/AvgPool, Flatten, Linear, Dropout — as a layer list that
// Python rebuilds with torch.nn.<type>(**args):
//   "format": kLayersExportFormat
//   "architecture": {"kind" (the pack's, "cnn"), "in_features", "out_features",
//                    "input_shape" [C, H, W] or [C, L],
//                    "member_layers": [[{"type": "Conv2d", "args": {"in_channels": ..., ...}}, ...], ...]}
//                    (one layer list per member, in members' order)
//   "members": [state_dict, ...] (parameters and buffers, CPU float32, the Sequential's names)
// and the other keys as export_for_pytorch. Rows (B, I) enter the first layer
// (Unflatten to the sample shape). A UserError names a layer this cannot describe yet.
inline constexpr const char* kLayersExportFormat = "packtrain-export-2";
struct LayerExportShape {
  std::vector<int64_t> input_shape;  // one sample's shape; I = its product
  int64_t out_features = 1;          // O
};
void export_layers_for_pytorch(const std::filesystem::path& path, const ensemble::PackedModel& pack,
                               const LayerExportShape& shape, const std::vector<int64_t>& members,
                               const ExportExtras& extras);

}  // namespace packtrain::runtime
