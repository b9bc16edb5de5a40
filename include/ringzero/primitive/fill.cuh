#pragma once
/// @file
/// CUDA `fill`: sets `count` elements of a dtype to a value on a stream, writing exactly the
/// bits of the host's `fill` (primitive/fill.hpp: the float64 value converted with the cast
/// rules, computed once on the host). 16-byte vector stores with a scalar head and tail
/// (primitive/elementwise.cuh). Asynchronous on `stream`; returns the launch's cudaError_t.
/// Requires nvcc.

#if !defined(__CUDACC__)
#error "ringzero/primitive/fill.cuh contains CUDA kernels: include it only from a .cu file compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>

#include "ringzero/primitive/elementwise.cuh"
#include "ringzero/primitive/fill.hpp"

namespace ringzero::primitive::device {

/// Sets `count` elements of `type` at `dst` to `value` converted to `type`, enqueued on
/// `stream`. Returns cudaErrorInvalidValue for an invalid dtype.
inline cudaError_t fill(void* dst, std::uint64_t count, dtype type, double value, cudaStream_t stream) noexcept {
  if (!is_valid(type)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const std::uint64_t bits = element_pattern(type, value);
  switch (dtype_size(type)) {
    case 1:
      return detail::launch_generate(static_cast<std::uint8_t*>(dst), count, static_cast<std::uint8_t>(bits), stream);
    case 2:
      return detail::launch_generate(static_cast<std::uint16_t*>(dst), count, static_cast<std::uint16_t>(bits), stream);
    case 4:
      return detail::launch_generate(static_cast<std::uint32_t*>(dst), count, static_cast<std::uint32_t>(bits), stream);
    default: return detail::launch_generate(static_cast<std::uint64_t*>(dst), count, bits, stream);
  }
}

}  // namespace ringzero::primitive::device
