#pragma once
/// @file
/// CUDA `cast`: converts `count` elements between any two dtypes on a stream, with exactly the
/// rules of the host's `cast_into` (primitive/cast.hpp, whose `detail::convert` it calls):
/// round to nearest even into floating types (16-bit floats through float32, as PyTorch),
/// truncate and saturate into integers (NaN -> 0), wrap between integers. The same dtype is a
/// device copy. 16-byte vectorised on the narrower side (primitive/elementwise.cuh).
/// Asynchronous on `stream`; returns the launch's cudaError_t. Requires nvcc.

#if !defined(__CUDACC__)
#error "ringzero/primitive/cast.cuh contains CUDA kernels: include it only from a .cu file compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/elementwise.cuh"

namespace ringzero::primitive::device {

namespace detail {

/// One element of the host's `cast_typed`.
template <class To, class From>
struct cast_element {
  __device__ To operator()(From x) const { return primitive::detail::convert<To>(x); }
};

}  // namespace detail

/// Converts `count` elements of `src_type` at `src` into `dst_type` at `dst`, enqueued on
/// `stream`. `dst` and `src` must not overlap unless equal with the same element size.
/// Returns cudaErrorInvalidValue for an invalid dtype.
inline cudaError_t cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::uint64_t count,
                        cudaStream_t stream) noexcept {
  if (!is_valid(dst_type) || !is_valid(src_type)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  return visit_dtype(dst_type, [&]<class To>() -> cudaError_t {
    return visit_dtype(src_type, [&]<class From>() -> cudaError_t {
      if constexpr (std::is_same_v<To, From>) {
        if (dst == src) return cudaSuccess;
        return cudaMemcpyAsync(dst, src, count * sizeof(To), cudaMemcpyDefault, stream);
      } else {
        return detail::launch_unary(static_cast<To*>(dst), static_cast<const From*>(src), count,
                                    detail::cast_element<To, From>{}, stream);
      }
    });
  });
}

}  // namespace ringzero::primitive::device
