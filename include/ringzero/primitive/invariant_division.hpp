#pragma once
/// @file
/// Unsigned integer division by a divisor that stays the same for many dividends (avg's world
/// size), as one multiply-high, a subtraction, an addition and two shifts instead of a division:
/// the method of T. Granlund and P. L. Montgomery, "Division by Invariant Integers using
/// Multiplication", PLDI 1994, Figure 4.1 (N-bit dividends, any divisor 1 <= d < 2^N):
///
///     l = ceil(log2 d),  m = floor(2^N (2^l - d) / d) + 1  (fits in N bits),
///     t = floor(m * n / 2^N),  q = (t + ((n - t) >> min(l, 1))) >> max(l - 1, 0)  = floor(n / d).
///
/// GPUs have no integer divider (a 32-bit division is a routine of about twenty instructions,
/// a 64-bit one a call), so avg and divide of integer types use this on the device; the host
/// runs the same code in the tests (tests/primitive/test_invariant_division.cpp checks it against
/// the `/` operator). `prepare_invariant_divisor` runs on the host, `divide_invariant` on both.
/// Thread safety: pure functions.

#include <bit>
#include <cstdint>
#include <type_traits>

#include "ringzero/core/config.hpp"

namespace ringzero::primitive::detail {

/// A divisor prepared for `divide_invariant`; U is std::uint32_t or std::uint64_t (the width N
/// of the dividends). The default divides every dividend below 2^N into 0 (multiplier 0, total
/// shift N - 1 after halving): `prepare_invariant_divisor` returns it for divisors >= 2^N.
template <class U>
struct invariant_divisor {
  static_assert(std::is_same_v<U, std::uint32_t> || std::is_same_v<U, std::uint64_t>);
  U multiplier = 0;
  unsigned shift_1 = 1;
  unsigned shift_2 = sizeof(U) * 8 - 1;
};

/// The high N bits of the 2N-bit product `a * b`.
RINGZERO_HOST_DEVICE inline std::uint32_t mul_high(std::uint32_t a, std::uint32_t b) noexcept {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(a) * b) >> 32);
#endif
}

/// The high 64 bits of the 128-bit product `a * b`.
RINGZERO_HOST_DEVICE inline std::uint64_t mul_high(std::uint64_t a, std::uint64_t b) noexcept {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  __extension__ using wide = unsigned __int128;
  return static_cast<std::uint64_t>((static_cast<wide>(a) * b) >> 64);
#endif
}

/// `divisor` prepared for N-bit dividends (N = bits of U). Precondition: divisor >= 1. Divisors
/// of 2^N and above give the default (every quotient 0). Host only.
template <class U>
inline invariant_divisor<U> prepare_invariant_divisor(std::uint64_t divisor) noexcept {
  constexpr unsigned bits = sizeof(U) * 8;
  invariant_divisor<U> r;
  if (divisor == 0 || (bits < 64 && divisor >> (bits % 64) != 0)) return r;
  const U d = static_cast<U>(divisor);
  const unsigned l = static_cast<unsigned>(std::bit_width(static_cast<U>(d - 1)));  // ceil(log2 d)
  __extension__ using wide = unsigned __int128;                                     // (2^l - d) 2^N < d 2^N <= 2^(2N)
  const wide m = ((((static_cast<wide>(1) << l) - d) << bits) / d) + 1;
  r.multiplier = static_cast<U>(m);
  r.shift_1 = l < 1 ? l : 1;
  r.shift_2 = l > 1 ? l - 1 : 0;
  return r;
}

/// floor(n / d) for the divisor `d` was prepared from (any n of U).
template <class U>
RINGZERO_HOST_DEVICE inline U divide_invariant(U n, const invariant_divisor<U>& d) noexcept {
  const U t = mul_high(d.multiplier, n);
  return (t + ((n - t) >> d.shift_1)) >> d.shift_2;
}

}  // namespace ringzero::primitive::detail
