#pragma once
/// @file
/// Host element-type conversion: `cast_into(dst, dst_type, src, src_type, count)` converts
/// `count` elements between any two dtypes, with one definition of every conversion shared by
/// the host loop and the CUDA kernel (primitive/kernels/cast.hpp calls the same `detail::convert`).
///
/// Rules (every case is defined; nothing is undefined behaviour):
/// - To float32 / float64: integers and wider floats round to nearest, ties to even.
/// - To float16 / bfloat16: the value is first converted to float32 (as above), then rounded
///   to nearest even once more: the double rounding PyTorch's `c10::Half` / `c10::BFloat16`
///   constructors perform. NaN stays NaN (payload kept where it fits), overflow gives infinity.
/// - Floating to integer: truncation toward zero, saturated to the target's range, NaN -> 0
///   (the result CUDA's `cvt.rzi.sat` instructions give; C++ leaves these cases undefined).
/// - Integer to integer: modulo 2^bits of the target (two's complement), as C++20 defines it.
/// Counts are in elements; `dst` and `src` must not overlap unless they are the same pointer
/// with the same element size. Thread safety: pure. Determinism: a pure bit function.

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ringzero/core/config.hpp"
#include "ringzero/core/dtype.hpp"

namespace ringzero::primitive {

namespace detail {

template <class T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

/// A floating value `x` truncated toward zero into integer type `To`, saturated, NaN -> 0.
template <class To, class From>
RINGZERO_HOST_DEVICE inline To float_to_integer(From x) noexcept {
  if (!(x == x)) return To{0};
  constexpr int digits = std::numeric_limits<To>::digits;  // 7, 8, 31, 32, 63 or 64
  // 2^digits, the first value above the range, is exact in float and double.
  constexpr From limit = static_cast<From>(2.0) * static_cast<From>(std::uint64_t{1} << (digits - 1));
  // The range's ends, spelled without std::numeric_limits' functions (host-only in CUDA).
  constexpr To highest = static_cast<To>(static_cast<std::make_unsigned_t<To>>(~std::uint64_t{0} >> (64 - digits)));
  if (x >= limit) return highest;
  if constexpr (std::is_signed_v<To>) {
    if (x <= -limit) return static_cast<To>(-highest - 1);
  } else {
    if (x <= static_cast<From>(-1.0)) return To{0};
  }
  return static_cast<To>(x);  // in range: C++ truncates toward zero
}

/// One element of type `From` as type `To` (see the file comment for the rules).
template <class To, class From>
RINGZERO_HOST_DEVICE inline To convert(From x) noexcept {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (is_16bit_float_v<From>) {
    return convert<To>(static_cast<float>(x));  // exact widening, then the float32 rules
  } else if constexpr (is_16bit_float_v<To>) {
    return To(convert<float>(x));  // to float32 first, then one more rounding (as PyTorch)
  } else if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(x);  // round to nearest even (or exact)
  } else if constexpr (std::is_floating_point_v<From>) {
    return float_to_integer<To>(x);
  } else {
    return static_cast<To>(x);  // integer to integer: modulo 2^bits
  }
}

template <class To, class From>
void cast_typed(To* dst, const From* src, std::uint64_t n) noexcept {
  for (std::uint64_t i = 0; i < n; ++i) dst[i] = convert<To>(src[i]);
}

}  // namespace detail

/// Converts `count` elements of `src_type` at `src` into `dst_type` at `dst` (rules in the file
/// comment). The same type copies the bytes. Preconditions: valid dtypes; non-null pointers when
/// count > 0; no overlap except `dst == src` with equal element sizes. Never throws.
inline void cast_into(void* dst, dtype dst_type, const void* src, dtype src_type, std::uint64_t count) noexcept {
  if (count == 0) return;
  if (dst_type == src_type) {
    if (dst != src) std::memmove(dst, src, static_cast<std::size_t>(count * dtype_size(dst_type)));
    return;
  }
  visit_dtype(dst_type, [&]<class To>() {
    visit_dtype(src_type, [&]<class From>() {
      detail::cast_typed<To, From>(static_cast<To*>(dst), static_cast<const From*>(src), count);
    });
  });
}

}  // namespace ringzero::primitive
