#include "packtrain/runtime/trainers/memory_estimate.h"

#include "packtrain/ensemble/architectures.h"

#include "packtrain/ensemble/packed_mlp.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/run_data.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer_options.h"
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"
#include "packtrain/runtime/trainers/uncertainty/active_learning.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include <sys/resource.h>

// Every factor below says what it counts; the tests compare the parameter counts
// with real packs and the state with what a real trainer holds.
namespace packtrain::runtime {

namespace {

constexpr double kFloat = 4, kLong = 8, kDouble = 8;
constexpr double kUnknown = std::numeric_limits<double>::infinity();
// Per member on the device: lr, weight decay, step, current lr, mask, the Adam
// coefficient rows, the loss and evaluation sums: about 16 doubles.
constexpr double kDeviceBytesPerMember = 16 * kDouble;
// Per member on the host: its MemberState (40 B) and the per-epoch vectors the
// trainer builds from the members (losses, masks, selections, predictions' lists).
constexpr double kHostBytesPerMember = 96;

void add(MemoryEstimate& e, std::string what, double bytes, MemoryPlace place = MemoryPlace::kDevice) {
  if (bytes > 0) e.parts.push_back({std::move(what), bytes, place});
}

double outputs(const EnsembleTrainerOptions& o, const EnsembleRunSizes& s) {
  switch (o.head()) {
    case Head::kMean: return 1;
    case Head::kGaussian: return 2;
    case Head::kClassification: return static_cast<double>(std::max<int64_t>(s.classes, 2));
  }
  return 1;
}

// Optimizer state as copies of the parameters: Adam(W) two moments, SGD one
// momentum buffer (none without momentum).
double optimizer_copies(const EnsembleTrainerOptions& o) {
  if (o.optimizer() == OptimizerKind::kSGD) return o.momentum() != 0 ? 1 : 0;
  return 2;
}

// The shortest 1-D sample the cnn options' blocks take: every convolution's output at
// least 2 before its pool (PackedCNNOptions::validate); a power of two.
int64_t smallest_cnn_length(const EnsembleTrainerOptions& o) {
  ensemble::PackedCNNOptions c({1, 1}, 1);
  c.kernel_size(o.kernel()).stride(o.stride()).padding(o.padding());
  const auto fits = [&](int64_t n) {
    for (size_t b = 0; b < o.channels().size(); ++b) {
      if (c.conv_output(n) < 2) return false;
      n = c.conv_output(n) / 2;
    }
    return true;
  };
  int64_t n = 1;
  while (n < (int64_t{1} << 61) && !fits(n)) n *= 2;
  return n;
}

// The architecture's own count (ensemble/architectures.h), for sizes as doubles.
double parameters_per_member(const EnsembleTrainerOptions& o, double I, double O) {
  ensemble::PackSpec spec;
  spec.in_features = static_cast<int64_t>(std::min(I, 9e18));
  spec.out_features = static_cast<int64_t>(std::min(O, 9e18));
  spec.hidden = o.hidden();
  spec.depth = o.depth();
  spec.layer_norm = o.layer_norm();
  spec.input_shape = o.input_shape();
  spec.channels = o.channels();
  spec.kernel_size = o.kernel();
  spec.stride = o.stride();
  spec.padding = o.padding();
  spec.pool = o.pool();
  spec.norm_groups = o.norm_groups();
  if (o.architecture() == "cnn") {
    // A cnn's rows hold its sample shape's values. Before the data gives the shape (a
    // sweep's check of the least any data needs): the smallest a cnn takes, one channel
    // of the fewest values its blocks take — its fewest parameters.
    if (spec.input_shape.empty()) spec.input_shape = {1, smallest_cnn_length(o)};
    spec.in_features = 1;
    for (const int64_t s : spec.input_shape) spec.in_features *= s;
  }
  return ensemble::architecture(o.architecture()).parameters_per_member(spec);
}

// The ensemble trainer with K members (a double: active learning's pack may be
// absurdly large too).
MemoryEstimate ensemble_estimate(const EnsembleTrainerOptions& o, const EnsembleRunSizes& s, double K) {
  MemoryEstimate e;
  e.device = o.device();
  const double I = static_cast<double>(s.features), H = static_cast<double>(o.hidden()),
               D = static_cast<double>(o.depth()), B = static_cast<double>(o.batch_size()),
               N = static_cast<double>(s.rows), V = static_cast<double>(s.validation_rows),
               T = static_cast<double>(s.predict_rows), O = outputs(o, s);
  e.sizes = fmt::format("{:.0f} members, hidden {}, depth {}, batch {}", K, o.hidden(), o.depth(), o.batch_size());

  // State: S is one float32 copy of every member's parameters. Weights and
  // gradients (PackedParameters), the optimizer's copies, each member's best weights
  // with validation data, and the last weights kept while the best are restored.
  const double S = K * parameters_per_member(o, I, O) * kFloat;
  const double moments = optimizer_copies(o);
  const double copies = (V > 0 ? 1 : 0) + (V > 0 && resolved_patience(o, true) > 0 && o.restore_best() ? 1 : 0);
  add(e, fmt::format("weights, gradients and {} state", to_string(o.optimizer())), (2 + moments) * S);
  add(e, "best-weight copies", copies * S);
  // Initialization draws every member's row on the host, then stacks them: two more
  // copies, before the optimizer state exists (on a CPU run, the same memory).
  if (o.device().is_cuda()) {
    add(e, "initialization", 2 * S, MemoryPlace::kHost);
  } else {
    add(e, "initialization", std::max(0.0, 4 - (2 + moments + copies)) * S);
  }
  // Saving copies the saved state to the host, pickles it and frames the file: 3x.
  if (s.checkpoints) add(e, "checkpoint writing", 3 * (1 + moments + copies) * S, MemoryPlace::kHost);

  // Activations, the largest of three moments that never overlap:
  // - a training step: the batch gathered per member (K, B, I+1) or shared (B, I+1);
  //   autograd keeps each hidden layer's pre-activation and activation (+2 with
  //   layer norm, +1.25 with dropout: its output and a byte mask) and the backward
  //   holds two layers' gradients at a time: (a * depth + 2) (K, B, H) floats, and
  //   3 (K, B, O) for the output, the loss and its gradient. On CPU without layer
  //   norm the fused step (ensemble/cpu_fused_step.h) holds that for one member per
  //   thread only, besides dropout's masks for the whole pack (K, B, H) per layer;
  // - evaluation, without gradients, in chunks of the steps' evaluation batch: two
  //   (K, rows, H) layers at a time;
  // - predict() of a whole set at once: two (K, rows, H) layers.
  const bool per_member = o.order() != graphs::BatchOrder::kShared;
  const bool dropout = ensemble::drops_units(o.dropout(), o.member_dropout());
  const double a = 2 + (o.layer_norm() ? 2 : 0) + (dropout ? 1.25 : 0);
  const bool fused = o.device().is_cpu() && !o.layer_norm();
  const double with_hidden = fused ? std::min(K, static_cast<double>(at::get_num_threads())) : K;
  const double masks = fused && dropout ? K * B * H * D : 0;
  const double batch = (per_member ? K : 1) * B * (I + 1);
  const double train = (batch + masks + with_hidden * B * H * (a * D + 2) + 3 * K * B * O) * kFloat;
  const double eval_rows = std::min(V, static_cast<double>(EnsembleStepsOptions().eval_batch_size()));
  const double eval = K * eval_rows * (2 * H + 2 * O) * kFloat;
  const double predict = (K * T * (2 * H + O) + T * I) * kFloat;
  add(e, "activations", std::max({train, eval, predict}));
  // Predictions reach the host as float64 (K, rows, O) and become means and
  // variances: about 4 such arrays.
  add(e, "predictions", 4 * K * T * O * kDouble, MemoryPlace::kHost);

  // Data: standardized float32 copies of the training and validation rows, and the
  // batch order: one (N) permutation, or (K, N) int64 per member, drawn every epoch
  // through (K, N) float keys and their argsort (~20 more bytes per entry).
  const double order = per_member ? K * N * (kLong + 20) : N * kLong;
  add(e, "data and batch orders", (N + V) * (I + 1) * kFloat + order);
  add(e, "per-member scalars", K * kDeviceBytesPerMember);
  add(e, "per-member bookkeeping", K * kHostBytesPerMember, MemoryPlace::kHost);
  return e;
}

// The first number after `key` in a file of "key value" lines; NaN when absent.
double field(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0 || line.size() == key.size() || (line[key.size()] != ' ' && line[key.size()] != ':')) {
      continue;
    }
    std::istringstream rest(line.substr(key.size() + 1));
    double v = 0;
    if (rest >> v) return v;
  }
  return std::nan("");
}

