#pragma once
/// @file
/// The optimizer step of one shard as data and per-element rules shared by the host and CUDA:
/// `step_scalars` (the step's float64 sum of squared gradients and the decision made from it),
/// `update_rule` (an optimizer's per-step constants, computed once on the host), the per-element
/// update `update_element` and the non-finite/clip decision `decide_step` (`__host__ __device__`
/// under nvcc; the device uses round-to-nearest intrinsics, so nothing is contracted into an
/// FMA and the device gives the host's bits), and `shard_update` (one buffer's shard).
/// The host loops (`sum_of_squares`, `update_shard`) are what the host runtime and the host
/// stream run; zero/step_kernels.hpp runs the same rules as CUDA kernels.
/// Sources: SGD, Adam and AdamW as torch.optim documents them (zero/optimizer.hpp).
/// Thread semantics: plain functions of their arguments.

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ringzero/core/dtype.hpp"
#include "ringzero/core/half.hpp"
#include "ringzero/zero/optimizer.hpp"

#if defined(__CUDACC__)
#define RINGZERO_HOST_DEVICE __host__ __device__
#else
#define RINGZERO_HOST_DEVICE
#endif

namespace ringzero::zero {

/// The step's scalars, in the memory of the stream that runs the step: `squares` (the float64
/// sum of squared gradients as they arrived, all_reduced over the shard group), `inverse_scale`
/// (1 / the loss scale, zero/loss_scaler.hpp; 1 without loss scaling; set before the decision),
/// and what `decide_step` made of them. `skipped` is 1 when the update is skipped (non-finite
/// norm), else 0; `gradient_multiplier` is what the update multiplies the gradients by
/// (clip_coefficient * inverse_scale, rounded to float32 by the update).
struct step_scalars {
  double squares = 0;
  double gradient_norm = 0;
  double clip_coefficient = 1;
  std::uint64_t skipped = 0;
  double inverse_scale = 1;
  double gradient_multiplier = 1;
};

/// An optimizer's constants for one step (number `step`, counting from 1), from `make_update_rule`.
struct update_rule {
  optimizer_kind kind = optimizer_kind::sgd;
  float lr = 0, wd = 0;
  // SGD
  bool use_momentum = false, nesterov = false, first_step = false;
  float momentum = 0, keep = 0;
  // Adam and AdamW
  float step_size = 0, correction2_sqrt = 0, beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, eps = 0,
        decay = 0;
};

/// One shard's update: `count` elements of parameters `params` (`param_type`), gradients
/// `grads` (`gradient_type`), float32 master weights `master` (nullptr: float32 parameters are
/// updated in place) and float32 states `s0`, `s1` (SGD's momentum buffer; Adam's exp_avg and
/// exp_avg_sq; nullptr where the optimizer keeps none).
struct shard_update {
  update_rule rule;
  void* params = nullptr;
  dtype param_type = dtype::float32;
  const void* grads = nullptr;
  dtype gradient_type = dtype::float32;
  float* master = nullptr;
  float* s0 = nullptr;
  float* s1 = nullptr;
  std::uint64_t count = 0;
};

namespace detail {

// IEEE operations rounded to nearest, never fused: nvcc would contract a*b+c into one FMA on
// the device, and so does g++ on the host wherever the target has a fast FMA (its default
// -ffp-contract=fast: aarch64; x86 with -mfma or -march=native, which define __FP_FAST_FMAF).
// There the host's product goes through an empty asm statement that keeps it in a floating-point
// register, which the optimiser cannot see through, so no addition fuses with it (g++ ignores
// `#pragma STDC FP_CONTRACT OFF`). Elsewhere it is a plain product.
RINGZERO_HOST_DEVICE inline float f_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  float r = a * b;
#if defined(__FP_FAST_FMAF) && (defined(__GNUC__) || defined(__clang__))
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+x"(r));
#elif defined(__aarch64__)
  asm("" : "+w"(r));
#else
  volatile float unfused = r;
  r = unfused;
#endif
#endif
  return r;
#endif
}
RINGZERO_HOST_DEVICE inline float f_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
RINGZERO_HOST_DEVICE inline float f_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
RINGZERO_HOST_DEVICE inline float f_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
RINGZERO_HOST_DEVICE inline float f_sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

/// The constants of step `step` of `o` (the host computes them once per step; std::pow here).
inline update_rule make_update_rule(const optimizer_options& o, std::uint64_t step) {
  update_rule r;
  r.kind = o.kind;
  r.lr = static_cast<float>(o.lr);
  r.wd = static_cast<float>(o.weight_decay);
  switch (o.kind) {
    case optimizer_kind::sgd:
      r.use_momentum = o.momentum != 0;
      r.nesterov = o.nesterov;
      r.first_step = step == 1;
      r.momentum = static_cast<float>(o.momentum);
      r.keep = static_cast<float>(1.0 - o.dampening);
      return r;
    case optimizer_kind::adam:
    case optimizer_kind::adamw: {
      const double t = static_cast<double>(step);
      const double correction1 = 1.0 - std::pow(o.beta1, t);
      const double correction2 = 1.0 - std::pow(o.beta2, t);
      r.step_size = static_cast<float>(o.lr / correction1);
      r.correction2_sqrt = static_cast<float>(std::sqrt(correction2));
      r.beta1 = static_cast<float>(o.beta1);
      r.beta2 = static_cast<float>(o.beta2);
      r.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
      r.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
      r.eps = static_cast<float>(o.eps);
      r.decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
      return r;
    }
  }
  return r;
}

/// Element `j` of an update: weight `w` (updated), the gradient `d` already converted to float32
/// and multiplied by the step's scale, states `s0`, `s1` (indexed by `j`; unused ones may be null).
RINGZERO_HOST_DEVICE inline void update_element(const update_rule& r, float& w, float d, float* s0, float* s1,
                                                std::uint64_t j) {
  switch (r.kind) {
    case optimizer_kind::sgd:
      if (r.wd != 0) d = f_add(d, f_mul(r.wd, w));
      if (r.use_momentum) {
        float& b = s0[j];
        b = r.first_step ? d : f_add(f_mul(r.momentum, b), f_mul(r.keep, d));
        d = r.nesterov ? f_add(d, f_mul(r.momentum, b)) : b;
      }
      w = f_sub(w, f_mul(r.lr, d));
      return;
    case optimizer_kind::adam:
    case optimizer_kind::adamw: {
      if (r.kind == optimizer_kind::adamw)
        w = f_mul(w, r.decay);
      else if (r.wd != 0)
        d = f_add(d, f_mul(r.wd, w));
      float& m = s0[j];
      float& v = s1[j];
      m = f_add(f_mul(r.beta1, m), f_mul(r.one_minus_beta1, d));
      v = f_add(f_mul(r.beta2, v), f_mul(f_mul(r.one_minus_beta2, d), d));
      const float denom = f_add(f_div(f_sqrt(v), r.correction2_sqrt), r.eps);
      w = f_sub(w, f_mul(r.step_size, f_div(m, denom)));
      return;
    }
  }
}

/// Applies one step (number `step`, counting from 1) of `o` to `count` elements: weights `w`
/// (float32, updated in place), gradients `g` (any type convertible to float, multiplied by
/// `grad_scale`), and state arrays `s0`, `s1` (momentum buffer; or Adam's exp_avg and exp_avg_sq).
template <class G>
void apply_update(const optimizer_options& o, std::uint64_t step, float* w, const G* g, float grad_scale, float* s0,
                  float* s1, std::uint64_t count) noexcept {
  const update_rule r = make_update_rule(o, step);
  for (std::uint64_t j = 0; j < count; ++j)
    update_element(r, w[j], f_mul(static_cast<float>(g[j]), grad_scale), s0, s1, j);
}

/// The decision of a step from `s.squares` (all ranks' sum) and `s.inverse_scale`: the norm of
/// the unscaled gradients (sqrt(squares * inverse_scale^2); exact for a power-of-two scale),
/// skipped when it is not finite and `skip_nonfinite`, else the clip coefficient
/// max_grad_norm / (norm + 1e-6) where that is below 1 (`max_grad_norm` > 0;
/// torch.nn.utils.clip_grad_norm_'s formula); `gradient_multiplier` = clip_coefficient * inverse_scale.
RINGZERO_HOST_DEVICE inline void decide_step(step_scalars& s, double max_grad_norm, bool skip_nonfinite) {
  const double unscaled = s.squares * s.inverse_scale * s.inverse_scale;
#if defined(__CUDA_ARCH__)
  s.gradient_norm = ::sqrt(unscaled);
  const bool finite = ::isfinite(s.gradient_norm);
#else
  s.gradient_norm = std::sqrt(unscaled);
  const bool finite = std::isfinite(s.gradient_norm);
#endif
  s.clip_coefficient = 1;
  s.gradient_multiplier = s.inverse_scale;
  s.skipped = !finite && skip_nonfinite ? 1 : 0;
  if (s.skipped != 0) return;
  if (max_grad_norm > 0) {
    const double coefficient = max_grad_norm / (s.gradient_norm + 1e-6);
    if (coefficient < 1) s.clip_coefficient = coefficient;
  }
  s.gradient_multiplier = s.clip_coefficient * s.inverse_scale;
}

/// The float64 sum of the squares of `count` gradients of `type` (each converted to float32
/// first), in index order: the host's rule (the CUDA kernel sums in another order).
inline double sum_of_squares(const void* values, std::uint64_t count, dtype type) {
  double s = 0;
  visit_dtype(type, [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
      const T* x = static_cast<const T*>(values);
      for (std::uint64_t j = 0; j < count; ++j) {
        const double v = static_cast<double>(static_cast<float>(x[j]));
        s += v * v;
      }
    }
  });
  return s;
}

/// Applies `u` on the host with the gradients multiplied by `grad_scale`: the update of every
/// element, then (with master weights) the parameters written back rounded to their type.
inline void update_shard(const shard_update& u, float grad_scale) {
  visit_dtype(u.gradient_type, [&]<class G>() {
    if constexpr (std::is_same_v<G, float> || std::is_same_v<G, bfloat16> || std::is_same_v<G, float16>) {
      const G* g = static_cast<const G*>(u.grads);
      float* w = u.master != nullptr ? u.master : static_cast<float*>(u.params);
      for (std::uint64_t j = 0; j < u.count; ++j)
        update_element(u.rule, w[j], f_mul(static_cast<float>(g[j]), grad_scale), u.s0, u.s1, j);
      if (u.master == nullptr) return;
      visit_dtype(u.param_type, [&]<class P>() {
        if constexpr (std::is_same_v<P, bfloat16> || std::is_same_v<P, float16> || std::is_same_v<P, float>) {
          P* p = static_cast<P*>(u.params);
          for (std::uint64_t j = 0; j < u.count; ++j) p[j] = static_cast<P>(w[j]);
        }
      });
    }
  });
}

}  // namespace detail
}  // namespace ringzero::zero
