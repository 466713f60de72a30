// The Python export: Python PyTorch, through scripts/load_packtrain_export.py,
// reproduces each exported member's outputs and the ensemble's predictions
// computed here in C++; and the file holds the documented keys.
#include "packtrain/runtime/io/model_export.h"

#include "packtrain/ensemble/packed_loss.h"
#include "packtrain/ensemble/packed_mlp.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#ifndef PACKTRAIN_PYTHON
#define PACKTRAIN_PYTHON ""
#endif

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct ExportCase {
  std::string name;
  ensemble::Activation activation;
  bool layer_norm;
  double dropout;  // exported members run in eval mode: dropout is the identity
  std::string head;
  int64_t out_features;
};

// Names the case in gtest's messages (instead of its bytes).
void PrintTo(const ExportCase& c, std::ostream* os) { *os << c.name; }

constexpr int64_t kMembers = 3, kIn = 4, kBatch = 5;

ensemble::PackedMLP perturbed_pack(const ExportCase& c) {
  ensemble::PackedMLP pack(ensemble::PackedMLPOptions(kIn, c.out_features)
                               .members(kMembers)
                               .hidden(8)
                               .depth(2)
                               .activation(c.activation)
                               .layer_norm(c.layer_norm)
                               .dropout(c.dropout)
                               .seed(7));
  // Away from initialization, so LayerNorm's weights are not all 1 and its biases
  // not all 0, and a mix-up of parameters shows.
  at::NoGradGuard no_grad;
  at::manual_seed(11);
  const at::Tensor& flat = pack.parameters().flat();
  flat.add_(at::randn_like(flat) * 0.3);
  pack.train(false);
  return pack;
}

ExportExtras extras_for(const ExportCase& c) {
  at::manual_seed(13);
  ExportExtras e;
  e.x_mean = at::randn({kIn}, at::kDouble) * 3;
  e.x_std = at::rand({kIn}, at::kDouble) + 0.5;
  e.head = c.head;
  e.min_variance = 1e-4;
  e.feature_names = {"alpha", "beta", "gamma", "delta"};
  if (c.head == "classification") {
    for (int64_t k = 0; k < c.out_features; ++k) e.classes.push_back(2.0 + 3.0 * static_cast<double>(k));
    return e;
  }
  const int64_t targets = c.head == "gaussian" ? c.out_features / 2 : c.out_features;
  e.y_mean = at::randn({targets}, at::kDouble) * 10;
  e.y_std = at::rand({targets}, at::kDouble) * 2 + 0.5;
  return e;
}

// The ensemble's prediction from raw outputs (K, B, O): (B, 2T), mean then std,
// as packtrain computes it (gaussian: the members' mixture; EnsembleTrainer::predict).
at::Tensor expected_predictions(const at::Tensor& raw, const ExportExtras& e) {
  const at::Tensor out = raw.to(at::kDouble);
  if (e.head == "classification") {
    const at::Tensor p = out.softmax(-1);
    return at::cat({p.mean(0), at::std(p, {0}, /*unbiased=*/false)}, 1);
  }
  if (e.head == "mean") {
    const at::Tensor m = out * e.y_std + e.y_mean;
    return at::cat({m.mean(0), at::std(m, {0}, /*unbiased=*/false)}, 1);
  }
  const auto head = ensemble::gaussian_head(out, e.min_variance);
  const at::Tensor m = head.mean * e.y_std + e.y_mean;
  const at::Tensor v = head.variance * e.y_std.square();
  const at::Tensor mean = m.mean(0);
  const at::Tensor variance = ((v + m.square()).mean(0) - mean.square()).clamp_min(0);
  return at::cat({mean, variance.sqrt()}, 1);
}

void write_csv(const fs::path& path, const at::Tensor& matrix) {
  const at::Tensor m = matrix.to(at::kDouble).contiguous();
  std::ofstream out(path);
  out.precision(17);
  for (int64_t r = 0; r < m.size(0); ++r) {
    for (int64_t c = 0; c < m.size(1); ++c) out << (c ? "," : "") << m[r][c].item<double>();
    out << "\n";
  }
}

struct CommandResult {
  int exit_status = -1;
  std::string output;  // stdout and stderr
};

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  while (const size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) result.output.append(buffer, n);
  const int status = ::pclose(pipe);
  if (WIFEXITED(status)) result.exit_status = WEXITSTATUS(status);
  return result;
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