// A one-number file ("max": no limit); NaN when absent.
double number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return std::nan("");
  if (text == "max") return kUnknown;
  try {
    return std::stod(text);
  } catch (const std::exception&) {
    return std::nan("");
  }
}

// What this process's memory cgroup still allows: its limit minus its usage, plus
// the inactive page cache the kernel reclaims first. Infinite without a limit.
// cgroup v2 (memory.max) or v1 (memory/memory.limit_in_bytes), at the path
// /proc/self/cgroup names and at the mount's root (a container's own cgroup): the
// least of those that set a limit.
// What an address-space limit (`ulimit -v`, RLIMIT_AS) leaves this process beside
// what it has mapped (VmSize); unknown (infinite) without a limit.
double address_space_headroom() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return kUnknown;
  const double mapped = field("/proc/self/status", "VmSize") * 1024;  // kB
  if (std::isnan(mapped)) return kUnknown;
  return std::max(0.0, static_cast<double>(limit.rlim_cur) - mapped);
}

double cgroup_headroom() {
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line, v2 = "/", v1 = "/";
  while (std::getline(cgroups, line)) {
    const size_t colon = line.find(':'), path = line.find(':', colon + 1);
    if (colon == std::string::npos || path == std::string::npos) continue;
    const std::string controllers = line.substr(colon + 1, path - colon - 1);
    if (controllers.empty()) v2 = line.substr(path + 1);
    if (controllers == "memory") v1 = line.substr(path + 1);
  }
  struct Layout {
    std::string dir, limit, usage, inactive;
  };
  const Layout layouts[] = {
      {"/sys/fs/cgroup" + v2, "memory.max", "memory.current", "inactive_file"},
      {"/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"},
      {"/sys/fs/cgroup/memory" + v1, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"},
      {"/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"},
  };
  double headroom = kUnknown;
  for (const Layout& l : layouts) {
    const double limit = number(l.dir + "/" + l.limit), usage = number(l.dir + "/" + l.usage);
    if (std::isnan(limit) || std::isnan(usage) || limit >= 1e18) continue;  // v1 writes "no limit" as a huge number
    const double inactive = field(l.dir + "/memory.stat", l.inactive);
    headroom = std::min(headroom, std::max(0.0, limit - usage + (std::isnan(inactive) ? 0 : inactive)));
  }
  return headroom;
}

}  // namespace

