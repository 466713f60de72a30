#include "packtrain/ensemble/cpu_fused_step.h"

#include "packtrain/base/cpu_clones.h"
#include "packtrain/base/denormals.h"
#include "packtrain/ensemble/bfloat16_rounding.h"
#include "packtrain/ensemble/member_chunks.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <type_traits>
#include <vector>

// BLAS as LibTorch's CPU library exports it (MKL in the x86-64 wheels; LP64
// integers). Called inside at::parallel_for, so each call runs on one thread.
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
// MKL's per-thread thread count, where the BLAS is MKL (weak: absent elsewhere).
// MKL runs its own threads unaware of the OpenMP region it is called from here,
// which on two cores made a step twice as slow; each call must stay on its thread.
int MKL_Set_Num_Threads_Local(int threads) __attribute__((weak));  // mkl_service.h's mkl_set_num_threads_local
}

namespace packtrain::ensemble {

namespace {

// Row-major C (m x n) = op(A) op(B) + beta C, op(A) being m x k; lda, ldb, ldc are
// the row strides of A, B, C as stored. (Row-major C = A B is column-major
// C^T = B^T A^T, hence the swapped operands.)
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
          T beta, T* c, int64_t ldc) {
  const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
  const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
  const int LDA = static_cast<int>(ldb), LDB = static_cast<int>(lda), LDC = static_cast<int>(ldc);
  const T one = 1;
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(&ta, &tb, &M, &N, &K, &one, b, &LDA, a, &LDB, &beta, c, &LDC);
  } else {
    dgemm_(&ta, &tb, &M, &N, &K, &one, b, &LDA, a, &LDB, &beta, c, &LDC);
  }
}

// Mixed (bf16-mixed): v rounded to bfloat16 where autocast's result is a bfloat16
// tensor; v itself in float32 or float64 arithmetic.
template <bool Mixed, typename T>
[[gnu::always_inline]] inline T rounded(T v) {
  if constexpr (Mixed) {
    return round_to_bfloat16(v);
  } else {
    return v;
  }
}

template <bool Mixed, typename T>
[[gnu::always_inline]] inline void round_in_place(T* __restrict p, int64_t n) {
  if constexpr (Mixed) {
    for (int64_t i = 0; i < n; ++i) p[i] = round_to_bfloat16(p[i]);
  }
}

// Rows of z (B x d) get the bias; below the output layer a = act(z) too. One pass.
// Mixed: z is rounded once after the bias (as bfloat16 baddbmm rounds), a after the
// activation.
template <bool Mixed, typename T>
[[gnu::always_inline]] inline void add_bias_activate(Activation kind, bool hidden, T* __restrict z, T* __restrict a,
                                                     const T* __restrict bias, int64_t B, int64_t d) {
  for (int64_t r = 0; r < B; ++r) {
    T* __restrict zr = z + r * d;
    T* __restrict ar = a + r * d;
    for (int64_t j = 0; j < d; ++j) zr[j] = rounded<Mixed>(zr[j] + bias[j]);
    if (!hidden) continue;
    switch (kind) {  // as ATen's kernels compute them
      case Activation::kReLU:
        for (int64_t j = 0; j < d; ++j) ar[j] = zr[j] > T(0) ? zr[j] : T(0);
        break;
      case Activation::kTanh:
        for (int64_t j = 0; j < d; ++j) ar[j] = rounded<Mixed>(std::tanh(zr[j]));
        break;
      case Activation::kSiLU:
        for (int64_t j = 0; j < d; ++j) ar[j] = rounded<Mixed>(zr[j] / (T(1) + std::exp(-zr[j])));
        break;
      case Activation::kGELU:  // exact (erf) GELU, at::gelu's default
        for (int64_t j = 0; j < d; ++j)
          ar[j] = rounded<Mixed>(zr[j] * T(0.5) * (T(1) + std::erf(zr[j] * T(std::numbers::sqrt2 / 2))));
        break;
    }
  }
}

