#pragma once
/// @file
/// The table of the ZeRO step's CUDA kernels (zero/optimizer_kernels.hpp) filled with the
/// bodies of zero/step_kernels.hpp launched by `cuda_launcher`, registered when the program
/// starts. Included by <ringzero/cuda.cuh>; requires nvcc.

#if !defined(__CUDACC__)
#error "ringzero/zero/optimizer_kernels.cuh contains CUDA kernels: include it only from a .cu file compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include "ringzero/primitive/cuda_launch.cuh"
#include "ringzero/zero/optimizer_kernels.hpp"
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

/// The program-wide table of the step's kernels.
inline constexpr optimizer_kernels cuda_optimizer_kernels_table{&table_add_sum_of_squares, &table_decide_step,
                                                                &table_update_shard};

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