double MemoryEstimate::bytes(MemoryPlace place) const {
  double sum = 0;
  for (const MemoryPart& p : parts) {
    if (p.place == place || (place == MemoryPlace::kHost && !device.is_cuda())) sum += p.bytes;
  }
  return sum;
}

EnsembleRunSizes ensemble_run_sizes(const EnsembleTrainerOptions& options, const SplitData& data, bool checkpoints) {
  EnsembleRunSizes s;
  s.features = data.all.features.dim() == 2 ? data.all.features.size(1) : 1;
  s.rows = static_cast<int64_t>(data.split.train.size());
  s.validation_rows = static_cast<int64_t>(data.split.validation.size());
  s.predict_rows = static_cast<int64_t>(data.split.test.size());
  s.checkpoints = checkpoints;
  if (options.head() == Head::kClassification && s.rows > 0) {
    s.classes = std::get<0>(at::_unique(data.train().targets.reshape({-1}))).numel();
  }
  return s;
}

double ensemble_parameters_per_member(const EnsembleTrainerOptions& options, int64_t features, int64_t outputs) {
  return parameters_per_member(options, static_cast<double>(features), static_cast<double>(outputs));
}

MemoryEstimate estimate_ensemble_run(const EnsembleTrainerOptions& options, const EnsembleRunSizes& sizes) {
  return ensemble_estimate(options, sizes, static_cast<double>(options.members()));
}

MemoryEstimate estimate_active_learning(const EnsembleTrainerOptions& options, const ActiveLearningOptions& loop,
                                        const EnsembleRunSizes& sizes) {
  // The pack (active_learning.h): strategies x runs x members, a per-member order,
  // no validation, predicting the whole pool and the test rows.
  const double strategies = loop.random_baseline() ? 2 : 1, G = static_cast<double>(loop.ensembles());
  const double runs = strategies * G, K = runs * static_cast<double>(options.members());
  EnsembleTrainerOptions pack = options;
  if (pack.order() == graphs::BatchOrder::kShared) pack.order(graphs::BatchOrder::kPerMember);
  EnsembleRunSizes pool = sizes;
  pool.validation_rows = 0;
  pool.predict_rows = std::max(sizes.rows, sizes.predict_rows);
  pool.checkpoints = false;
  MemoryEstimate e = ensemble_estimate(pack, pool, K);
  e.sizes = fmt::format(
      "{:.0f} run(s) x {:.0f} strateg{} x {} members = {:.0f} in one pack, hidden {}, depth {}, "
      "batch {}",
      G, strategies, strategies > 1 ? "ies" : "y", options.members(), K, options.hidden(), options.depth(),
      options.batch_size());
  // Every run's partition of the pool (each pool row once, int64, plus its two
  // vectors) and a Mersenne Twister (2.5 KB) per random run.
  const double rows = static_cast<double>(sizes.rows);
  const double partitions = runs * (rows * kLong + 64) + (loop.random_baseline() ? G * sizeof(std::mt19937_64) : 0);
  // Each round's training rows: a tensor per run (~512 B each besides its data),
  // stacked (runs, n), repeated per member (K, n) on the host, then on the device.
  const double n = std::min(rows, static_cast<double>(loop.initial()) +
                                      static_cast<double>(loop.rounds() - 1) * static_cast<double>(loop.acquire()));
  add(e, "active-learning runs and labelled sets", partitions + runs * (2 * n * kLong + 512) + K * n * kLong,
      MemoryPlace::kHost);
  add(e, "labelled rows per member", K * n * kLong);
  return e;
}