// g (B x d) *= act'(z) given z and a = act(z) (ATen's backward formulas), and the
// bias gradient gb = column sums of the result. One pass. Mixed: both rounded.
template <bool Mixed, typename T>
[[gnu::always_inline]] inline void activation_backward(Activation kind, const T* __restrict z, const T* __restrict a,
                                                       T* __restrict g, T* __restrict gb, int64_t B, int64_t d) {
  std::fill(gb, gb + d, T(0));
  const T inv_sqrt_2pi = T(0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2);
  for (int64_t r = 0; r < B; ++r) {
    const T* __restrict zr = z + r * d;
    const T* __restrict ar = a + r * d;
    T* __restrict gr = g + r * d;
    switch (kind) {
      case Activation::kReLU:
        for (int64_t j = 0; j < d; ++j) gr[j] = ar[j] > T(0) ? gr[j] : T(0);
        break;
      case Activation::kTanh:
        for (int64_t j = 0; j < d; ++j) gr[j] = rounded<Mixed>(gr[j] * (T(1) - ar[j] * ar[j]));
        break;
      case Activation::kSiLU:
        for (int64_t j = 0; j < d; ++j) {
          const T s = T(1) / (T(1) + std::exp(-zr[j]));
          gr[j] = rounded<Mixed>(gr[j] * s * (T(1) + zr[j] * (T(1) - s)));
        }
        break;
      case Activation::kGELU:
        for (int64_t j = 0; j < d; ++j) {
          const T cdf = T(0.5) * (T(1) + std::erf(zr[j] * T(std::numbers::sqrt2 / 2)));
          const T pdf = std::exp(T(-0.5) * zr[j] * zr[j]) * inv_sqrt_2pi;
          gr[j] = rounded<Mixed>(gr[j] * (cdf + zr[j] * pdf));
        }
        break;
    }
    for (int64_t j = 0; j < d; ++j) gb[j] += gr[j];
  }
  round_in_place<Mixed>(gb, d);
}

// gb = column sums of g (B x d); Mixed: rounded once, as a bfloat16 sum is.
template <bool Mixed, typename T>
[[gnu::always_inline]] inline void column_sums(const T* __restrict g, T* __restrict gb, int64_t B, int64_t d) {
  std::fill(gb, gb + d, T(0));
  for (int64_t r = 0; r < B; ++r)
    for (int64_t j = 0; j < d; ++j) gb[j] += g[r * d + j];
  round_in_place<Mixed>(gb, d);
}

// One member's mean loss over its batch, and its gradient with respect to the
// prediction p (B x width) written into g.
template <typename T>
[[gnu::always_inline]] inline double loss_and_gradient(LossKind kind, const T* p, int64_t B, int64_t width, const T* y,
                                                       const int64_t* labels, double min_variance, T* g) {
  double total = 0;
  switch (kind) {
    case LossKind::kMSE: {
      const T scale = T(2) / static_cast<T>(B * width);
      for (int64_t i = 0; i < B * width; ++i) {
        const T d = p[i] - y[i];
        total += static_cast<double>(d) * static_cast<double>(d);
        g[i] = d * scale;
      }
      return total / static_cast<double>(B * width);
    }
    case LossKind::kGaussianNLL: {
      const int64_t O = width / 2;
      const T inv_n = T(1) / static_cast<T>(B * O);
      const double half_log_2pi = 0.5 * std::log(2 * std::numbers::pi);
      for (int64_t r = 0; r < B; ++r) {
        const T* row = p + r * width;
        T* grow = g + r * width;
        for (int64_t j = 0; j < O; ++j) {
          const T mean = row[j], raw = row[O + j];
          // softplus(beta 1, threshold 20) and its derivative, as at::softplus.
          const T e = std::exp(raw);
          const T soft = raw > T(20) ? raw : std::log1p(e);
          const T dsoft = raw > T(20) ? T(1) : e / (e + T(1));
          const T var = soft + static_cast<T>(min_variance);
          const T diff = y[r * O + j] - mean;
          total += 0.5 * (std::log(static_cast<double>(var)) + static_cast<double>(diff) * diff / var) + half_log_2pi;
          grow[j] = -diff / var * inv_n;
          grow[O + j] = T(0.5) * (T(1) / var - diff * diff / (var * var)) * dsoft * inv_n;
        }
      }
      return total / static_cast<double>(B * O);
    }
    case LossKind::kCrossEntropy: {
      const T inv_b = T(1) / static_cast<T>(B);
      for (int64_t r = 0; r < B; ++r) {
        const T* row = p + r * width;
        T* grow = g + r * width;
        const int64_t label = labels[r];  // in range: checked before the members' loop
        const T top = *std::max_element(row, row + width);
        T sum = 0;
        for (int64_t j = 0; j < width; ++j) sum += (grow[j] = std::exp(row[j] - top));
        const T log_sum = std::log(sum);
        total += static_cast<double>(log_sum + top - row[label]);
        for (int64_t j = 0; j < width; ++j) grow[j] = grow[j] / sum * inv_b;
        grow[label] -= inv_b;
      }
      return total / static_cast<double>(B);
    }
  }
  return 0;
}

