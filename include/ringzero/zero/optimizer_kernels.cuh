#pragma once
/// @file
/// The CUDA kernels of the ZeRO step and their table (zero/optimizer_kernels.hpp), registered
/// when the program starts: the float64 sum of squares of a gradient shard (a block reduction
/// into per-block partials, then one block adds their sum to the total), the step's decision
/// (`detail::decide_step`, one thread) and the update of a shard (`detail::update_element` per
/// element, the parameters written back rounded to their type; nothing when the decision says
/// skipped). The update's arithmetic is the host's, operation for operation and unfused
/// (zero/shard_update.hpp), so it gives the host's bits for the same clip coefficient; the sum
/// of squares adds in another order than the host's loop (float64 rounding apart).
/// Included by <ringzero/cuda.cuh>; requires nvcc.

#if !defined(__CUDACC__)
#error "ringzero/zero/optimizer_kernels.cuh contains CUDA kernels: include it only from a .cu file compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ringzero/primitive/arithmetic.cuh"
#include "ringzero/zero/optimizer_kernels.hpp"
#include "ringzero/zero/shard_update.hpp"

namespace ringzero::zero::device::detail {

inline constexpr unsigned step_threads = 256;
static_assert(sum_of_squares_partials <= step_threads, "the second pass sums the partials in one block");

template <class T>
__device__ inline float as_float(T x) {
  return primitive::device::detail::arithmetic_value(x);
}

/// The block's float64 sum of `value` over its threads (a fixed tree: deterministic).
__device__ inline double block_sum(double value) {
  __shared__ double part[step_threads];
  part[threadIdx.x] = value;
  __syncthreads();
  for (unsigned w = step_threads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] = __dadd_rn(part[threadIdx.x], part[threadIdx.x + w]);
    __syncthreads();
  }
  return part[0];
}

template <class T>
__global__ void __launch_bounds__(step_threads) squares_partials_kernel(const T* x, std::uint64_t n, double* partials) {
  double s = 0;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * step_threads;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * step_threads + threadIdx.x; j < n; j += stride) {
    const double v = static_cast<double>(as_float(x[j]));
    s = __dadd_rn(s, __dmul_rn(v, v));
  }
  const double total = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(step_threads)
    squares_finish_kernel(const double* partials, unsigned blocks, double* sum) {
  const double total = block_sum(threadIdx.x < blocks ? partials[threadIdx.x] : 0.0);
  if (threadIdx.x == 0) *sum = __dadd_rn(*sum, total);
}

__global__ void decide_step_kernel(step_scalars* s, double max_grad_norm, bool skip_nonfinite) {
  zero::detail::decide_step(*s, max_grad_norm, skip_nonfinite);
}

template <class G, class P>
__global__ void __launch_bounds__(step_threads) update_kernel(shard_update u, const step_scalars* s) {
  if (s->skipped != 0) return;
  const float scale = __double2float_rn(s->gradient_multiplier);
  const G* g = static_cast<const G*>(u.grads);
  float* w = u.master != nullptr ? u.master : static_cast<float*>(u.params);
  P* p = static_cast<P*>(u.params);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * step_threads;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * step_threads + threadIdx.x; j < u.count;
       j += stride) {
    float wj = w[j];
    zero::detail::update_element(u.rule, wj, zero::detail::f_mul(as_float(g[j]), scale), u.s0, u.s1, j);
    w[j] = wj;
    if (u.master != nullptr) p[j] = primitive::device::detail::arithmetic_result<P>(wj);
  }
}

inline unsigned blocks_for(std::uint64_t n, std::uint64_t most) noexcept {
  const std::uint64_t b = (n + step_threads - 1) / step_threads;
  return static_cast<unsigned>(b < most ? (b == 0 ? 1 : b) : most);
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

inline int table_add_sum_of_squares(double* sum, const void* values, std::uint64_t count, dtype type, double* partials,
                                    void* stream) noexcept {
  if (count == 0) return 0;
  const unsigned blocks = blocks_for(count, sum_of_squares_partials);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool known = visit_float_type(type, [&]<class T>() {
    squares_partials_kernel<T><<<blocks, step_threads, 0, s>>>(static_cast<const T*>(values), count, partials);
  });
  if (!known) return static_cast<int>(cudaErrorInvalidValue);
  squares_finish_kernel<<<1, step_threads, 0, s>>>(partials, blocks, sum);
  return static_cast<int>(cudaGetLastError());
}

inline int table_decide_step(step_scalars* scalars, double max_grad_norm, bool skip_nonfinite, void* stream) noexcept {
  decide_step_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(scalars, max_grad_norm, skip_nonfinite);
  return static_cast<int>(cudaGetLastError());
}

inline int table_update_shard(const shard_update& u, const step_scalars* scalars, void* stream) noexcept {
  if (u.count == 0) return 0;
  if (u.master == nullptr && u.param_type != dtype::float32) return static_cast<int>(cudaErrorInvalidValue);
  const unsigned blocks = blocks_for(u.count, 8192);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  bool known = false;
  visit_float_type(u.gradient_type, [&]<class G>() {
    known = visit_float_type(u.param_type,
                             [&]<class P>() { update_kernel<G, P><<<blocks, step_threads, 0, s>>>(u, scalars); });
  });
  if (!known) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaGetLastError());
}

/// The program-wide table of the step's kernels.
inline constexpr optimizer_kernels cuda_optimizer_kernels_table{&table_add_sum_of_squares, &table_decide_step,
                                                                &table_update_shard};

/// Registers the table when the program starts.
inline const bool cuda_optimizer_kernels_registered = (register_optimizer_kernels(&cuda_optimizer_kernels_table), true);

}  // namespace ringzero::zero::device::detail

namespace ringzero::zero {

/// Registers the step's CUDA kernels of this program (idempotent; normally done when the
/// program starts).
inline void register_cuda_optimizer_kernels() noexcept {
  register_optimizer_kernels(&device::detail::cuda_optimizer_kernels_table);
}

}  // namespace ringzero::zero