// The counts of ensemble::transformer_parameters, in doubles: finite for any sizes,
// however absurd (the estimate must refuse them, not overflow or throw).
namespace {
struct TransformerWidths {
  double d, r, qkv, fc;
};
TransformerWidths widths(const ensemble::PackedTransformerOptions& m) {
  const double d = static_cast<double>(m.width()), r = static_cast<double>(m.mlp_width());
  const double dh = d / static_cast<double>(std::max<int64_t>(m.heads(), 1));
  const double heads = static_cast<double>(m.heads()) + 2.0 * static_cast<double>(m.key_value_heads());
  return {d, r, heads * dh, m.gated_mlp() ? 2 * r : r};
}
}  // namespace

double transformer_parameters_per_member(const MultiTaskTrainerOptions& options) {
  const ensemble::PackedTransformerOptions& m = options.model();
  const auto [d, r, qkv, fc] = widths(m);
  const double V = static_cast<double>(m.vocab()), L = static_cast<double>(m.max_length()),
               C = static_cast<double>(m.classes());
  const double norm = m.rms_norm() ? d : 2 * d;
  const auto bias = [&](double n) { return m.linear_bias() ? n : 0.0; };
  // Two norms, qkv, attention out, MLP fc and proj, with their biases.
  const double block = 2 * norm + (d * qkv + bias(qkv)) + (d * d + bias(d)) + (d * fc + bias(fc)) + (r * d + bias(d));
  return V * d + (m.rope_theta() > 0 ? 0 : L * d) + static_cast<double>(m.layers()) * block + norm + (d * C + C) +
         (m.tie_lm_head() ? 0 : d * V + bias(V));
}

double trained_parameters_per_member(const MultiTaskTrainerOptions& options) {
  const ensemble::PackedTransformerOptions& m = options.model();
  if (m.lora_rank() == 0) return transformer_parameters_per_member(options);
  const auto [d, r, qkv, fc] = widths(m);
  const double C = static_cast<double>(m.classes());
  // Each block's four adapters A (in, rank) and B (rank, out), and the classifier.
  return static_cast<double>(m.layers()) * static_cast<double>(m.lora_rank()) *
             ((d + qkv) + (d + d) + (d + fc) + (r + d)) +
         d * C + C;
}

