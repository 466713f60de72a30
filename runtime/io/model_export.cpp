#include "packtrain/runtime/io/model_export.h"

#include "packtrain/base/user_error.h"
#include "packtrain/ensemble/pack.h"
#include "packtrain/runtime/io/checkpoint_file.h"

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/pooling.h>

#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <variant>
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

std::vector<int64_t> member_ids(const ensemble::PackedModel& pack, const std::vector<int64_t>& members) {
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

// The pack's input and output widths, whatever its architecture.
struct Widths {
  int64_t in_features, out_features;
};

void validate_regression(const Widths& o, const ExportExtras& e) {
  TORCH_CHECK(e.y_mean.defined() && e.y_std.defined(), "export: a '", e.head,
              "' head needs extras.y_mean and extras.y_std (the target standardization)");
  const int64_t targets = e.y_mean.numel();
  check_size(e.y_std, "y_std", targets);
  const int64_t outputs = e.head == "gaussian" ? 2 * targets : targets;
  TORCH_CHECK(o.out_features == outputs, "export: a '", e.head, "' head over ", targets, " targets needs ", outputs,
              " outputs, the pack has ", o.out_features);
  TORCH_CHECK(e.min_variance >= 0, "export: min_variance must be >= 0, got ", e.min_variance);
  TORCH_CHECK(e.variance_scale > 0 && std::isfinite(e.variance_scale),
              "export: variance_scale must be positive and "
              "finite, got ",
              e.variance_scale);
}

void validate(const Widths& o, const ExportExtras& e) {
  TORCH_CHECK(e.head == "mean" || e.head == "gaussian" || e.head == "classification", "export: unknown head '", e.head,
              "' (expected mean, gaussian or classification)");
  check_size(e.x_mean, "x_mean", o.in_features);
  check_size(e.x_std, "x_std", o.in_features);
  TORCH_CHECK(e.feature_names.empty() || static_cast<int64_t>(e.feature_names.size()) == o.in_features,
              "export: ", e.feature_names.size(), " feature names for ", o.in_features, " input features");
  if (e.head != "classification") return validate_regression(o, e);
  TORCH_CHECK(static_cast<int64_t>(e.classes.size()) == o.out_features, "export: ", e.classes.size(),
              " class labels for a classifier with ", o.out_features, " outputs");
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

// Everything but the members, the architecture and the format tag.
void insert_extras(Dict& d, const std::vector<int64_t>& ids, const ExportExtras& e) {
  List member_list = new_list(), names = new_list(), classes = new_list();
  for (const int64_t k : ids) member_list.push_back(k);
  for (const auto& name : e.feature_names) names.push_back(name);
  for (const double c : e.classes) classes.push_back(c);
  d.insert("member_ids", member_list);
  insert_standardization(d, e);
  d.insert("head", e.head);
  d.insert("min_variance", e.min_variance);
  d.insert("feature_names", names);
  d.insert("classes", classes);
  d.insert("variance_scale", e.variance_scale);
  d.insert("precision", e.precision);
}

Dict export_dict(const ensemble::PackedMLP& pack, const std::vector<int64_t>& ids, const ExportExtras& e) {
  List members = new_list();
  for (const int64_t k : ids) members.push_back(member_state_dict(pack, k));
  Dict d = new_dict();
  d.insert("format", std::string("packtrain-export-1"));
  d.insert("members", members);
  Dict arch = architecture(pack.options());
  if (!pack.options().member_hidden().empty()) {  // members of different widths: each one's, in members' order
    List widths = new_list();
    for (const int64_t k : ids) widths.push_back(pack.options().member_width(k));
    arch.insert("member_hidden", widths);
  }
  d.insert("architecture", arch);
  insert_extras(d, ids, e);
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

// Layers described by the torch.nn class name and the keyword arguments that build
// it in Python: torch.nn.<type>(**args).
List ints(c10::ArrayRef<int64_t> values) {
  List l = new_list();
  for (const int64_t v : values) l.push_back(v);
  return l;
}

// A layer: {"type": type, "args": {name: value, ...}}.
Dict layer(const std::string& type, std::initializer_list<std::pair<const char*, IValue>> args = {}) {
  Dict a = new_dict();
  for (const auto& [name, value] : args) a.insert(name, value);
  Dict d = new_dict();
  d.insert("type", type);
  d.insert("args", a);
  return d;
}

template <size_t D, typename Impl>
Dict describe_conv(const char* type, const Impl& conv) {
  const auto& o = conv.options;
  TORCH_CHECK(std::holds_alternative<torch::ExpandingArray<D>>(o.padding()) &&
                  std::holds_alternative<torch::enumtype::kZeros>(o.padding_mode()),
              "export: a ", type, " with padding other than zeros of explicit sizes is not described yet");
  return layer(type, {{"in_channels", o.in_channels()},
                      {"out_channels", o.out_channels()},
                      {"kernel_size", ints(*o.kernel_size())},
                      {"stride", ints(*o.stride())},
                      {"padding", ints(*std::get<torch::ExpandingArray<D>>(o.padding()))},
                      {"dilation", ints(*o.dilation())},
                      {"groups", o.groups()},
                      {"bias", o.bias()}});
}

template <typename Impl>
Dict describe_max_pool(const char* type, const Impl& pool) {
  const auto& o = pool.options;
  return layer(type, {{"kernel_size", ints(*o.kernel_size())},
                      {"stride", ints(*o.stride())},
                      {"padding", ints(*o.padding())},
                      {"dilation", ints(*o.dilation())},
                      {"ceil_mode", o.ceil_mode()}});
}

template <typename Impl>
Dict describe_avg_pool(const char* type, const Impl& pool) {
  const auto& o = pool.options;
  TORCH_CHECK(!o.divisor_override().has_value(), "export: an ", type, " with divisor_override is not described yet");
  return layer(type, {{"kernel_size", ints(*o.kernel_size())},
                      {"stride", ints(*o.stride())},
                      {"padding", ints(*o.padding())},
                      {"ceil_mode", o.ceil_mode()},
                      {"count_include_pad", o.count_include_pad()}});
}

// The layers a member's torch::nn::Sequential is made of; nullopt for another kind.
std::optional<Dict> describe(const torch::nn::Module& m) {
  namespace nn = torch::nn;
  if (const auto* u = dynamic_cast<const nn::UnflattenImpl*>(&m)) {
    TORCH_CHECK(u->options.dimname().empty(), "export: a named Unflatten is not described");
    return layer("Unflatten", {{"dim", u->options.dim()}, {"unflattened_size", ints(u->options.sizes())}});
  }
  if (const auto* f = dynamic_cast<const nn::FlattenImpl*>(&m)) {
    return layer("Flatten", {{"start_dim", f->options.start_dim()}, {"end_dim", f->options.end_dim()}});
  }
  if (const auto* c = dynamic_cast<const nn::Conv1dImpl*>(&m)) return describe_conv<1>("Conv1d", *c);
  if (const auto* c = dynamic_cast<const nn::Conv2dImpl*>(&m)) return describe_conv<2>("Conv2d", *c);
  if (const auto* p = dynamic_cast<const nn::MaxPool1dImpl*>(&m)) return describe_max_pool("MaxPool1d", *p);
  if (const auto* p = dynamic_cast<const nn::MaxPool2dImpl*>(&m)) return describe_max_pool("MaxPool2d", *p);
  if (const auto* p = dynamic_cast<const nn::AvgPool1dImpl*>(&m)) return describe_avg_pool("AvgPool1d", *p);
  if (const auto* p = dynamic_cast<const nn::AvgPool2dImpl*>(&m)) return describe_avg_pool("AvgPool2d", *p);
  if (const auto* g = dynamic_cast<const nn::GroupNormImpl*>(&m)) {
    const auto& o = g->options;
    return layer(
        "GroupNorm",
        {{"num_groups", o.num_groups()}, {"num_channels", o.num_channels()}, {"eps", o.eps()}, {"affine", o.affine()}});
  }
  if (const auto* n = dynamic_cast<const nn::LayerNormImpl*>(&m)) {
    const auto& o = n->options;
    return layer("LayerNorm", {{"normalized_shape", ints(o.normalized_shape())},
                               {"eps", o.eps()},
                               {"elementwise_affine", o.elementwise_affine()}});
  }
  if (const auto* l = dynamic_cast<const nn::LinearImpl*>(&m)) {
    const auto& o = l->options;
    return layer("Linear", {{"in_features", o.in_features()}, {"out_features", o.out_features()}, {"bias", o.bias()}});
  }
  if (const auto* d = dynamic_cast<const nn::DropoutImpl*>(&m)) return layer("Dropout", {{"p", d->options.p()}});
  if (dynamic_cast<const nn::ReLUImpl*>(&m) != nullptr) return layer("ReLU");
  if (dynamic_cast<const nn::GELUImpl*>(&m) != nullptr) return layer("GELU");
  if (dynamic_cast<const nn::SiLUImpl*>(&m) != nullptr) return layer("SiLU");
  if (dynamic_cast<const nn::TanhImpl*>(&m) != nullptr) return layer("Tanh");
  return std::nullopt;
}

// Member k's standalone torch::nn::Sequential: its layers (List) and its state_dict.
std::pair<List, Dict> describe_member(const ensemble::PackedModel& pack, int64_t member) {
  const ensemble::StandaloneMember standalone = pack.standalone_member(member);
  const auto* seq = dynamic_cast<const torch::nn::SequentialImpl*>(standalone.module.get());
  if (seq == nullptr) {
    throw UserError(fmt::format(
        "export describes members built as one torch.nn.Sequential; a {} member is not one (predict and evaluate "
        "read its checkpoint)",
        pack.kind()));
  }
  List layers = new_list();
  for (size_t i = 0; i < seq->size(); ++i) {
    const std::shared_ptr<torch::nn::Module> m = seq->ptr(i);
    std::optional<Dict> d = describe(*m);
    if (!d) {
      throw UserError(fmt::format(
          "export cannot describe layer {} ({}) of a {} member for torch.nn yet (predict and evaluate read its "
          "checkpoint)",
          i, m->name(), pack.kind()));
    }
    layers.push_back(*d);
  }
  Dict state = new_dict();
  for (const auto& item : seq->named_parameters()) state.insert(item.key(), owned_cpu(item.value(), at::kFloat));
  for (const auto& item : seq->named_buffers()) state.insert(item.key(), owned_cpu(item.value(), at::kFloat));
  return {layers, state};
}

}  // namespace

void export_layers_for_pytorch(const std::filesystem::path& path, const ensemble::PackedModel& pack,
                               const LayerExportShape& shape, const std::vector<int64_t>& members,
                               const ExportExtras& extras) {
  int64_t in_features = 1;
  for (const int64_t s : shape.input_shape) in_features *= s;
  validate({in_features, shape.out_features}, extras);
  const std::vector<int64_t> ids = member_ids(pack, members);
  // Each member's own layers: a sweep's members differ in their dropout rates, a
  // pack of different widths in their sizes.
  List states = new_list(), layers = new_list();
  for (const int64_t k : ids) {
    auto [member_layers, state] = describe_member(pack, k);
    layers.push_back(member_layers);
    states.push_back(state);
  }
  Dict arch = new_dict();
  arch.insert("kind", std::string(pack.kind()));
  arch.insert("in_features", in_features);
  arch.insert("out_features", shape.out_features);
  arch.insert("input_shape", ints(shape.input_shape));
  arch.insert("member_layers", layers);
  Dict d = new_dict();
  d.insert("format", std::string(kLayersExportFormat));
  d.insert("members", states);
  d.insert("architecture", arch);
  insert_extras(d, ids, extras);
  write_file_atomically(path, torch_load_zip(d));
}

void export_for_pytorch(const std::filesystem::path& path, const ensemble::PackedMLP& pack,
                        const std::vector<int64_t>& members, const ExportExtras& extras) {
  validate({pack.options().in_features(), pack.options().out_features()}, extras);
  const std::vector<int64_t> ids = member_ids(pack, members);
  write_file_atomically(path, torch_load_zip(export_dict(pack, ids, extras)));
}

}  // namespace packtrain::runtime