template <typename T>
struct LayerPointers {
  const T* w;  // (d_in, d_out) of member 0; member k at + k * d_in * d_out
  const T* b;  // (d_out)
  T* gw;
  T* gb;
  int64_t d_in, d_out;
};

// Everything one step needs, as raw pointers (members are offsets from these).
template <typename T>
struct StepPointers {
  std::vector<LayerPointers<T>> layers;
  Activation activation;
  LossKind kind;
  double min_variance;
  int64_t B, widest, activations;
  const T* x;
  int64_t x_stride;  // 0: shared by the members
  const T* y;        // regression targets, or
  const int64_t* labels;
  int64_t y_stride;  // 0: shared by the members
  T* losses;
  // Dropout in training: per hidden layer l the (K, B, d_out) multiplier forward
  // would apply (PackedMLP::dropout_noise); empty without dropout.
  std::vector<const T*> noise;
};

// One thread's buffers for one step: every layer's pre-activations z_l and
// activations a_l, with dropout the activations after it (the next layer's input)
// d_l, and two gradient buffers used in turn going down the layers.
template <typename T>
struct Workspace {
  std::vector<T> z_buf, a_buf, d_buf, g_buf;
  std::vector<T*> z, a, d;
  explicit Workspace(const StepPointers<T>& s)
      : z_buf(s.activations),
        a_buf(s.activations),
        d_buf(s.noise.empty() ? 0 : s.activations),
        g_buf(2 * s.B * s.widest),
        z(s.layers.size()),
        a(s.layers.size()),
        d(s.layers.size()) {
    for (size_t l = 0, offset = 0; l < s.layers.size(); ++l) {
      z[l] = z_buf.data() + offset;
      a[l] = a_buf.data() + offset;
      d[l] = s.noise.empty() ? a[l] : d_buf.data() + offset;  // without dropout the input is a_l itself
      offset += static_cast<size_t>(s.B * s.layers[l].d_out);
    }
  }
};

// out = a * m elementwise over n values (the product autograd's h * noise computes;
// Mixed: rounded, as the next product's bfloat16 operand).
template <bool Mixed, typename T>
[[gnu::always_inline]] inline void multiply(const T* __restrict a, const T* __restrict m, T* __restrict out,
                                            int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = rounded<Mixed>(a[i] * m[i]);
}

// g *= m elementwise over n values (Mixed: rounded, the gradient of a bfloat16 a).
template <bool Mixed, typename T>
[[gnu::always_inline]] inline void multiply_in_place(T* __restrict g, const T* __restrict m, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = rounded<Mixed>(g[i] * m[i]);
}

