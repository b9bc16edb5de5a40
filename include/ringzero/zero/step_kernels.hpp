#pragma once
/// @file
/// The CUDA kernels of the ZeRO step, as bodies for a launcher (primitive/kernels/grid.hpp: a
/// CUDA stream through zero/optimizer_kernels.cuh's table, or the host in CI): the float64 sum of squares of a gradient
/// shard (a block reduction into per-block partials, then one block adds their sum to the total), the step's decision
/// (`detail::decide_step`, one thread) and the update of a shard (`detail::update_element` per
/// element, the parameters written back rounded to their type; nothing when the decision says
/// skipped). The update's arithmetic is the host's, operation for operation and unfused
/// (zero/shard_update.hpp), so it gives the host's bits for the same clip coefficient; the sum
/// of squares adds in another order than the host's loop (float64 rounding apart). Each
/// function returns the launcher's result (0, or a cudaError_t value).

#include <cstdint>
#include <type_traits>

#include "ringzero/core/config.hpp"
#include "ringzero/primitive/kernels/arithmetic.hpp"
#include "ringzero/primitive/kernels/grid.hpp"
#include "ringzero/zero/optimizer_kernels.hpp"
#include "ringzero/zero/shard_update.hpp"

namespace ringzero::zero::kernels {

namespace pk = primitive::kernels;

/// Threads per block of the step's kernels.
inline constexpr unsigned step_threads = 256;
static_assert(sum_of_squares_partials <= step_threads, "the second pass sums the partials in one block");
static_assert(step_threads <= pk::max_block_threads);

template <class T>
RINGZERO_HOST_DEVICE inline float as_float(T x) {
  return pk::arithmetic_value(x);
}

// float64 operations rounded to nearest, never fused.
RINGZERO_HOST_DEVICE inline double d_add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
RINGZERO_HOST_DEVICE inline double d_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

/// `part[0]` = the float64 sum of `part[0..step_threads)`, by a fixed tree (deterministic);
/// the block's threads (`step_threads` of them) all take part. Starts and ends with a barrier.
template <class Block>
RINGZERO_HOST_DEVICE inline void block_sum(Block& b, double* part) {
  b.sync();
  for (unsigned w = step_threads / 2; w > 0; w >>= 1) {
    b.for_each_thread([&](std::uint64_t t) {
      if (t < w) part[t] = d_add(part[t], part[t + w]);
    });
    b.sync();
  }
}

/// First pass of the sum of squares: `partials[block]` = the float64 sum of the squares of
/// the block's grid-strided elements of `x` (each converted to float32 first). Launched with
/// `step_threads` threads per block.
template <class T>
struct squares_partials_kernel {
  static constexpr const char* kernel_name = "squares_partials_kernel";
  const T* x;
  std::uint64_t n;
  double* partials;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    double* part = b.template shared<double, step_threads>();
    const std::uint64_t stride = b.grid_blocks() * step_threads;
    b.for_each_thread([&](std::uint64_t t) {
      double s = 0;
      for (std::uint64_t j = b.block_index() * step_threads + t; j < n; j += stride) {
        const double v = static_cast<double>(as_float(x[j]));
        s = d_add(s, d_mul(v, v));
      }
      part[t] = s;
    });
    block_sum(b, part);
    b.for_each_thread([&](std::uint64_t t) {
      if (t == 0) partials[b.block_index()] = part[0];
    });
  }
};

/// Second pass: `*sum += ` the sum of the first `blocks` partials (one block of `step_threads`).
struct squares_finish_kernel {
  static constexpr const char* kernel_name = "squares_finish_kernel";
  const double* partials;
  std::uint64_t blocks;
  double* sum;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    double* part = b.template shared<double, step_threads>();
    b.for_each_thread([&](std::uint64_t t) { part[t] = t < blocks ? partials[t] : 0.0; });
    block_sum(b, part);
    b.for_each_thread([&](std::uint64_t t) {
      if (t == 0) *sum = d_add(*sum, part[0]);
    });
  }
};

/// The step's decision, `detail::decide_step`, by one thread.
struct decide_step_kernel {
  static constexpr const char* kernel_name = "decide_step_kernel";
  step_scalars* s;
  double max_grad_norm;
  bool skip_nonfinite;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    b.for_each_thread([&](std::uint64_t t) {
      if (t == 0) zero::detail::decide_step(*s, max_grad_norm, skip_nonfinite);
    });
  }
};