// The Python with torch and numpy ($PACKTRAIN_TEST_PYTHON, else the one the build
// found) and the source tree holding the scripts ($PACKTRAIN_SOURCE_DIR, else this one).
std::string test_python() { return packtrain::testing::env_or("PACKTRAIN_TEST_PYTHON", PACKTRAIN_PYTHON); }
fs::path source_tree() { return packtrain::testing::env_or("PACKTRAIN_SOURCE_DIR", PACKTRAIN_SOURCE_DIR); }

// Empty when that Python can run the checks, else why not.
std::string python_unavailable_reason() {
  const std::string python = test_python();
  if (python.empty()) {
    return "no Python with torch and numpy was found at configure time (see PACKTRAIN_TEST_PYTHON in "
           "tests/CMakeLists.txt; the variable of that name chooses one at run time)";
  }
  if (::access(python.c_str(), X_OK) != 0) return "the test Python, " + python + ", is not there";
  return {};
}

class ExportDir : public ::testing::Test {
 protected:
  packtrain::testing::ScopedTempDir temp_{"packtrain_export"};
  const fs::path dir_ = temp_.path();
};

class ModelExport : public ExportDir, public ::testing::WithParamInterface<ExportCase> {
 protected:
  // Exports `members` (empty: all) and has the Python checker compare it with the
  // raw outputs and predictions computed here.
  void check_in_python(const std::vector<int64_t>& members) {
    const ExportCase& c = GetParam();
    const ensemble::PackedMLP pack = perturbed_pack(c);
    const ExportExtras extras = extras_for(c);
    std::vector<int64_t> ids = members;
    if (ids.empty()) ids = {0, 1, 2};
    const at::Tensor x = at::randn({kBatch, kIn}, at::kDouble) * extras.x_std + extras.x_mean;
    const at::Tensor z = ((x - extras.x_mean) / extras.x_std).to(at::kFloat);
    at::Tensor raw;
    {
      at::NoGradGuard no_grad;
      raw = pack.forward(z).index_select(0, at::tensor(ids, at::kLong));  // (K', B, O)
    }
    export_for_pytorch(dir_ / "model.pt", pack, members, extras);
    write_csv(dir_ / "input.csv", x);
    write_csv(dir_ / "raw.csv", raw.reshape({-1, c.out_features}));
    write_csv(dir_ / "predictions.csv", expected_predictions(raw, extras));

    const fs::path checker = source_tree() / "tests/runtime/io/check_export.py";
    const CommandResult r = run_command(test_python() + " " + quoted(checker) + " " + quoted(dir_ / "model.pt") + " " +
                                        quoted(dir_ / "input.csv") + " " + quoted(dir_ / "raw.csv") + " " +
                                        quoted(dir_ / "predictions.csv"));
    EXPECT_EQ(r.exit_status, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("checked " + std::to_string(ids.size()) + " members")) << r.output;
  }