// Members [begin, end): forward, loss and backward of each while its activations
// are in cache. Mixed (bf16-mixed): s's input, weights and biases are already
// rounded to bfloat16, and every product's result and gradient is rounded where
// autocast's would be, so the float32 GEMMs below multiply bfloat16 values exactly
// and accumulate in float32, as a bfloat16 GEMM does (up to summation order).
template <bool Mixed, typename T>
[[gnu::always_inline]] inline void step_members(const StepPointers<T>& s, Workspace<T>& w, int64_t begin, int64_t end) {
  const int64_t L = static_cast<int64_t>(s.layers.size()), B = s.B;
  const std::vector<T*>& z = w.z;
  const std::vector<T*>& a = w.a;
  const std::vector<T*>& d = w.d;  // layer l + 1's input: a_l, or a_l after dropout
  const bool dropout = !s.noise.empty();
  for (int64_t k = begin; k < end; ++k) {
    const T* input = s.x + k * s.x_stride;
    // Forward: z_l = d_{l-1} W_l + b_l; a_l = act(z_l) below the output layer, and
    // d_l = a_l * noise_l with dropout (a_l without).
    for (int64_t l = 0; l < L; ++l) {
      const LayerPointers<T>& p = s.layers[l];
      gemm<T>(false, false, B, p.d_out, p.d_in, l == 0 ? input : d[l - 1], p.d_in, p.w + k * p.d_in * p.d_out, p.d_out,
              T(0), z[l], p.d_out);
      add_bias_activate<Mixed>(s.activation, l + 1 < L, z[l], a[l], p.b + k * p.d_out, B, p.d_out);
      if (dropout && l + 1 < L) multiply<Mixed>(a[l], s.noise[l] + k * B * p.d_out, d[l], B * p.d_out);
    }
    // Loss, its gradient with respect to the output, the output bias's gradient.
    T* grad = w.g_buf.data();
    T* spare = w.g_buf.data() + B * s.widest;
    const LayerPointers<T>& out = s.layers[L - 1];
    s.losses[k] =
        static_cast<T>(loss_and_gradient<T>(s.kind, z[L - 1], B, out.d_out, s.y ? s.y + k * s.y_stride : nullptr,
                                            s.labels ? s.labels + k * s.y_stride : nullptr, s.min_variance, grad));
    round_in_place<Mixed>(grad, B * out.d_out);  // the bfloat16 output's gradient
    column_sums<Mixed>(grad, out.gb + k * out.d_out, B, out.d_out);
    // Backward: dW_l = d_{l-1}^T dz_l; dz_{l-1} = (dz_l W_l^T) [* noise_{l-1}] *
    // act'(z_{l-1}), whose column sums are b_{l-1}'s gradient.
    for (int64_t l = L - 1; l >= 0; --l) {
      const LayerPointers<T>& p = s.layers[l];
      gemm<T>(true, false, p.d_in, p.d_out, B, l == 0 ? input : d[l - 1], p.d_in, grad, p.d_out, T(0),
              p.gw + k * p.d_in * p.d_out, p.d_out);
      round_in_place<Mixed>(p.gw + k * p.d_in * p.d_out, p.d_in * p.d_out);
      if (l == 0) break;
      gemm<T>(false, true, B, p.d_in, p.d_out, grad, p.d_out, p.w + k * p.d_in * p.d_out, p.d_out, T(0), spare, p.d_in);
      round_in_place<Mixed>(spare, B * p.d_in);
      if (dropout) multiply_in_place<Mixed>(spare, s.noise[l - 1] + k * B * p.d_in, B * p.d_in);
      const LayerPointers<T>& below = s.layers[l - 1];
      activation_backward<Mixed>(s.activation, z[l - 1], a[l - 1], spare, below.gb + k * below.d_out, B, p.d_in);
      std::swap(grad, spare);
    }
  }
}

// The elementwise loops vectorize for the widest instruction set the CPU has.
PACKTRAIN_CPU_CLONES void step_members_f32(const StepPointers<float>& s, Workspace<float>& w, int64_t begin,
                                           int64_t end) {
  step_members<false>(s, w, begin, end);
}
PACKTRAIN_CPU_CLONES void step_members_bf16_mixed(const StepPointers<float>& s, Workspace<float>& w, int64_t begin,
                                                  int64_t end) {
  step_members<true>(s, w, begin, end);
}
PACKTRAIN_CPU_CLONES void step_members_f64(const StepPointers<double>& s, Workspace<double>& w, int64_t begin,
                                           int64_t end) {
  step_members<false>(s, w, begin, end);
}

