#pragma once
/// @file
/// The CUDA `scale` kernel: `dst[i] = scalar * src[i]` by a launcher (primitive/kernels/grid.hpp:
/// a CUDA stream, or the host in CI) with premul_sum's arithmetic, exactly
/// as the host's `scale_into` (primitive/reduce.hpp): floating types multiply in their compute
/// type (float32 for float16/bfloat16, rounded once), integer types multiply by the integral
/// scalar with wrapping. And CUDA `divide`: `dst[i] = src[i] / divisor` with avg's arithmetic,
/// the same bits as the host's `divide_into` (floats: the correctly rounded quotient, not a
/// product with the reciprocal; integers: `/`, truncating toward zero, computed by a
/// multiply-high, primitive/invariant_division.hpp). A NaN result's payload is the hardware's
/// (primitive/kernels/arithmetic.hpp), as for every arithmetic primitive. `dst` may equal
/// `src`. 16-byte vectorised (primitive/kernels/elementwise.hpp). Returns the launcher's result.

#include <cstdint>

#include "ringzero/core/config.hpp"
#include "ringzero/primitive/kernels/arithmetic.hpp"
#include "ringzero/primitive/kernels/elementwise.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::primitive::kernels {

/// One element of the host's `scale_typed`.
template <class T>
struct scale_element {
  primitive::detail::compute_t<T> scalar;

  RINGZERO_HOST_DEVICE T operator()(T x) const {
    namespace h = primitive::detail;
    return arithmetic_result<T>(h::mul(arithmetic_value(x), scalar));
  }
};

/// One element of the host's `divide_typed`.
template <class T>
struct divide_element {
  primitive::detail::prepared_divisor<primitive::detail::compute_t<T>> divisor;

  RINGZERO_HOST_DEVICE T operator()(T x) const {
    namespace h = primitive::detail;
    return arithmetic_result<T>(h::divide(arithmetic_value(x), divisor));
  }
};

/// `dst[i] = scalar * src[i]` for `i < count` elements of `type`, by `launcher`.
/// Returns `launch_invalid_value` for an invalid dtype.
template <class Launcher>
int scale(const Launcher& launcher, void* dst, const void* src, std::uint64_t count, dtype type,
          double scalar) noexcept {
  if (!is_valid(type)) return launch_invalid_value;
  if (count == 0) return launch_success;
  return visit_dtype(type, [&]<class T>() -> int {
    const scale_element<T> f{primitive::detail::scalar_as<primitive::detail::compute_t<T>>(scalar)};
    return launch_unary(launcher, static_cast<T*>(dst), static_cast<const T*>(src), count, f);
  });
}

/// `dst[i] = src[i] / divisor` for `i < count` elements of `type`, by `launcher`.
/// Returns `launch_invalid_value` for an invalid dtype or a divisor below 1.
template <class Launcher>
int divide(const Launcher& launcher, void* dst, const void* src, std::uint64_t count, dtype type,
           std::int64_t divisor) noexcept {
  if (!is_valid(type) || divisor < 1) return launch_invalid_value;
  if (count == 0) return launch_success;
  return visit_dtype(type, [&]<class T>() -> int {
    const divide_element<T> f{primitive::detail::prepare_divisor<primitive::detail::compute_t<T>>(divisor)};
    return launch_unary(launcher, static_cast<T*>(dst), static_cast<const T*>(src), count, f);
  });
}

}  // namespace ringzero::primitive::kernels