  void SetUp() override {
    const std::string reason = python_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};

TEST_P(ModelExport, PythonReproducesMembers_Subset) { check_in_python({0, 2}); }

TEST_P(ModelExport, PythonReproducesMembers_All) { check_in_python({}); }

// The command line prints one CSV row per input row, after a header.
TEST_P(ModelExport, CommandLinePrintsCsv) {
  const ExportCase& c = GetParam();
  const ExportExtras extras = extras_for(c);
  export_for_pytorch(dir_ / "model.pt", perturbed_pack(c), {}, extras);
  write_csv(dir_ / "input.csv", at::randn({kBatch, kIn}, at::kDouble));
  const CommandResult r = run_command(test_python() + " " + quoted(source_tree() / "scripts/load_packtrain_export.py") +
                                      " " + quoted(dir_ / "model.pt") + " " + quoted(dir_ / "input.csv"));
  ASSERT_EQ(r.exit_status, 0) << r.output;
  std::istringstream lines(r.output);
  std::string header, line;
  std::getline(lines, header);
  EXPECT_THAT(header, HasSubstr(c.head == "classification" ? "label,p_2" : "mean"));
  int64_t rows = 0;
  while (std::getline(lines, line)) rows += line.empty() ? 0 : 1;
  EXPECT_EQ(rows, kBatch) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Heads, ModelExport,
    ::testing::Values(ExportCase{"gelu_gaussian", ensemble::Activation::kGELU, false, 0.0, "gaussian", 2},
                      ExportCase{"layernorm_relu_dropout_mean", ensemble::Activation::kReLU, true, 0.1, "mean", 2},
                      ExportCase{"layernorm_tanh_classification", ensemble::Activation::kTanh, true, 0.0,
                                 "classification", 3}),
    [](const ::testing::TestParamInfo<ExportCase>& info) { return info.param.name; });

using ModelExportFile = ExportDir;

c10::impl::GenericDict read_back(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return torch::jit::pickle_load(bytes).toGenericDict();
}

TEST_F(ModelExportFile, CppReadBack_HasDocumentedKeys) {
  const ExportCase c{"gaussian", ensemble::Activation::kSiLU, true, 0.0, "gaussian", 2};
  export_for_pytorch(dir_ / "model.pt", perturbed_pack(c), {2, 0}, extras_for(c));
  const c10::impl::GenericDict d = read_back(dir_ / "model.pt");
  for (const char* key : {"format", "members", "member_ids", "architecture", "x_mean", "x_std", "y_mean", "y_std",
                          "head", "min_variance", "feature_names", "classes", "variance_scale"}) {
    EXPECT_TRUE(d.contains(key)) << "missing key " << key;
  }
  EXPECT_EQ(d.at("format").toStringRef(), "packtrain-export-1");
  EXPECT_EQ(d.at("head").toStringRef(), "gaussian");
  const auto ids = d.at("member_ids").toListRef();
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0].toInt(), 2);
  EXPECT_EQ(ids[1].toInt(), 0);
  const auto arch = d.at("architecture").toGenericDict();
  EXPECT_EQ(arch.at("activation").toStringRef(), "silu");
  EXPECT_TRUE(arch.at("layer_norm").toBool());
  EXPECT_EQ(arch.at("depth").toInt(), 2);
  const auto member = d.at("members").toListRef().at(0).toGenericDict();
  // Linear, LayerNorm, SiLU per hidden layer, then Linear: indices 0, 1, 3, 4, 6.
  for (const char* name :
       {"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias", "4.weight", "4.bias", "6.weight", "6.bias"}) {
    EXPECT_TRUE(member.contains(name)) << "member state_dict lacks " << name;
  }
  EXPECT_EQ(member.size(), 10u);
  const at::Tensor w = member.at("0.weight").toTensor();
  EXPECT_EQ(w.sizes(), at::IntArrayRef({8, kIn}));
  EXPECT_EQ(w.scalar_type(), at::kFloat);
  EXPECT_FALSE(w.requires_grad());
  EXPECT_EQ(member.at("6.weight").toTensor().sizes(), at::IntArrayRef({2, 8}));
}

TEST_F(ModelExportFile, Classification_OmitsTargetStandardization) {
  const ExportCase c{"classification", ensemble::Activation::kReLU, false, 0.0, "classification", 3};
  export_for_pytorch(dir_ / "model.pt", perturbed_pack(c), {}, extras_for(c));
  const c10::impl::GenericDict d = read_back(dir_ / "model.pt");
  EXPECT_FALSE(d.contains("y_mean"));
  EXPECT_FALSE(d.contains("y_std"));
  EXPECT_EQ(d.at("classes").toListRef().size(), 3u);
  EXPECT_EQ(d.at("members").toListRef().size(), 3u);
}

TEST_F(ModelExportFile, BadArguments_ThrowNamingTheValue) {
  const ExportCase c{"mean", ensemble::Activation::kReLU, false, 0.0, "mean", 2};
  const ensemble::PackedMLP pack = perturbed_pack(c);
  ExportExtras extras = extras_for(c);
  try {
    export_for_pytorch(dir_ / "model.pt", pack, {0, 3}, extras);
    ADD_FAILURE() << "member 3 of 3 should be rejected";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("member 3 out of range"));
  }
  extras.head = "median";
  try {
    export_for_pytorch(dir_ / "model.pt", pack, {}, extras);
    ADD_FAILURE() << "head 'median' should be rejected";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("unknown head 'median'"));
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "a rejected export writes nothing";
}

}  // namespace
}  // namespace packtrain::runtime
