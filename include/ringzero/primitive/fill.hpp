#pragma once
/// @file
/// Host fill: `zero_bytes(dst, bytes)` (memset); `fill(dst, count, type, value)`, which sets
/// `count` elements of `type` to `value` converted with the rules of primitive/cast.hpp (a
/// float64 converted to the element type); and
/// `element_pattern`, the bit pattern that conversion gives (the CUDA fill of
/// primitive/kernels/fill.hpp writes exactly this pattern).
///
/// Counts are in elements. Thread safety: pure. Determinism: a pure function of its arguments.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ringzero/core/dtype.hpp"
#include "ringzero/primitive/cast.hpp"

namespace ringzero::primitive {

/// The bits of `value` converted to `type` (float64 -> `type` under the cast rules), in the low
/// `dtype_size(type)` bytes of the result. Precondition: `type` valid.
inline std::uint64_t element_pattern(dtype type, double value) noexcept {
  std::uint64_t bits = 0;
  visit_dtype(type, [&]<class T>() {
    const T x = detail::convert<T>(value);
    std::memcpy(&bits, &x, sizeof(T));  // little-endian: the element's bytes first
  });
  return bits;
}

/// Sets `bytes` bytes at `dst` to zero (memset). Precondition: `dst` non-null when bytes > 0.
inline void zero_bytes(void* dst, std::size_t bytes) noexcept {
  if (bytes != 0) std::memset(dst, 0, bytes);
}

/// Sets `count` elements of `type` at `dst` to `value` converted to `type`.
/// Preconditions: valid `type`; `dst` non-null when count > 0. Never throws.
inline void fill(void* dst, std::uint64_t count, dtype type, double value) noexcept {
  if (count == 0) return;
  if (value == 0 && !std::signbit(value) && is_valid(type)) {  // +0 is all zero bits in every dtype
    std::memset(dst, 0, static_cast<std::size_t>(count * dtype_size(type)));
    return;
  }
  visit_dtype(type, [&]<class T>() {
    const T x = detail::convert<T>(value);
    T* d = static_cast<T*>(dst);
    for (std::uint64_t i = 0; i < count; ++i) d[i] = x;
  });
}

}  // namespace ringzero::primitive