MemoryEstimate estimate_multitask_run(const MultiTaskTrainerOptions& options, int64_t training_examples,
                                      bool checkpoints) {
  const ensemble::PackedTransformerOptions& m = options.model();
  MemoryEstimate e;
  e.device = m.device();
  const double K = static_cast<double>(m.members()), d = static_cast<double>(m.width()),
               r = static_cast<double>(m.mlp_width()), h = static_cast<double>(m.heads()),
               layers = static_cast<double>(m.layers()), V = static_cast<double>(m.vocab()),
               B = static_cast<double>(options.batch_size()), E = static_cast<double>(options.eval_batch_size()),
               N = static_cast<double>(training_examples);
  const double T =
      options.buckets().empty() ? static_cast<double>(m.max_length()) : static_cast<double>(options.buckets().back());
  const double bytes = m.dtype() == at::kDouble ? kDouble : kFloat;
  e.sizes = fmt::format("{} member(s), width {}, {} layers, {} heads, length {}, batch {}", m.members(), m.width(),
                        m.layers(), m.heads(), static_cast<int64_t>(T), options.batch_size());

  // Weights, gradients and AdamW's two moments of what the members train;
  // initialization draws the members' rows on the host (float32) and stacks them
  // before the moments exist. Adapters: the frozen trunk's weights once, no more.
  const double S = K * trained_parameters_per_member(options) * bytes;
  if (m.lora_rank() > 0) {
    add(e, "the shared frozen trunk", transformer_parameters_per_member(options) * bytes);
    add(e, "adapters' weights, gradients and adamw state", 4 * S);
  } else {
    add(e, "weights, gradients and adamw state", 4 * S);
  }
  if (m.device().is_cuda()) add(e, "initialization", 2 * S / bytes * kFloat, MemoryPlace::kHost);
  // Saving copies weights and moments to the host, pickles them and frames the file: 3x.
  if (checkpoints) add(e, "checkpoint writing", 3 * 3 * S, MemoryPlace::kHost);

  // A training step, per token of the longest bucket: each block keeps ~11 d + 2 r
  // values (two norms' inputs and outputs, q k v, the attention output, the
  // projections, the MLP's hidden layer before and after GELU) and up to 2 h T
  // attention weights where attention takes its math path; embeddings and the final
  // norm 4 d; the LM head its logits, their log-softmax and its gradient, 3 V. With
  // separate LM texts the trunk runs twice. Evaluation keeps no graph: one block's
  // widest intermediate and the logits, per token of an evaluation batch.
  const double per_token = layers * (11 * d + 2 * r + 2 * h * T) + 4 * d + 3 * V;
  const double train = K * B * T * per_token * bytes * (options.shared_inputs() ? 1 : 2);
  const double eval = K * E * T * (3 * d + r + h * T + 2 * V) * bytes;
  add(e, "activations", std::max(train, eval));
  // The training sentences as token rows of their bucket (int64, targets too).
  add(e, "training tokens", 2 * N * (T + 2) * kLong);
  add(e, "per-member scalars", K * kDeviceBytesPerMember);
  return e;
}

AvailableMemory available_memory(c10::Device device) {
  AvailableMemory a;
  const double meminfo = field("/proc/meminfo", "MemAvailable") * 1024;  // kB
  a.host = std::min({std::isnan(meminfo) ? kUnknown : meminfo, cgroup_headroom(), address_space_headroom()});
  a.device = a.host;
  if (device.is_cuda()) {
    const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
    // The caching allocator knows no device until CUDA is initialised, which in a
    // C++ process happens at the first CUDA tensor: this check runs before any.
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    auto* allocator = c10::cuda::CUDACachingAllocator::get();
    const auto [free, total] = allocator->getMemoryInfo(index);
    // What the driver has free, and what the caching allocator holds unused.
    const auto stats = allocator->getDeviceStats(index);
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    a.device = static_cast<double>(free) +
               static_cast<double>(stats.reserved_bytes[aggregate].current - stats.allocated_bytes[aggregate].current);
  }
  return a;
}

std::string format_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (!std::isfinite(bytes)) return "unbounded";
  size_t unit = 0;
  double v = bytes;
  while (v >= 1024 && unit + 1 < std::size(kUnits)) {
    v /= 1024;
    ++unit;
  }
  if (v >= 1024) return fmt::format("{:.2g} B", bytes);
  return unit == 0 ? fmt::format("{:.0f} B", v) : fmt::format("{:.1f} {}", v, kUnits[unit]);
}

void check_memory(const MemoryEstimate& estimate, const AvailableMemory& available, const std::string& advice) {
  const bool cuda = estimate.device.is_cuda();
  const auto refuse = [&](MemoryPlace place, double have, const std::string& where) {
    const double need = estimate.bytes(place);
    if (need <= have) return;
    // The parts in this place, largest first, up to three.
    std::vector<MemoryPart> parts;
    for (const MemoryPart& p : estimate.parts) {
      if (!cuda || p.place == place) parts.push_back(p);
    }
    std::sort(parts.begin(), parts.end(), [](const MemoryPart& x, const MemoryPart& y) { return x.bytes > y.bytes; });
    std::string list;
    for (size_t i = 0; i < parts.size() && i < 3; ++i) {
      list += fmt::format("{}{} of {}", i > 0 ? ", " : "", format_bytes(parts[i].bytes), parts[i].what);
    }
    throw DataError(fmt::format("this run needs about {}{} ({}: {}) but {} are available on {}{}", format_bytes(need),
                                cuda ? (place == MemoryPlace::kHost ? " of host memory" : " of device memory") : "",
                                estimate.sizes, list, format_bytes(have), where, advice.empty() ? "" : "; " + advice));
  };
  if (cuda) refuse(MemoryPlace::kDevice, available.device, estimate.device.str());
  refuse(MemoryPlace::kHost, available.host, cuda ? "the host" : estimate.device.str());
}

}  // namespace packtrain::runtime