// A contiguous float32 tensor's values rounded to bfloat16, kept in float32 (what
// autocast's cast to bfloat16 and back gives): one pass and one allocation.
at::Tensor rounded_to_bfloat16(const at::Tensor& values) {
  at::Tensor out = at::empty_like(values);
  const float* in = values.data_ptr<float>();
  float* rounded = out.data_ptr<float>();
  at::parallel_for(0, values.numel(), int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) rounded[i] = round_to_bfloat16(in[i]);
  });
  return out;
}

template <typename T>
void fused_gradients(PackedMLP& model, const at::Tensor& x_in, const at::Tensor& y, LossKind kind, double min_variance,
                     const at::Tensor& losses) {
  // bf16-mixed: the products' operands as autocast's casts make them, rounded once
  // per step (a pass over the weights, 1/B of the GEMMs' work); the step reads its
  // weights, biases and input from these copies.
  const bool mixed = model.precision() == Precision::kBF16Mixed;
  const at::Tensor& flat = model.parameters().flat();
  const at::Tensor operands = mixed ? rounded_to_bfloat16(flat) : flat;
  const at::Tensor x = mixed ? rounded_to_bfloat16(x_in) : x_in;
  const auto operand = [&](const at::Tensor& parameter) {  // the same offset in `operands`
    return operands.data_ptr<T>() + (parameter.data_ptr<T>() - flat.data_ptr<T>());
  };
  StepPointers<T> s;
  s.B = x.size(-2);
  s.widest = s.activations = 0;
  for (const PackedLinear& linear : model.linears()) {
    s.layers.push_back({operand(linear.weight()), operand(linear.bias()), linear.weight().grad().data_ptr<T>(),
                        linear.bias().grad().data_ptr<T>(), linear.in_features(), linear.out_features()});
    s.widest = std::max({s.widest, linear.in_features(), linear.out_features()});
    s.activations += s.B * linear.out_features();
  }
  s.activation = model.options().activation();
  s.kind = kind;
  s.min_variance = min_variance;
  s.x = x.data_ptr<T>();
  s.x_stride = x.dim() == 3 ? s.B * x.size(2) : 0;
  const bool labels = kind == LossKind::kCrossEntropy;
  s.y = labels ? nullptr : y.data_ptr<T>();
  s.labels = labels ? y.data_ptr<int64_t>() : nullptr;
  const bool y_per_member = y.dim() == (labels ? 2 : 3);
  s.y_stride = y_per_member ? (labels ? s.B : s.B * y.size(-1)) : 0;
  s.losses = losses.data_ptr<T>();
  // Dropout's masks, drawn layer by layer as forward draws them (so from the same
  // generator state the same units drop); they outlive the members' loop.
  std::vector<at::Tensor> noise;
  if (model.is_training() && model.options().has_dropout()) {
    for (size_t l = 0; l + 1 < s.layers.size(); ++l) {
      // dropout_noise reads only the activation's shape and options: a broadcast view
      // of one element carries them without allocating a (K, B, H) buffer per step.
      const at::Tensor shape =
          at::empty({1, 1, 1}, model.parameters().flat().options()).expand({model.members(), s.B, s.layers[l].d_out});
      noise.push_back(model.dropout_noise(shape));
      s.noise.push_back(noise.back().data_ptr<T>());
    }
  }
  if (labels) {
    // Checked here, not in the members' loop: an exception must not cross the
    // worker threads (nor the CPU-dispatched clones, which GCC treats as not throwing).
    const int64_t classes = model.linears().back().out_features();
    const at::Tensor outside = y.lt(0).logical_or(y.ge(classes));
    if (outside.any().item<bool>()) {
      const int64_t label = y.masked_select(outside)[0].item<int64_t>();
      TORCH_CHECK(false, "cross-entropy target ", label, " is out of range for ", classes, " classes");
    }
  }
  // Below `grain` members the step is too small to be worth a second thread.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(s.activations * s.widest, 1));
  parallel_member_chunks(model.members(), grain, [&](MemberChunks& chunks) {
    const FlushDenormals no_subnormals;  // each worker thread: subnormals would halve the step's speed
    const int previous = MKL_Set_Num_Threads_Local != nullptr ? MKL_Set_Num_Threads_Local(1) : 0;
    Workspace<T> w(s);
    for (int64_t begin, end; chunks.next(begin, end);) {
      if constexpr (std::is_same_v<T, float>) {
        if (mixed) {
          step_members_bf16_mixed(s, w, begin, end);
        } else {
          step_members_f32(s, w, begin, end);
        }
      } else {
        step_members_f64(s, w, begin, end);
      }
    }
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous);  // 0: back to the global count
  });
}

