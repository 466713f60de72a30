#include "packtrain/ensemble/packed_mlp.h"

#include "packtrain/ensemble/cpu_fused_step.h"
#include "packtrain/ensemble/dropout_mask.h"
#include "packtrain/ensemble/linear_init.h"
#include "packtrain/ensemble/member_seed.h"
#include "packtrain/ensemble/pack.h"
#include "packtrain/profiling/nvtx.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#if defined(PACKTRAIN_HAVE_CUDA_KERNELS)
#include "packtrain/ensemble/dropout_mask_cuda.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cmath>
#include <string>

namespace packtrain::ensemble {

void PackedMLPOptions::validate() const {
  TORCH_CHECK(members() > 0, "members must be positive, got members=", members());
  TORCH_CHECK(first_member() >= 0, "first_member must be >= 0, got ", first_member());
  TORCH_CHECK(in_features() > 0, "in_features must be positive, got ", in_features());
  TORCH_CHECK(out_features() > 0, "out_features must be positive, got ", out_features());
  TORCH_CHECK(depth() >= 0, "depth (hidden layers) must be >= 0, got ", depth());
  TORCH_CHECK(depth() == 0 || hidden() > 0, "hidden width must be positive, got hidden=", hidden());
  TORCH_CHECK(dropout() >= 0.0 && dropout() < 1.0, "dropout must be in [0, 1), got ", dropout());
  TORCH_CHECK(member_dropout().empty() || static_cast<int64_t>(member_dropout().size()) == members(),
              "per-member dropout: expected one rate per member (", members(), "), got ", member_dropout().size());
  for (const double p : member_dropout()) {
    TORCH_CHECK(p >= 0.0 && p < 1.0, "per-member dropout must be in [0, 1), got ", p);
  }
  TORCH_CHECK(member_hidden().empty() || static_cast<int64_t>(member_hidden().size()) == members(),
              "per-member widths: expected one width per member (", members(), "), got ", member_hidden().size());
  for (const int64_t h : member_hidden()) {
    TORCH_CHECK(h > 0 && h <= hidden(), "per-member width must be in [1, hidden=", hidden(), "], got ", h);
  }
  TORCH_CHECK(!(layer_norm() && !member_hidden().empty()),
              "layer norm with members of different widths: LayerNorm would count a narrower member's padding in "
              "its statistics; give one width, or no --layer-norm");
  TORCH_CHECK(c10::isFloatingType(dtype()), "PackedMLP dtype must be floating point, got ", dtype());
}

int64_t PackedMLPOptions::member_width(int64_t member) const {
  return member_hidden().empty() ? hidden() : member_hidden().at(static_cast<size_t>(member));
}

PackedMLPOptions PackedMLPOptions::member_options(int64_t member) const {
  PackedMLPOptions one = *this;
  one.members(1).hidden(member_width(member)).member_hidden({}).first_member(first_member() + member);
  if (!member_dropout().empty()) one.member_dropout({member_dropout().at(static_cast<size_t>(member))});
  return one;
}

bool drops_units(double dropout, const std::vector<double>& member_dropout) {
  if (member_dropout.empty()) return dropout > 0.0;
  return std::any_of(member_dropout.begin(), member_dropout.end(), [](double p) { return p > 0.0; });
}

bool PackedMLPOptions::has_dropout() const { return drops_units(dropout(), member_dropout()); }

namespace {
std::vector<ParameterSpec> mlp_specs(const PackedMLPOptions& o) {
  std::vector<ParameterSpec> specs;
  int64_t in = o.in_features();
  for (int64_t l = 0; l <= o.depth(); ++l) {
    const int64_t out = l < o.depth() ? o.hidden() : o.out_features();
    const std::string prefix = "linear" + std::to_string(l);
    specs.push_back({prefix + ".weight", {in, out}});
    specs.push_back({prefix + ".bias", {1, out}});
    if (l < o.depth() && o.layer_norm()) {
      const std::string norm = "norm" + std::to_string(l);
      specs.push_back({norm + ".weight", {1, out}});
      specs.push_back({norm + ".bias", {1, out}});
    }
    in = out;
  }
  return specs;
}

// h is a fresh intermediate nobody else holds, so activations whose backward needs
// only their output (relu, tanh) run in place and save one (K, B, H) buffer.
at::Tensor activate(at::Tensor h, Activation activation) {
  switch (activation) {
    case Activation::kReLU: return at::relu_(h);
    case Activation::kGELU: return at::gelu(h);
    case Activation::kSiLU: return at::silu(h);
    case Activation::kTanh: return at::tanh_(h);
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled activation");
}
}  // namespace

PackedMLP::PackedMLP(PackedMLPOptions options) : options_(std::move(options)) {
  options_.validate();
  parameters_ = PackedParameters(options_.members(), mlp_specs(options_),
                                 c10::TensorOptions().dtype(options_.dtype()).device(options_.device()));
  for (int64_t l = 0; l <= options_.depth(); ++l) {
    const std::string prefix = "linear" + std::to_string(l);
    linears_.emplace_back(parameters_.at(prefix + ".weight"), parameters_.at(prefix + ".bias"));
    if (l < options_.depth() && options_.layer_norm()) {
      norm_weights_.push_back(parameters_.at("norm" + std::to_string(l) + ".weight"));
      norm_biases_.push_back(parameters_.at("norm" + std::to_string(l) + ".bias"));
    }
  }
  drops_units_ = options_.has_dropout();
  if (drops_units_) {
    for (int64_t k = 0; k < options_.members(); ++k) {
      keep_rates_.push_back(1.0 -
                            (options_.member_dropout().empty() ? options_.dropout() : options_.member_dropout()[k]));
    }
    keep_ = at::tensor(keep_rates_, at::kDouble).to(options_.device());
    dropout_state_ = at::zeros({2}, at::TensorOptions().dtype(at::kLong).device(options_.device()));
    seed_dropout(member_seed(options_.seed(), -1));
  }
  reinitialize(options_.seed());
}

at::Tensor PackedMLP::forward_layers(const at::Tensor& x) const {
  linears_.front().check_input(x);
  at::Tensor h = x;
  for (int64_t l = 0; l < options_.depth(); ++l) {
    h = linears_[l].forward(h);  // (K, B, H)
    if (options_.layer_norm()) {
      h = at::layer_norm(h, {options_.hidden()});
      h = at::addcmul(norm_biases_[l], h, norm_weights_[l]);
    }
    h = activate(h, options_.activation());
    if (training_ && drops_units_) h = h * dropout_noise(h);
  }
  return linears_.back().forward(h);  // (K, B, O)
}

at::Tensor PackedMLP::dropout_noise(const at::Tensor& h) const {
  if (!drops_units_) return {};
  TORCH_CHECK(h.dim() == 3 && h.size(0) == members(), "dropout_noise: expected (K, B, H) activations, got ", h.sizes());
  const int64_t K = members(), B = h.size(1), H = h.size(2);
  const int64_t offset = dropout_rows_ > 0 ? dropout_row_offset_ : 0;
  // bf16-mixed: the masks keep the pack's dtype (h is bfloat16 under autocast), as the
  // fused step's do; the product is rounded where the next layer's GEMM reads it.
  const c10::ScalarType dtype = precision_ == Precision::kBF16Mixed ? options_.dtype() : h.scalar_type();
  TORCH_CHECK(dropout_rows_ == 0 || offset + B <= dropout_rows_, "dropout_noise: rows ", offset, "..", offset + B,
              " outside a batch of ", dropout_rows_);
  if (h.is_cuda()) {
#if defined(PACKTRAIN_HAVE_CUDA_KERNELS)
    // The kernel writes float32 or float64; half-precision packs take float32's masks.
    const bool native = dtype == at::kFloat || dtype == at::kDouble;
    at::Tensor noise = at::empty({K, B, H}, h.options().dtype(native ? dtype : at::kFloat).requires_grad(false));
    C10_CUDA_CHECK(static_cast<cudaError_t>(detail::launch_dropout_mask(
        noise.scalar_type() == at::kDouble, noise.data_ptr(), K, B, H, keep_.data_ptr<double>(),
        options_.first_member(), offset, dropout_state_.data_ptr<int64_t>(),
        c10::cuda::getCurrentCUDAStream(h.device().index()).stream())));
    return native ? noise : noise.to(dtype);
#else
    // A build without packtrain's CUDA kernels: the device's default generator
    // (the masks then do not follow from the seed).
    const at::Tensor keep = keep_.to(dtype).view({K, 1, 1});
    return at::empty({K, B, H}, h.options().dtype(dtype).requires_grad(false)).bernoulli_(keep).div_(keep);
#endif
  }
  at::Tensor noise = at::empty({K, B, H}, h.options().dtype(dtype).requires_grad(false));
  int64_t* state = dropout_state_.data_ptr<int64_t>();
  const int64_t draw = state[1]++;
  detail::fill_dropout_mask_cpu(noise, keep_rates_, static_cast<uint64_t>(state[0]), draw, options_.first_member(),
                                offset);
  return noise;
}

void PackedMLP::seed_dropout(uint64_t seed) {
  if (!dropout_state_.defined()) return;
  // In place: a captured step keeps reading this tensor. From pinned memory on a GPU,
  // so the copy (once an epoch) does not stop the host.
  at::Tensor host = at::tensor({static_cast<int64_t>(seed), int64_t{0}}, at::kLong);
  const bool cuda = dropout_state_.is_cuda();
  dropout_state_.copy_(cuda ? host.pin_memory() : host, /*non_blocking=*/cuda);
}

void PackedMLP::dropout_rows(int64_t offset, int64_t rows) {
  TORCH_CHECK(offset >= 0 && rows >= 0, "dropout_rows: offset ", offset, " and rows ", rows, " must be >= 0");
  dropout_row_offset_ = offset;
  dropout_rows_ = rows;
}

at::Tensor PackedMLP::initial_member_row(uint64_t seed, int64_t member) const {
  // Same draws, in the same order, as building the standalone Sequential after
  // seeding the default generator (torch::nn::Linear::reset_parameters):
  // weight (O, I) ~ U(-b, b) with b = sqrt(3) * gain(leaky_relu, sqrt(5)) / sqrt(I),
  // then bias (O) ~ U(-1/sqrt(I), 1/sqrt(I)). LayerNorm starts at ones and zeros.
  // A narrower member draws its own width's layers (fan-ins and counts) into the
  // leading block of each slot; the rest stays zero (the header's mixed widths).
  auto generator = at::make_generator<at::CPUGeneratorImpl>(member_seed(seed, options_.first_member() + member));
  const int64_t width = options_.member_width(member);
  at::Tensor row = at::zeros({parameters_.per_member()}, at::kFloat);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const ParameterSpec& spec = parameters_.spec(i);
    int64_t numel = 1;
    for (int64_t d : spec.shape) numel *= d;
    at::Tensor slot = row.narrow(0, parameters_.row_offset(i), numel);
    const bool is_weight = spec.name.ends_with(".weight");
    if (spec.name.starts_with("norm")) {
      slot.fill_(is_weight ? 1.0 : 0.0);
      continue;
    }
    if (is_weight) {  // the Linear's weight, then its bias (the next spec)
      // Hidden sides are the member's width; the input's and output's are whole.
      const int64_t in = i == 0 ? spec.shape[0] : width;
      const int64_t out = i + 2 == parameters_.size() ? spec.shape[1] : width;
      draw_linear_init(slot.view({spec.shape[0], spec.shape[1]}).narrow(0, 0, in).narrow(1, 0, out),
                       row.narrow(0, parameters_.row_offset(i + 1), out), generator);
    }
  }
  return row;
}

void PackedMLP::reinitialize(uint64_t seed, const at::Tensor& which) {
  at::NoGradGuard no_grad;
  const std::vector<int64_t> selected = members_to_reinitialize(which, members());
  if (selected.empty()) return;
  if (!which.defined()) options_.seed(seed);
  std::vector<at::Tensor> rows;
  rows.reserve(selected.size());
  for (int64_t i : selected) rows.push_back(initial_member_row(seed, i));
  parameters_.write_member_rows(at::stack(rows), selected);
}

StandaloneMember PackedMLP::standalone_member(int64_t member) const {
  torch::nn::Sequential seq = unpack(*this, member);
  return {seq.ptr(), [seq](const at::Tensor& x) mutable { return seq->forward(x); }};
}

namespace {
// Where bf16-mixed's autograd path (oneDNN's bfloat16 kernels) beats the fused step on
// a CPU with bfloat16 units: `packtrain --threads 1 profile --eager --members 64
// --depth 2 --precision bf16-mixed|fp32` on an AMD EPYC with AVX-512 BF16, 2026-12-07:
// 0.93x fp32 at hidden 64, 1.25x at 128, 1.18x at 256 (the UCI default, K 16 at
// hidden 64, ran 1.4-3.4x slower per split through autograd).
constexpr int64_t kBf16KernelMinHidden = 128;
}  // namespace

std::optional<at::Tensor> PackedMLP::fused_gradients(const at::Tensor& x, const at::Tensor& y, LossKind kind,
                                                     double min_variance) {
  if (!cpu_fused_step_applies(*this, x, y, kind)) return std::nullopt;
  // bf16-mixed on a CPU with bfloat16 matrix units, on packs wide enough to pay for
  // them: autograd's path under autocast runs oneDNN's bfloat16 kernels there, which
  // the fused step's float32 GEMMs of bfloat16-rounded operands cannot
  // (benchmarks/RESULTS.md, "bf16-mixed"). Narrower packs keep the fused step: the
  // same numbers, with less per-op overhead.
  if (precision() == Precision::kBF16Mixed && cpu_has_bf16_matrix_units() && options_.hidden() >= kBf16KernelMinHidden)
    return std::nullopt;
  PACKTRAIN_NVTX_RANGE("forward+backward");  // fused, member by member
  return cpu_fused_gradients(*this, x, y, kind, min_variance);
}

}  // namespace packtrain::ensemble
