#pragma once
/// @file
/// The table of the ZeRO step's CUDA kernels (zero/optimizer_kernels.hpp) filled with the
/// bodies of zero/step_kernels.hpp and zero/quantize_kernels.hpp launched by `cuda_launcher`, registered when the
/// program starts. Included by <ringzero/cuda.cuh>; requires nvcc.

#if !defined(__CUDACC__)
#error "ringzero/zero/optimizer_kernels.cuh contains CUDA kernels: include it only from a .cu file compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include "ringzero/primitive/cuda_launch.cuh"
#include "ringzero/zero/optimizer_kernels.hpp"
#include "ringzero/zero/quantize_kernels.hpp"
#include "ringzero/zero/step_kernels.hpp"

namespace ringzero::zero::kernels {

inline int table_add_sum_of_squares(double* sum, const void* values, std::uint64_t count, dtype type, double* partials,
                                    void* stream) noexcept {
  return add_sum_of_squares(pk::cuda_launcher{static_cast<cudaStream_t>(stream)}, sum, values, count, type, partials);
}
inline int table_decide_step(step_scalars* scalars, double max_grad_norm, bool skip_nonfinite, void* stream) noexcept {
  return decide_step(pk::cuda_launcher{static_cast<cudaStream_t>(stream)}, scalars, max_grad_norm, skip_nonfinite);
}
inline int table_update_shard(const shard_update& u, const step_scalars* scalars, void* stream) noexcept {
  return update_shard(pk::cuda_launcher{static_cast<cudaStream_t>(stream)}, u, scalars);
}

inline int table_quantize_segments(const quantized_layout& l, const void* values, dtype type, void* out,
                                   void* stream) noexcept {
  return quantize_segments(pk::cuda_launcher{static_cast<cudaStream_t>(stream)}, l, values, type, out);
}
inline int table_dequantize_segments(const quantized_layout& l, const void* in, void* values, dtype type, bool average,
                                     std::uint32_t own, const void* own_values, void* stream) noexcept {
  return dequantize_segments(pk::cuda_launcher{static_cast<cudaStream_t>(stream)}, l, in, values, type, average, own,
                             own_values);
}

/// The program-wide table of the step's kernels.
inline constexpr optimizer_kernels cuda_optimizer_kernels_table{&table_add_sum_of_squares, &table_decide_step,
                                                                &table_update_shard, &table_quantize_segments,
                                                                &table_dequantize_segments};

/// Registers the table when the program starts.
inline const bool cuda_optimizer_kernels_registered = (register_optimizer_kernels(&cuda_optimizer_kernels_table), true);

}  // namespace ringzero::zero::kernels

namespace ringzero::zero {

/// Registers the step's CUDA kernels of this program (idempotent; normally done when the
/// program starts).
inline void register_cuda_optimizer_kernels() noexcept {
  register_optimizer_kernels(&kernels::cuda_optimizer_kernels_table);
}

}  // namespace ringzero::zero
