#include "packtrain/runtime/io/model_export.h"

#include "packtrain/ensemble/pack.h"
#include "packtrain/runtime/io/checkpoint_file.h"

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/nn/modules/container/sequential.h>

#include <cmath>
#include <string>
#include <vector>

// Why not torch::pickle_save: it writes torch.save's zip layout, but wraps every
// dict and list in a `torch.jit._pickle.restore_type_tag` call (and int, float,
// bool and tensor lists in `torch.jit._pickle.build_*list`) so C++ can restore
// TorchScript types. torch.load's default weights_only=True unpickler refuses those
// globals ("Unsupported global: GLOBAL torch.jit._pickle.restore_type_tag"), so a
// pickle_save file loads in Python only with weights_only=False. (Checked with
// torch 2.11; torch::serialize::OutputArchive is a TorchScript module archive that
// torch.load does not read at all.) So this file uses the same Pickler and zip
// writer with tag_aggregates=false, and builds every list with element type Any so
// it is pickled as a plain Python list. What remains — dicts, lists, str, int,
// float, bool and tensors rebuilt by torch._utils._rebuild_tensor_v2 — is exactly
// what weights_only=True accepts.

namespace packtrain::runtime {

namespace {

using c10::IValue;
using Dict = c10::impl::GenericDict;
using List = c10::impl::GenericList;

Dict new_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }
List new_list() { return List(c10::AnyType::get()); }

// A fresh, contiguous, CPU copy that owns its storage: the pickler writes whole
// storages, so a view would drag its base tensor into the file.
at::Tensor owned_cpu(const at::Tensor& t, c10::ScalarType dtype) {
  return t.detach().to(at::TensorOptions().device(at::kCPU).dtype(dtype), /*non_blocking=*/false,
                       /*copy=*/true, at::MemoryFormat::Contiguous);
}

std::vector<int64_t> member_ids(const ensemble::PackedMLP& pack, const std::vector<int64_t>& members) {
  if (members.empty()) {
    std::vector<int64_t> all(static_cast<size_t>(pack.members()));
    for (size_t k = 0; k < all.size(); ++k) all[k] = static_cast<int64_t>(k);
    return all;
  }
  for (const int64_t k : members) {
    TORCH_CHECK(k >= 0 && k < pack.members(), "export: member ", k, " out of range for a pack of ", pack.members(),
                " members");
  }
  return members;
}

void check_size(const at::Tensor& t, const char* name, int64_t expected) {
  TORCH_CHECK(t.defined(), "export: extras.", name, " is required");
  TORCH_CHECK(t.numel() == expected, "export: extras.", name, " has ", t.numel(), " elements, expected ", expected);
}

void validate_regression(const ensemble::PackedMLPOptions& o, const ExportExtras& e) {
  TORCH_CHECK(e.y_mean.defined() && e.y_std.defined(), "export: a '", e.head,
              "' head needs extras.y_mean and extras.y_std (the target standardization)");
  const int64_t targets = e.y_mean.numel();
  check_size(e.y_std, "y_std", targets);
  const int64_t outputs = e.head == "gaussian" ? 2 * targets : targets;
  TORCH_CHECK(o.out_features() == outputs, "export: a '", e.head, "' head over ", targets, " targets needs ", outputs,
              " outputs, the pack has ", o.out_features());
  TORCH_CHECK(e.min_variance >= 0, "export: min_variance must be >= 0, got ", e.min_variance);
  TORCH_CHECK(e.variance_scale > 0 && std::isfinite(e.variance_scale),
              "export: variance_scale must be positive and "
              "finite, got ",
              e.variance_scale);
}

void validate(const ensemble::PackedMLPOptions& o, const ExportExtras& e) {
  TORCH_CHECK(e.head == "mean" || e.head == "gaussian" || e.head == "classification", "export: unknown head '", e.head,
              "' (expected mean, gaussian or classification)");
  check_size(e.x_mean, "x_mean", o.in_features());
  check_size(e.x_std, "x_std", o.in_features());
  TORCH_CHECK(e.feature_names.empty() || static_cast<int64_t>(e.feature_names.size()) == o.in_features(),
              "export: ", e.feature_names.size(), " feature names for ", o.in_features(), " input features");
  if (e.head != "classification") return validate_regression(o, e);
  TORCH_CHECK(static_cast<int64_t>(e.classes.size()) == o.out_features(), "export: ", e.classes.size(),
              " class labels for a classifier with ", o.out_features(), " outputs");
}

// Member k as torch.nn.Sequential(...).state_dict() would hold it.
Dict member_state_dict(const ensemble::PackedMLP& pack, int64_t member) {
  const torch::nn::Sequential seq = ensemble::unpack(pack, member);
  Dict state = new_dict();
  for (const auto& item : seq->named_parameters()) state.insert(item.key(), owned_cpu(item.value(), at::kFloat));
  return state;
}

Dict architecture(const ensemble::PackedMLPOptions& o) {
  Dict a = new_dict();
  a.insert("in_features", o.in_features());
  a.insert("out_features", o.out_features());
  a.insert("hidden", o.hidden());
  a.insert("depth", o.depth());
  a.insert("activation", std::string(ensemble::to_string(o.activation())));
  a.insert("layer_norm", o.layer_norm());
  a.insert("dropout", o.dropout());
  return a;
}

void insert_standardization(Dict& d, const ExportExtras& e) {
  d.insert("x_mean", owned_cpu(e.x_mean.reshape(-1), at::kDouble));
  d.insert("x_std", owned_cpu(e.x_std.reshape(-1), at::kDouble));
  if (e.y_mean.defined()) d.insert("y_mean", owned_cpu(e.y_mean.reshape(-1), at::kDouble));
  if (e.y_std.defined()) d.insert("y_std", owned_cpu(e.y_std.reshape(-1), at::kDouble));
}

Dict export_dict(const ensemble::PackedMLP& pack, const std::vector<int64_t>& ids, const ExportExtras& e) {
  List members = new_list(), member_list = new_list(), names = new_list(), classes = new_list();
  for (const int64_t k : ids) {
    members.push_back(member_state_dict(pack, k));
    member_list.push_back(k);
  }
  for (const auto& name : e.feature_names) names.push_back(name);
  for (const double c : e.classes) classes.push_back(c);
  Dict d = new_dict();
  d.insert("format", std::string("packtrain-export-1"));
  d.insert("members", members);
  d.insert("member_ids", member_list);
  Dict arch = architecture(pack.options());
  if (!pack.options().member_hidden().empty()) {  // members of different widths: each one's, in members' order
    List widths = new_list();
    for (const int64_t k : ids) widths.push_back(pack.options().member_width(k));
    arch.insert("member_hidden", widths);
  }
  d.insert("architecture", arch);
  insert_standardization(d, e);
  d.insert("head", e.head);
  d.insert("min_variance", e.min_variance);
  d.insert("feature_names", names);
  d.insert("classes", classes);
  d.insert("variance_scale", e.variance_scale);
  return d;
}

// torch.save's zip layout (archive/data.pkl, archive/data/<i> per storage), as
// torch::pickle_save writes it, but pickled without type tags (see the top).
std::string torch_load_zip(const IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t n) { pickle.insert(pickle.end(), data, data + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::string zip;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    zip.append(static_cast<const char*>(data), n);
    return n;
  });
  const std::vector<at::Tensor>& storages = pickler.tensorData();
  for (size_t i = 0; i < storages.size(); ++i) {
    const auto bytes = torch::jit::getWriteableTensorData(storages[i]);
    writer.writeRecord("data/" + std::to_string(i), bytes.data(), bytes.sizeInBytes());
  }
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  writer.writeEndOfFile();
  return zip;
}

}  // namespace

void export_for_pytorch(const std::filesystem::path& path, const ensemble::PackedMLP& pack,
                        const std::vector<int64_t>& members, const ExportExtras& extras) {
  validate(pack.options(), extras);
  const std::vector<int64_t> ids = member_ids(pack, members);
  write_file_atomically(path, torch_load_zip(export_dict(pack, ids, extras)));
}

}  // namespace packtrain::runtime
