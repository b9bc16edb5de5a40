#pragma once
/// @file
/// CUDA `scale`: `dst[i] = scalar * src[i]` on a stream with premul_sum's arithmetic, exactly
/// as the host's `scale_into` (primitive/reduce.hpp): floating types multiply in their compute
/// type (float32 for float16/bfloat16, rounded once), integer types multiply by the integral
/// scalar with wrapping. And CUDA `divide`: `dst[i] = src[i] / divisor` with avg's arithmetic,
/// the same bits as the host's `divide_into` (floats: the correctly rounded quotient, not a
/// product with the reciprocal; integers: `/`, truncating toward zero, computed by a
/// multiply-high, primitive/invariant_division.hpp). A NaN result's payload is the hardware's
/// (primitive/arithmetic.cuh), as for every arithmetic primitive. `dst` may equal `src`.
/// 16-byte vectorised (primitive/elementwise.cuh). Asynchronous on `stream`; returns the launch's cudaError_t.
/// Requires nvcc.

#if !defined(__CUDACC__)
#error "ringzero/primitive/scale.cuh contains CUDA kernels: include it only from a .cu file compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>

#include "ringzero/primitive/arithmetic.cuh"
#include "ringzero/primitive/elementwise.cuh"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::primitive::device {

namespace detail {

/// One element of the host's `scale_typed`.
template <class T>
struct scale_element {
  primitive::detail::compute_t<T> scalar;

  __device__ T operator()(T x) const {
    namespace h = primitive::detail;
    return arithmetic_result<T>(h::mul(arithmetic_value(x), scalar));
  }
};

/// One element of the host's `divide_typed`.
template <class T>
struct divide_element {
  primitive::detail::prepared_divisor<primitive::detail::compute_t<T>> divisor;

  __device__ T operator()(T x) const {
    namespace h = primitive::detail;
    return arithmetic_result<T>(h::divide(arithmetic_value(x), divisor));
  }
};

}  // namespace detail

/// `dst[i] = scalar * src[i]` for `i < count` elements of `type`, enqueued on `stream`.
/// Returns cudaErrorInvalidValue for an invalid dtype.
inline cudaError_t scale(void* dst, const void* src, std::uint64_t count, dtype type, double scalar,
                         cudaStream_t stream) noexcept {
  if (!is_valid(type)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  return visit_dtype(type, [&]<class T>() -> cudaError_t {
    const detail::scale_element<T> f{primitive::detail::scalar_as<primitive::detail::compute_t<T>>(scalar)};
    return detail::launch_unary(static_cast<T*>(dst), static_cast<const T*>(src), count, f, stream);
  });
}

/// `dst[i] = src[i] / divisor` for `i < count` elements of `type`, enqueued on `stream`.
/// Returns cudaErrorInvalidValue for an invalid dtype or a divisor below 1.
inline cudaError_t divide(void* dst, const void* src, std::uint64_t count, dtype type, std::int64_t divisor,
                          cudaStream_t stream) noexcept {
  if (!is_valid(type) || divisor < 1) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  return visit_dtype(type, [&]<class T>() -> cudaError_t {
    const detail::divide_element<T> f{primitive::detail::prepare_divisor<primitive::detail::compute_t<T>>(divisor)};
    return detail::launch_unary(static_cast<T*>(dst), static_cast<const T*>(src), count, f, stream);
  });
}

}  // namespace ringzero::primitive::device
