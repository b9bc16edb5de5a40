#pragma once
/// @file
/// Host element-wise reduction: `reduce_into(dst, a, b, count, spec)` computes
/// `dst[i] = post(pre_a(a[i]) (op) pre_b(b[i]))` for every dtype and reduce kind, and
/// `scale_into` applies premul_sum's multiplier alone.
///
/// This is the only place where values are combined on the CPU, so every algorithm and backend
/// shares one definition of the arithmetic (see core/reduce_op.hpp): integer sums and products
/// wrap, avg divides once at the end (`post`), premul_sum scales each raw input once (`pre`),
/// float16/bfloat16 combine in float32 and round once per combine.
///
/// Counts are in elements; `dst` may be `a` or `b` (in-place accumulation) but must not
/// otherwise overlap them. The loops are written so that the compiler vectorises them.
/// The element functions in `detail` are host-device: the CUDA primitives
/// (primitive/kernels/reduce_into.hpp) call the very same code, so both give the same bits.
/// Thread safety: pure functions of their arguments. Determinism: element-wise, order-free.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ringzero/core/config.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/reduce_op.hpp"
#include "ringzero/primitive/invariant_division.hpp"

namespace ringzero::primitive {

/// What one combine applies. `kind` is one of sum, prod, min, max, avg, premul_sum.
/// - `pre_a` / `pre_b`: multiply that operand by `scalar_a` / `scalar_b` first (premul_sum on a
///   raw input; false when the operand is already a partial result). Honoured for the sum-like
///   kinds (sum, avg, premul_sum); ignored for prod, min and max.
/// - `divisor`: when non-zero, divide the combined value by it (avg, on the combine that
///   produces the final value); integers truncate toward zero. Precondition: not negative (it
///   is a world size; the CUDA `reduce_into` returns cudaErrorInvalidValue for a negative one).
struct reduce_spec {
  dtype type = dtype::float32;
  reduce_kind kind = reduce_kind::sum;
  bool pre_a = false;
  bool pre_b = false;
  double scalar_a = 1.0;
  double scalar_b = 1.0;
  std::int64_t divisor = 0;
};

namespace detail {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

/// The type values are combined in: float for the 16-bit floats, the type itself otherwise.
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

template <class T>
RINGZERO_HOST_DEVICE inline compute_t<T> load(T x) noexcept {
  return static_cast<compute_t<T>>(x);
}

template <class T>
RINGZERO_HOST_DEVICE inline T store(compute_t<T> x) noexcept {
  if constexpr (is_half_v<T>)
    return T(x);
  else
    return x;
}

template <class C>
RINGZERO_HOST_DEVICE inline C add(C a, C b) noexcept {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
#if defined(__CUDA_ARCH__)
    // Explicitly rounded: nvcc would otherwise contract a product and this sum into one FMA,
    // which rounds once where the host rounds twice.
    if constexpr (std::is_same_v<C, float>)
      return __fadd_rn(a, b);
    else
      return __dadd_rn(a, b);
#else
    return a + b;
#endif
  }
}

template <class C>
RINGZERO_HOST_DEVICE inline C mul(C a, C b) noexcept {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    // unsigned char promotes to int: 255 * 255 still fits, and the result is reduced modulo 2^bits.
    return static_cast<C>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<C, float>)
      return __fmul_rn(a, b);
    else
      return __dmul_rn(a, b);
#else
    return a * b;
#endif
  }
}