/// The update of a shard with gradients of type G and parameters of type P, one element per
/// thread and grid stride; nothing when `s->skipped`.
template <class G, class P>
struct update_kernel {
  static constexpr const char* kernel_name = "update_kernel";
  shard_update u;
  const step_scalars* s;

  template <class Block>
  RINGZERO_HOST_DEVICE void operator()(Block& b) const {
    const std::uint64_t threads = b.block_threads();
    const std::uint64_t stride = b.grid_blocks() * threads;
    b.for_each_thread([&](std::uint64_t t) {
      if (s->skipped != 0) return;
      // Local copies: the stores below (floats) cannot change them, so they stay in registers.
      const zero::update_rule r = u.rule;
      const std::uint64_t n = u.count;
      const float scale = static_cast<float>(s->gradient_multiplier);
      const G* g = static_cast<const G*>(u.grads);
      float* const master = u.master;
      float* w = master != nullptr ? master : static_cast<float*>(u.params);
      P* p = static_cast<P*>(u.params);
      float* const s0 = u.s0;
      float* const s1 = u.s1;
      for (std::uint64_t j = b.block_index() * threads + t; j < n; j += stride) {
        float wj = w[j];
        zero::detail::update_element(r, wj, zero::detail::f_mul(as_float(g[j]), scale), s0, s1, j);
        w[j] = wj;
        if (master != nullptr) p[j] = pk::arithmetic_result<P>(wj);
      }
    });
  }
};

/// Blocks for `n` elements at one per thread, at least 1 and at most `most`.
inline std::uint64_t blocks_for(std::uint64_t n, std::uint64_t most) noexcept {
  const std::uint64_t b = (n + step_threads - 1) / step_threads;
  return b < most ? (b == 0 ? 1 : b) : most;
}

/// Calls `f.template operator()<T>()` with T the float type of `type`; false for another type.
template <class F>
inline bool visit_float_type(dtype type, F&& f) {
  if (type == dtype::float32) {
    f.template operator()<float>();
  } else if (type == dtype::bfloat16) {
    f.template operator()<bfloat16>();
  } else if (type == dtype::float16) {
    f.template operator()<float16>();
  } else {
    return false;
  }
  return true;
}

/// `*sum += ` the float64 sum of squares of `count` values of `type` (float32, bfloat16,
/// float16), with `partials` (`sum_of_squares_partials` float64) as scratch, by `launcher`:
/// `launch_invalid_value` for another type.
template <class Launcher>
int add_sum_of_squares(const Launcher& launcher, double* sum, const void* values, std::uint64_t count, dtype type,
                       double* partials) noexcept {
  if (count == 0) return pk::launch_success;
  const std::uint64_t blocks = blocks_for(count, sum_of_squares_partials);
  int rc = pk::launch_invalid_value;
  visit_float_type(type, [&]<class T>() {
    rc = launcher.launch(squares_partials_kernel<T>{static_cast<const T*>(values), count, partials}, blocks,
                         step_threads);
  });
  if (rc != pk::launch_success) return rc;
  return launcher.launch(squares_finish_kernel{partials, blocks, sum}, 1, step_threads);
}

/// `detail::decide_step(*scalars, ...)` by `launcher` (one thread).
template <class Launcher>
int decide_step(const Launcher& launcher, step_scalars* scalars, double max_grad_norm, bool skip_nonfinite) noexcept {
  return launcher.launch(decide_step_kernel{scalars, max_grad_norm, skip_nonfinite}, 1, 1);
}

/// The update `u` with the gradients multiplied by `scalars->gradient_multiplier`, nothing when
/// `scalars->skipped`, by `launcher`: `launch_invalid_value` for a gradient or parameter type
/// other than float32, bfloat16, float16, or 16-bit parameters without master weights.
template <class Launcher>
int update_shard(const Launcher& launcher, const shard_update& u, const step_scalars* scalars) noexcept {
  if (u.count == 0) return pk::launch_success;
  if (u.master == nullptr && u.param_type != dtype::float32) return pk::launch_invalid_value;
  const bool one_thread = pk::runs_sequentially(launcher);  // the host stream: elements in order
  const std::uint64_t blocks = one_thread ? 1 : blocks_for(u.count, 8192);
  int rc = pk::launch_invalid_value;
  visit_float_type(u.gradient_type, [&]<class G>() {
    visit_float_type(u.param_type, [&]<class P>() {
      rc = launcher.launch(update_kernel<G, P>{u, scalars}, blocks, one_thread ? 1u : step_threads);
    });
  });
  return rc;
}

}  // namespace ringzero::zero::kernels
