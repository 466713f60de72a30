#include "packtrain/ensemble/packed_mlp.h"

#include "packtrain/ensemble/member_seed.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/DistributionsHelper.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <mutex>
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
  TORCH_CHECK(c10::isFloatingType(dtype()), "PackedMLP dtype must be floating point, got ", dtype());
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
  if (options_.device().is_cpu() && drops_units_) {
    for (int64_t k = 0; k < options_.members(); ++k) {
      dropout_generators_.push_back(at::make_generator<at::CPUGeneratorImpl>());
      keep_rates_.push_back(1.0 - (options_.member_dropout().empty() ? options_.dropout()
                                                                      : options_.member_dropout()[k]));
    }
    seed_dropout(member_seed(options_.seed(), -1));
  }
  if (!options_.member_dropout().empty() && drops_units_) {
    keep_ = (1 - at::tensor(options_.member_dropout(), at::kDouble))
                .to(options_.device(), options_.dtype())
                .reshape({options_.members(), 1, 1});
  }
  reinitialize(options_.seed());
}

at::Tensor PackedMLP::forward(const at::Tensor& x) const {
  linears_.front().check_input(x);
  at::Tensor h = x;
  for (int64_t l = 0; l < options_.depth(); ++l) {
    h = linears_[l].forward(h);  // (K, B, H)
    if (options_.layer_norm()) {
      h = at::layer_norm(h, {options_.hidden()});
      h = at::addcmul(norm_biases_[l], h, norm_weights_[l]);
    }
    h = activate(h, options_.activation());
    if (!training_ || !drops_units_) continue;
    // at::dropout's fused kernel on a GPU; elsewhere the multiply at::dropout does on CPU.
    h = keep_.defined() || !h.is_cuda() ? h * dropout_noise(h) : at::dropout(h, options_.dropout(), true);
  }
  return linears_.back().forward(h);  // (K, B, O)
}

namespace {

// Member k's mask for one layer: `rows` rows of `width` units drawn in order from its
// generator, rows [offset, offset + out_rows) kept: 1 / keep where a unit stays, 0
// where it drops (inverted dropout).
template <typename T>
void draw_member_mask(at::CPUGeneratorImpl* generator, double keep, int64_t rows, int64_t offset, int64_t out_rows,
                      int64_t width, T* out) {
  const T scale = T(1) / static_cast<T>(keep);
  at::bernoulli_distribution<double> kept(keep);
  for (int64_t r = 0; r < rows; ++r) {
    const bool mine = r >= offset && r < offset + out_rows;
    T* row = out + (r - offset) * width;
    for (int64_t j = 0; j < width; ++j) {
      const bool stays = kept(generator) != 0;
      if (mine) row[j] = stays ? scale : T(0);
    }
  }
}

}  // namespace

at::Tensor PackedMLP::dropout_noise(const at::Tensor& h) const {
  if (!drops_units_) return {};
  if (h.is_cuda()) {
    // Member k keeps a unit with probability keep_[k] and scales it by 1 / keep_[k]:
    // one draw from the device's default generator for the whole pack.
    if (keep_.defined()) return at::empty_like(h).bernoulli_(keep_).div_(keep_);
    const double keep = 1.0 - options_.dropout();
    return at::empty_like(h).bernoulli_(keep).div_(keep);
  }
  TORCH_CHECK(h.dim() == 3 && h.size(0) == members(), "dropout_noise: expected (K, B, H) activations, got ",
              h.sizes());
  const int64_t B = h.size(1), H = h.size(2);
  const int64_t rows = dropout_rows_ > 0 ? dropout_rows_ : B;
  const int64_t offset = dropout_rows_ > 0 ? dropout_row_offset_ : 0;
  TORCH_CHECK(offset + B <= rows, "dropout_noise: rows ", offset, "..", offset + B, " outside a batch of ", rows);
  at::Tensor noise = at::empty({members(), B, H}, h.options().requires_grad(false));
  // Members in parallel: each draws from its own generator only, so the masks do
  // not depend on the threads.
  at::parallel_for(0, members(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      auto* generator = at::check_generator<at::CPUGeneratorImpl>(dropout_generators_[k]);
      std::lock_guard<std::mutex> lock(generator->mutex_);
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, noise.scalar_type(), "dropout_noise", [&] {
        draw_member_mask<scalar_t>(generator, keep_rates_[k], rows, offset, B, H,
                                   noise.data_ptr<scalar_t>() + k * B * H);
      });
    }
  });
  return noise;
}

void PackedMLP::seed_dropout(uint64_t seed) {
  for (size_t k = 0; k < dropout_generators_.size(); ++k) {
    std::lock_guard<std::mutex> lock(dropout_generators_[k].mutex());
    dropout_generators_[k].set_current_seed(member_seed(seed, options_.first_member() + static_cast<int64_t>(k)));
  }
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
  auto generator = at::make_generator<at::CPUGeneratorImpl>(member_seed(seed, options_.first_member() + member));
  at::Tensor row = at::empty({parameters_.per_member()}, at::kFloat);
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
    const int64_t fan_in = is_weight ? spec.shape[0] : parameters_.spec(i - 1).shape[0];
    if (is_weight) {
      const double gain = std::sqrt(2.0 / (1 + std::pow(std::sqrt(5.0), 2)));
      const double bound = std::sqrt(3.0) * (gain / std::sqrt(static_cast<double>(fan_in)));
      at::Tensor w = at::empty({spec.shape[1], spec.shape[0]}, at::kFloat);  // (O, I)
      w.uniform_(-bound, bound, generator);
      slot.view({spec.shape[0], spec.shape[1]}).copy_(w.t());  // stored (I, O)
    } else {
      const double bound = 1 / std::sqrt(static_cast<double>(fan_in));
      slot.uniform_(-bound, bound, generator);
    }
  }
  return row;
}

void PackedMLP::reinitialize(uint64_t seed, const at::Tensor& which) {
  at::NoGradGuard no_grad;
  const int64_t K = members();
  std::vector<int64_t> selected;
  if (which.defined()) {
    TORCH_CHECK(which.dim() == 1 && which.size(0) == K && which.scalar_type() == at::kBool,
                "reinitialize: the member selection must be a bool tensor of shape [", K, "], got ",
                which.scalar_type(), " ", which.sizes());
    const at::Tensor host = which.cpu().contiguous();
    const bool* flags = host.data_ptr<bool>();
    for (int64_t i = 0; i < K; ++i) {
      if (flags[i]) selected.push_back(i);
    }
    if (selected.empty()) return;
  } else {
    for (int64_t i = 0; i < K; ++i) selected.push_back(i);
    options_.seed(seed);
  }
  std::vector<at::Tensor> rows;
  rows.reserve(selected.size());
  for (int64_t i : selected) rows.push_back(initial_member_row(seed, i));
  parameters_.write_member_rows(at::stack(rows), selected);
}

}  // namespace packtrain::ensemble