template <class C>
RINGZERO_HOST_DEVICE inline C min_of(C a, C b) noexcept {
  if constexpr (std::is_floating_point_v<C>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return b < a ? b : a;
}

template <class C>
RINGZERO_HOST_DEVICE inline C max_of(C a, C b) noexcept {
  if constexpr (std::is_floating_point_v<C>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? b : a;
}

template <class C>
RINGZERO_HOST_DEVICE inline C divide(C a, std::int64_t n) noexcept {
  if constexpr (std::is_floating_point_v<C>) {
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<C, float>)
      return __fdiv_rn(a, static_cast<C>(n));
    else
      return __ddiv_rn(a, static_cast<C>(n));
#else
    return a / static_cast<C>(n);
#endif
  } else if constexpr (std::is_signed_v<C>) {
#if defined(__CUDA_ARCH__)
    // Same quotient in 32 bits when both operands fit (GPU 64-bit division is a long routine).
    if constexpr (sizeof(C) <= 4)
      if (n > 0 && n <= 0x7fffffff) return static_cast<C>(static_cast<std::int32_t>(a) / static_cast<std::int32_t>(n));
#endif
    return static_cast<C>(static_cast<std::int64_t>(a) / n);
  } else {
#if defined(__CUDA_ARCH__)
    if constexpr (sizeof(C) <= 4)
      if (n > 0 && n <= 0xffffffff)
        return static_cast<C>(static_cast<std::uint32_t>(a) / static_cast<std::uint32_t>(n));
#endif
    return static_cast<C>(static_cast<std::uint64_t>(a) / static_cast<std::uint64_t>(n));
  }
}

/// The unsigned word an integer compute type divides in: 32 bits up to int32/uint32, else 64.
template <class C>
using division_word_t = std::conditional_t<sizeof(C) <= 4, std::uint32_t, std::uint64_t>;

/// avg's divisor prepared once per launch: its value in a floating compute type (the
/// conversion `divide` would otherwise make per element), for float the divisor and its
/// correctly rounded reciprocal in double (for the device's quotient below), and for integers
/// its multiplier and shifts (primitive/invariant_division.hpp).
template <class C>
struct prepared_divisor {
  C value{};
  C reciprocal{};
  double wide_value = 0;
  double wide_reciprocal = 0;
  invariant_divisor<division_word_t<C>> invariant{};
};

/// `n` prepared for `divide`. Precondition: n >= 0 (a world size; 0, where no division
/// follows, gives a divisor that is never used). Host only.
template <class C>
inline prepared_divisor<C> prepare_divisor(std::int64_t n) noexcept {
  prepared_divisor<C> d;
  if constexpr (std::is_floating_point_v<C>) {
    d.value = static_cast<C>(n);
    d.reciprocal = C(1) / d.value;
    d.wide_value = static_cast<double>(n);
    d.wide_reciprocal = 1.0 / d.wide_value;
  } else {
    d.invariant = prepare_invariant_divisor<division_word_t<C>>(static_cast<std::uint64_t>(n));
  }
  return d;
}

/// `divide(a, n)` with the divisor `n` prepared (`d = prepare_divisor(n)`): the same bits.
/// Precondition: n >= 1.
/// Integers divide their magnitude by multiplication (primitive/invariant_division.hpp) and
/// restore the sign, which truncates toward zero as `/` does; the magnitude of the most
/// negative value is exact in the unsigned word (for sm_90, nvcc 13.0: the int8 avg kernel
/// went from 2488 instructions and 80 registers per thread to 808 and 70, int32 avg from 1264
/// to 400, int8 divide from 1976 to 608).
/// On CUDA devices a float quotient is computed without a division: in double, Markstein's
/// corrected product (q = a*r, e = a - q*n exactly by FMA, q + e*r, r the correctly rounded
/// 1/n) is the correctly rounded a/n in double, since no float operand can overflow or
/// underflow it (P. Markstein, IBM J. Res. Dev. 34(1), 1990); rounding that to float gives
/// the correctly rounded float quotient, as double has more than 2*24+2 bits (Figueroa's
/// innocuous double rounding). Zeros and infinities divide by multiplication by 1/n (an H200
/// run caught -0 / 1 coming out as +0 through the corrected product). Checked against a/n
/// on 5e8 floats of both signs (random, subnormal, the whole binade [1, 2)). A full IEEE float
/// division (a call) had made the bfloat16 avg kernel run at half the memory bandwidth.
template <class C>
RINGZERO_HOST_DEVICE inline C divide(C a, const prepared_divisor<C>& d) noexcept {
  if constexpr (std::is_floating_point_v<C>) {
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<C, float>) {
      const double wide = a;
      const double q = __dmul_rn(wide, d.wide_reciprocal);
      const double e = __fma_rn(-q, d.wide_value, wide);
      const float quotient = __double2float_rn(__fma_rn(e, d.wide_reciprocal, q));
      // zeros too (the corrected product would turn -0 into +0) and infinities: a * (1/n)
      return isfinite(a) && a != 0.0f ? quotient : __fmul_rn(a, d.reciprocal);
    } else {
      return __ddiv_rn(a, d.value);
    }
#else
    return a / d.value;
#endif
  } else {
    using U = division_word_t<C>;
    if constexpr (std::is_signed_v<C>) {
      const bool negative = a < 0;
      const U magnitude = negative ? static_cast<U>(U(0) - static_cast<U>(a)) : static_cast<U>(a);
      const U q = divide_invariant(magnitude, d.invariant);
      return static_cast<C>(negative ? static_cast<U>(U(0) - q) : q);
    } else {
      return static_cast<C>(divide_invariant(static_cast<U>(a), d.invariant));
    }
  }
}

/// premul_sum's multiplier in the compute type (integers: the integral value, wrapped).
template <class C>
inline C scalar_as(double s) noexcept {
  if constexpr (std::is_floating_point_v<C>) {
    return static_cast<C>(s);
  } else {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(static_cast<std::uint64_t>(static_cast<std::int64_t>(s))));
  }
}

enum class binary { sum, prod, min, max };

template <binary B, class C>
RINGZERO_HOST_DEVICE inline C apply(C a, C b) noexcept {
  if constexpr (B == binary::sum)
    return add(a, b);
  else if constexpr (B == binary::prod)
    return mul(a, b);
  else if constexpr (B == binary::min)
    return min_of(a, b);
  else
    return max_of(a, b);
}

