#pragma once
/// @file
/// `zero::optimizer_kernels`: the CUDA kernels of the ZeRO step and of quantized communication
/// (zero/optimizer_kernels.cuh)
/// behind a table of plain function pointers, so that `cuda_execution_stream` (compiled by the
/// host compiler) can enqueue them. Registered, like primitive/device_primitives.hpp's table,
/// by the one .cu file of a program that includes <ringzero/cuda.cuh>.
/// Thread semantics: registration and lookup are atomic; each function enqueues on the stream
/// it is given (a cudaStream_t) on the calling thread's current device, returns the launch's
/// cudaError_t (0 on success) and never blocks the host.

#include <atomic>
#include <cstdint>

#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/zero/quantization.hpp"
#include "ringzero/zero/shard_update.hpp"

namespace ringzero::zero {

/// Blocks of the first pass of the sum of squares (the partials a stream provides, float64 each).
inline constexpr std::uint32_t sum_of_squares_partials = 256;

/// The step's kernels as function pointers (see the file comment).
struct optimizer_kernels {
  /// `*sum += ` the float64 sum of squares of `count` float32/bfloat16/float16 `values` (each
  /// converted to float32 first), by a block reduction into `partials`
  /// (`sum_of_squares_partials` float64 of device memory, used as scratch) and a second pass.
  int (*add_sum_of_squares)(double* sum, const void* values, std::uint64_t count, dtype type, double* partials,
                            void* stream) noexcept = nullptr;
  /// `detail::decide_step(*s, max_grad_norm, skip_nonfinite)` on the device (one thread).
  int (*decide_step)(step_scalars* s, double max_grad_norm, bool skip_nonfinite, void* stream) noexcept = nullptr;
  /// `detail::update_shard(u, float(s->gradient_multiplier))` as one element-wise kernel, nothing
  /// when `s->skipped` (read on the device).
  int (*update_shard)(const shard_update& u, const step_scalars* s, void* stream) noexcept = nullptr;
  /// `kernels::quantize_segments` (zero/quantize_kernels.hpp) on the device.
  int (*quantize_segments)(const quantized_layout& l, const void* values, dtype type, void* out,
                           void* stream) noexcept = nullptr;
  /// `kernels::dequantize_segments` (zero/quantize_kernels.hpp) on the device.
  int (*dequantize_segments)(const quantized_layout& l, const void* in, void* values, dtype type, bool average,
                             std::uint32_t own, const void* own_values, void* stream) noexcept = nullptr;
};

namespace detail {
inline std::atomic<const optimizer_kernels*>& optimizer_kernels_slot() noexcept {
  static std::atomic<const optimizer_kernels*> slot{nullptr};
  return slot;
}
}  // namespace detail

/// Registers `table` for the whole program (a static table; the last registration wins).
inline void register_optimizer_kernels(const optimizer_kernels* table) noexcept {
  detail::optimizer_kernels_slot().store(table, std::memory_order_release);
}

/// The registered table; throws errc::unsupported when no file of the program included
/// <ringzero/cuda.cuh>.
inline const optimizer_kernels& require_optimizer_kernels() {
  const optimizer_kernels* k = detail::optimizer_kernels_slot().load(std::memory_order_acquire);
  if (k == nullptr)
    throw error(errc::unsupported,
                "zero::sharded_model on a CUDA stream: no optimizer kernels are registered in this program: compile "
                "one .cu file (with nvcc) that includes <ringzero/cuda.cuh>");
  return *k;
}

}  // namespace ringzero::zero