bool contiguous_grad(const at::Tensor& t) { return t.grad().defined() && t.grad().is_contiguous(); }

}  // namespace

bool cpu_fused_step_applies(const PackedMLP& model, const at::Tensor& x, const at::Tensor& y, LossKind kind) {
  const PackedMLPOptions& o = model.options();
  const at::Tensor& flat = model.parameters().flat();
  if (!flat.is_cpu() || (o.dtype() != at::kFloat && o.dtype() != at::kDouble)) return false;
  // bf16-mixed rounds float32 only (autocast leaves float64 alone: so does autograd's path).
  if (model.precision() == Precision::kBF16Mixed && o.dtype() != at::kFloat) return false;
  if (o.layer_norm()) return false;
  for (const PackedLinear& linear : model.linears()) {
    if (!linear.weight().is_contiguous() || !linear.bias().is_contiguous() || !contiguous_grad(linear.weight()) ||
        !contiguous_grad(linear.bias()))
      return false;
  }
  // Inputs exactly as autograd's path accepts them; anything else goes there to be reported.
  const int64_t K = model.members(), I = o.in_features(), O = o.out_features();
  if (!x.defined() || !x.is_cpu() || x.scalar_type() != o.dtype() || !x.is_contiguous()) return false;
  const bool x_shape = (x.dim() == 2 && x.size(1) == I) || (x.dim() == 3 && x.size(0) == K && x.size(2) == I);
  if (!x_shape || x.size(-2) < 1) return false;
  const int64_t B = x.size(-2);
  if (!y.defined() || !y.is_cpu() || !y.is_contiguous()) return false;
  if (kind == LossKind::kCrossEntropy) {
    return y.scalar_type() == at::kLong &&
           ((y.dim() == 1 && y.size(0) == B) || (y.dim() == 2 && y.size(0) == K && y.size(1) == B));
  }
  const int64_t target_width = kind == LossKind::kGaussianNLL ? O / 2 : O;
  if (kind == LossKind::kGaussianNLL && O % 2 != 0) return false;
  return y.scalar_type() == o.dtype() &&
         ((y.dim() == 2 && y.size(0) == B && y.size(1) == target_width) ||
          (y.dim() == 3 && y.size(0) == K && y.size(1) == B && y.size(2) == target_width));
}

at::Tensor cpu_fused_gradients(PackedMLP& model, const at::Tensor& x, const at::Tensor& y, LossKind kind,
                               double min_variance) {
  TORCH_CHECK(cpu_fused_step_applies(model, x, y, kind),
              "cpu_fused_gradients: this model or batch needs the autograd step");
  at::NoGradGuard no_grad;
  at::Tensor losses = at::empty({model.members()}, model.parameters().flat().options());
  if (model.options().dtype() == at::kFloat) {
    fused_gradients<float>(model, x, y, kind, min_variance, losses);
  } else {
    fused_gradients<double>(model, x, y, kind, min_variance, losses);
  }
  return losses;
}

}  // namespace packtrain::ensemble