template <class T, binary B, bool PreA, bool PreB, bool Post>
void combine_loop(T* dst, const T* a, const T* b, std::uint64_t n, compute_t<T> sa, compute_t<T> sb,
                  std::int64_t divisor) noexcept {
  for (std::uint64_t i = 0; i < n; ++i) {
    compute_t<T> x = load(a[i]);
    compute_t<T> y = load(b[i]);
    if constexpr (PreA) x = mul(x, sa);
    if constexpr (PreB) y = mul(y, sb);
    compute_t<T> r = apply<B>(x, y);
    if constexpr (Post) r = divide(r, divisor);
    dst[i] = store<T>(r);
  }
}

template <class T>
void reduce_typed(T* dst, const T* a, const T* b, std::uint64_t n, const reduce_spec& s) noexcept {
  using C = compute_t<T>;
  const C sa = scalar_as<C>(s.scalar_a);
  const C sb = scalar_as<C>(s.scalar_b);
  const std::int64_t d = s.divisor;
  switch (s.kind) {
    case reduce_kind::prod: return combine_loop<T, binary::prod, false, false, false>(dst, a, b, n, sa, sb, d);
    case reduce_kind::min: return combine_loop<T, binary::min, false, false, false>(dst, a, b, n, sa, sb, d);
    case reduce_kind::max: return combine_loop<T, binary::max, false, false, false>(dst, a, b, n, sa, sb, d);
    default: break;  // sum, avg and premul_sum are all sums with optional pre/post steps
  }
  const bool pa = s.pre_a;
  const bool pb = s.pre_b;
  const bool post = d != 0;
  const int variant = (pa ? 4 : 0) | (pb ? 2 : 0) | (post ? 1 : 0);
  switch (variant) {
    case 0: return combine_loop<T, binary::sum, false, false, false>(dst, a, b, n, sa, sb, d);
    case 1: return combine_loop<T, binary::sum, false, false, true>(dst, a, b, n, sa, sb, d);
    case 2: return combine_loop<T, binary::sum, false, true, false>(dst, a, b, n, sa, sb, d);
    case 3: return combine_loop<T, binary::sum, false, true, true>(dst, a, b, n, sa, sb, d);
    case 4: return combine_loop<T, binary::sum, true, false, false>(dst, a, b, n, sa, sb, d);
    case 5: return combine_loop<T, binary::sum, true, false, true>(dst, a, b, n, sa, sb, d);
    case 6: return combine_loop<T, binary::sum, true, true, false>(dst, a, b, n, sa, sb, d);
    default: return combine_loop<T, binary::sum, true, true, true>(dst, a, b, n, sa, sb, d);
  }
}

template <class T>
void scale_typed(T* dst, const T* src, std::uint64_t n, double scalar) noexcept {
  using C = compute_t<T>;
  const C s = scalar_as<C>(scalar);
  for (std::uint64_t i = 0; i < n; ++i) dst[i] = store<T>(mul(load(src[i]), s));
}

template <class T>
void divide_typed(T* dst, const T* src, std::uint64_t n, std::int64_t divisor) noexcept {
  for (std::uint64_t i = 0; i < n; ++i) dst[i] = store<T>(divide(load(src[i]), divisor));
}

}  // namespace detail

/// `dst[i] = post(pre_a(a[i]) op pre_b(b[i]))` for `i < count` (elements of `spec.type`).
/// Preconditions: `spec.type` and `spec.kind` valid; `dst` equals or is disjoint from each of `a`
/// and `b`; pointers non-null when `count > 0`. Never throws.
inline void reduce_into(void* dst, const void* a, const void* b, std::uint64_t count,
                        const reduce_spec& spec) noexcept {
  if (count == 0) return;
  visit_dtype(spec.type, [&]<class T>() {
    detail::reduce_typed<T>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count, spec);
  });
}

/// `dst[i] = scalar * src[i]` (premul_sum's pre-step) with premul_sum's arithmetic for `type`.
/// `dst` may equal `src`. Never throws.
inline void scale_into(void* dst, const void* src, std::uint64_t count, dtype type, double scalar) noexcept {
  if (count == 0) return;
  visit_dtype(type, [&]<class T>() {
    detail::scale_typed<T>(static_cast<T*>(dst), static_cast<const T*>(src), count, scalar);
  });
}

/// `dst[i] = src[i] / divisor` with avg's arithmetic (integers truncate toward zero).
/// `dst` may equal `src`. Precondition: divisor > 0. Never throws.
inline void divide_into(void* dst, const void* src, std::uint64_t count, dtype type, std::int64_t divisor) noexcept {
  if (count == 0) return;
  visit_dtype(type, [&]<class T>() {
    detail::divide_typed<T>(static_cast<T*>(dst), static_cast<const T*>(src), count, divisor);
  });
}

}  // namespace ringzero::primitive
