#pragma once
// Reference arithmetic of the collective tests, written independently of ringzero's primitives:
// element codecs (raw bits <-> double / wide integer), IEEE round-to-nearest-even into float16
// and bfloat16 by searching the decoded values (not by bit tricks), the input values of every
// (dtype, reduce op) whose reductions are exact in any order, and the expected reduction of a
// set of inputs computed in 64-bit integer or double arithmetic and converted once.
//
// Semantics checked (DESIGN.md, core/reduce_op.hpp): integer sum/prod/premul_sum wrap modulo
// 2^bits; integer avg is the wrapped sum divided by the world size, truncated toward zero;
// floating avg is the exact sum divided by the world size and rounded once (float16/bfloat16:
// float32 division, then round-to-nearest-even into the 16-bit type); premul_sum multiplies each
// rank's input by that rank's scalar (integer scalars wrap like the values).

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "ringzero/core/dtype.hpp"
#include "ringzero/core/reduce_op.hpp"

namespace rzt {

using ringzero::dtype;
using ringzero::reduce_kind;

static_assert(std::endian::native == std::endian::little, "the tests store element bits little-endian");

// ------------------------------------------------------------------------------------------------
// Element codecs. An element is kept as its raw bits in the low bytes of a uint64.

/// Bits per element of `t`.
inline int bits_of(dtype t) { return static_cast<int>(ringzero::dtype_size(t)) * 8; }

/// `v` reduced modulo 2^bits_of(t).
inline std::uint64_t truncate_bits(dtype t, std::uint64_t v) {
  const int b = bits_of(t);
  return b == 64 ? v : v & ((std::uint64_t{1} << b) - 1);
}

/// The integer element `bits` of signed type `t`, sign-extended.
inline std::int64_t sign_extend(dtype t, std::uint64_t bits) {
  const int b = bits_of(t);
  if (b == 64) return static_cast<std::int64_t>(bits);
  const std::uint64_t sign = std::uint64_t{1} << (b - 1);
  bits = truncate_bits(t, bits);
  return static_cast<std::int64_t>((bits ^ sign) - sign);
}

/// Value of float16 bits (1 sign, 5 exponent bits with bias 15, 10 mantissa bits). The infinity
/// pattern 0x7c00 decodes to 2^16, the value the next binade would start at, so that a search
/// over the patterns rounds overflow to infinity exactly as IEEE 754 does.
inline double half_value(std::uint16_t b) {
  const int e = (b >> 10) & 31, m = b & 1023;
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (b & 0x8000) ? -v : v;
}

/// Value of bfloat16 bits (1 sign, 8 exponent bits with bias 127, 7 mantissa bits); the infinity
/// pattern 0x7f80 decodes to 2^128 (see `half_value`).
inline double bfloat16_value(std::uint16_t b) {
  const int e = (b >> 7) & 255, m = b & 127;
  const double v = e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
  return (b & 0x8000) ? -v : v;
}

/// Round-to-nearest-even of finite `x` into a 16-bit format whose non-negative patterns
/// 0..inf_bits decode (increasingly) through `value`: a binary search for the neighbours, then
/// the nearer one, ties to the even pattern.
template <class Value>
std::uint16_t round_16(double x, Value&& value, std::uint16_t inf_bits) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  std::uint32_t lo = 0, hi = inf_bits;  // invariant: value(lo) <= a
  if (a >= value(inf_bits)) return static_cast<std::uint16_t>(sign | inf_bits);
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (value(static_cast<std::uint16_t>(mid)) <= a)
      lo = mid;
    else
      hi = mid;
  }
  const double below = value(static_cast<std::uint16_t>(lo)), above = value(static_cast<std::uint16_t>(hi));
  std::uint32_t pick;
  if (a - below < above - a)
    pick = lo;
  else if (above - a < a - below)
    pick = hi;
  else
    pick = (lo % 2 == 0) ? lo : hi;
  return static_cast<std::uint16_t>(sign | pick);
}

/// Value of a floating element's bits.
inline double float_value(dtype t, std::uint64_t bits) {
  switch (t) {
    case dtype::float32: return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
    case dtype::float64: return std::bit_cast<double>(bits);
    case dtype::float16: return half_value(static_cast<std::uint16_t>(bits));
    case dtype::bfloat16: return bfloat16_value(static_cast<std::uint16_t>(bits));
    default: throw std::logic_error("float_value of an integer dtype");
  }
}

/// Bits of `x` rounded to nearest even in floating type `t`.
inline std::uint64_t float_bits_rounded(dtype t, double x) {
  switch (t) {
    case dtype::float32: return std::bit_cast<std::uint32_t>(static_cast<float>(x));
    case dtype::float64: return std::bit_cast<std::uint64_t>(x);
    case dtype::float16:
      return round_16(
          x, [](std::uint16_t b) { return half_value(b); }, 0x7c00);
    case dtype::bfloat16:
      return round_16(
          x, [](std::uint16_t b) { return bfloat16_value(b); }, 0x7f80);
    default: throw std::logic_error("float_bits_rounded of an integer dtype");
  }
}

/// Bits of `x`, which must be exactly representable in `t` (the inputs are chosen so that every
/// reduction is exact; a failure here is a bug in the test, reported loudly).
inline std::uint64_t float_bits_exact(dtype t, double x) {
  const std::uint64_t b = float_bits_rounded(t, x);
  if (float_value(t, b) != x)
    throw std::logic_error("reference value " + std::to_string(x) + " is not exact in " +
                           std::string(ringzero::dtype_name(t)));
  return b;
}

// ------------------------------------------------------------------------------------------------
// Inputs.

/// SplitMix64 (Steele, Lea & Flood 2014): a well-mixed 64-bit hash of `x`.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// What a pattern of inputs is for: one of the reduce kinds, or plain data movement (`copy`:
/// arbitrary bits, NaN payloads included, which a collective must move without interpreting).
enum class use : int { sum = 0, prod, min, max, avg, premul_sum, copy };

inline use use_of(reduce_kind k) { return static_cast<use>(static_cast<int>(k)); }

/// premul_sum scalar of rank `r` for dtype `t` (ranks get different scalars). Floating values
/// times these stay exact (inputs are multiples of 0.5 in [-2, 2]); integer scalars wrap.
inline double premul_scalar(dtype t, int r) {
  static const double floating[] = {0.5, 2.0, -1.0, 1.5, -0.5, 1.0, -2.0, -1.5};
  static const double integer[] = {3.0, -1.0, 2.0, 1.0, -7.0, 5.0, 123456789.0, -2.0};
  const auto i = static_cast<std::size_t>(r) % 8;
  return ringzero::is_floating_point(t) ? floating[i] : integer[i];
}

/// A finite, non-zero floating value with arbitrary bits (min/max inputs): zeros are excluded
/// because min(-0, +0) depends on the order of comparison.
inline std::uint64_t arbitrary_finite_bits(dtype t, std::uint64_t h) {
  for (;; h = mix64(h)) {
    const std::uint64_t b = truncate_bits(t, h);
    const double v = float_value(t, b);
    bool finite = std::isfinite(v);
    if (t == dtype::float16) finite = ((b >> 10) & 31) != 31;
    if (t == dtype::bfloat16) finite = ((b >> 7) & 255) != 255;
    if (finite && v != 0.0) return b;
  }
}

/// Bits of the input element `k` of rank `r` for dtype `t` and purpose `u`. Chosen so that every
/// reduction is exact in any order of combination:
/// - floating sum/avg: multiples of 0.5 in [-4, 4]; premul_sum: multiples of 0.5 in [-2, 2]
///   (partial sums of 13 ranks stay within bfloat16's 8 significant bits);
///   prod: +-1 and +-2 (|product| <= 2^13); min/max: arbitrary finite non-zero values.
/// - integers: arbitrary bits with the extremes (min, max, 0, -1) mixed in, since wrapping
///   arithmetic is exact in any order; prod: mostly odd values so products do not collapse to 0.
/// - copy: arbitrary bits (NaNs included).
inline std::uint64_t input_bits(dtype t, use u, int r, std::uint64_t k) {
  const std::uint64_t h = mix64((static_cast<std::uint64_t>(t) << 56) ^ (static_cast<std::uint64_t>(u) << 48) ^
                                (static_cast<std::uint64_t>(r) << 40) ^ k ^ 0x5eed0000ull);
  if (u == use::copy) return truncate_bits(t, h);
  if (ringzero::is_floating_point(t)) {
    switch (u) {
      case use::sum:
      case use::avg: return float_bits_exact(t, (static_cast<double>(h % 17) - 8.0) * 0.5);
      case use::premul_sum: return float_bits_exact(t, (static_cast<double>(h % 9) - 4.0) * 0.5);
      case use::prod: {
        static const double factors[] = {1.0, -1.0, 2.0, -2.0, 1.0, -1.0, 1.0, -1.0};
        return float_bits_exact(t, factors[h % 8]);
      }
      default: return arbitrary_finite_bits(t, h);
    }
  }
  const int b = bits_of(t);
  const bool is_signed = ringzero::is_signed_integer(t);
  const std::uint64_t lowest = is_signed ? std::uint64_t{1} << (b - 1) : 0;
  switch ((h >> 58) & 15) {  // extremes one time in four
    case 0: return truncate_bits(t, lowest);
    case 1: return truncate_bits(t, lowest - 1);  // the largest value
    case 2: return 0;
    case 3: return truncate_bits(t, ~std::uint64_t{0});  // -1, or the unsigned maximum
    default: break;
  }
  if (u == use::prod && (h & 3) != 0) return truncate_bits(t, h | 1);
  return truncate_bits(t, h);
}

// ------------------------------------------------------------------------------------------------
// Expected reductions.

/// The expected result bits of reducing `inputs[r]` (rank r's element bits, r < n) with `kind`;
/// `scalars[r]` is rank r's premul_sum scalar. Wide arithmetic, one conversion at the end.
inline std::uint64_t expected_bits(dtype t, reduce_kind kind, const std::uint64_t* inputs, int n,
                                   const double* scalars) {
  if (ringzero::is_floating_point(t)) {
    double acc = float_value(t, inputs[0]);
    std::uint64_t pick = inputs[0];
    switch (kind) {
      case reduce_kind::sum:
      case reduce_kind::avg:
        for (int r = 1; r < n; ++r) acc += float_value(t, inputs[r]);
        break;
      case reduce_kind::prod:
        for (int r = 1; r < n; ++r) acc *= float_value(t, inputs[r]);
        break;
      case reduce_kind::premul_sum:
        acc *= scalars[0];
        for (int r = 1; r < n; ++r) acc += float_value(t, inputs[r]) * scalars[r];
        break;
      case reduce_kind::min:
      case reduce_kind::max:
        for (int r = 1; r < n; ++r) {
          const double v = float_value(t, inputs[r]);
          if (kind == reduce_kind::min ? v < acc : v > acc) {
            acc = v;
            pick = inputs[r];
          }
        }
        return pick;
    }
    if (kind == reduce_kind::avg) {
      if (t == dtype::float64) return float_bits_rounded(t, acc / n);
      // float32, float16 and bfloat16 divide in float32 (the exact sum is a float32 value)
      const float quotient = static_cast<float>(acc) / static_cast<float>(n);
      return float_bits_rounded(t, static_cast<double>(quotient));
    }
    return float_bits_exact(t, acc);
  }
  const bool is_signed = ringzero::is_signed_integer(t);
  auto wide = [&](std::uint64_t bits) {
    return is_signed ? static_cast<std::uint64_t>(sign_extend(t, bits)) : truncate_bits(t, bits);
  };
  std::uint64_t acc = wide(inputs[0]);
  switch (kind) {
    case reduce_kind::sum:
    case reduce_kind::avg:
      for (int r = 1; r < n; ++r) acc += wide(inputs[r]);
      break;
    case reduce_kind::prod:
      for (int r = 1; r < n; ++r) acc *= wide(inputs[r]);
      break;
    case reduce_kind::premul_sum:
      acc = 0;
      for (int r = 0; r < n; ++r)
        acc += wide(inputs[r]) * static_cast<std::uint64_t>(static_cast<std::int64_t>(scalars[r]));
      break;
    case reduce_kind::min:
    case reduce_kind::max:
      for (int r = 1; r < n; ++r) {
        const std::uint64_t v = wide(inputs[r]);
        const bool less = is_signed ? static_cast<std::int64_t>(v) < static_cast<std::int64_t>(acc) : v < acc;
        const bool greater = is_signed ? static_cast<std::int64_t>(v) > static_cast<std::int64_t>(acc) : v > acc;
        if (kind == reduce_kind::min ? less : greater) acc = v;
      }
      break;
  }
  if (kind == reduce_kind::avg) {
    const std::uint64_t wrapped = truncate_bits(t, acc);
    if (is_signed)
      acc = static_cast<std::uint64_t>(sign_extend(t, wrapped) / n);  // C++ truncates toward zero
    else
      acc = wrapped / static_cast<std::uint64_t>(n);
  }
  return truncate_bits(t, acc);
}

// ------------------------------------------------------------------------------------------------
// Periodic buffers: a pattern of `period` elements repeated, stored twice over (2 * period
// elements) so that a run of up to `period` elements can start at any phase.

/// Fills `count` elements of `dst` with `pattern2` starting at element `phase` of the pattern.
inline void fill_periodic(void* dst, std::uint64_t count, const std::uint8_t* pattern2, std::size_t period,
                          std::size_t element_size, std::uint64_t phase) {
  auto* d = static_cast<std::uint8_t*>(dst);
  for (std::uint64_t i = 0; i < count;) {
    const std::uint64_t j = (phase + i) % period;
    const std::uint64_t len = std::min<std::uint64_t>(period, count - i);
    std::memcpy(d + i * element_size, pattern2 + j * element_size, len * element_size);
    i += len;
  }
}

/// Index of the first of `count` elements of `data` that differs from the pattern started at
/// `phase`, or `count` when all match.
inline std::uint64_t first_mismatch_periodic(const void* data, std::uint64_t count, const std::uint8_t* pattern2,
                                             std::size_t period, std::size_t element_size, std::uint64_t phase) {
  const auto* d = static_cast<const std::uint8_t*>(data);
  for (std::uint64_t i = 0; i < count;) {
    const std::uint64_t j = (phase + i) % period;
    const std::uint64_t len = std::min<std::uint64_t>(period, count - i);
    if (std::memcmp(d + i * element_size, pattern2 + j * element_size, len * element_size) != 0) {
      for (std::uint64_t e = 0; e < len; ++e)
        if (std::memcmp(d + (i + e) * element_size, pattern2 + (j + e) * element_size, element_size) != 0) return i + e;
    }
    i += len;
  }
  return count;
}

/// Index of the first byte of `data[0, bytes)` that is not `value`, or `bytes`.
inline std::uint64_t first_byte_not(const void* data, std::uint64_t bytes, std::uint8_t value) {
  const auto* d = static_cast<const std::uint8_t*>(data);
  std::uint8_t block[4096];
  std::memset(block, value, sizeof block);
  for (std::uint64_t i = 0; i < bytes;) {
    const std::uint64_t len = std::min<std::uint64_t>(sizeof block, bytes - i);
    if (std::memcmp(d + i, block, len) != 0) {
      for (std::uint64_t e = 0; e < len; ++e)
        if (d[i + e] != value) return i + e;
    }
    i += len;
  }
  return bytes;
}

/// The bits of element `i` of `data` (element size `element_size`) as a hexadecimal string.
inline std::string element_hex(const void* data, std::uint64_t i, std::size_t element_size) {
  std::uint64_t v = 0;
  std::memcpy(&v, static_cast<const std::uint8_t*>(data) + i * element_size, element_size);
  static const char digits[] = "0123456789abcdef";
  std::string s = "0x";
  for (int nibble = static_cast<int>(element_size) * 2 - 1; nibble >= 0; --nibble)
    s += digits[(v >> (4 * nibble)) & 15];
  return s;
}

/// A 64-bit digest of `bytes` bytes (equal buffers give equal digests).
inline std::uint64_t digest(const void* data, std::uint64_t bytes) {
  const auto* d = static_cast<const std::uint8_t*>(data);
  std::uint64_t h = 0xcbf29ce484222325ull ^ bytes;
  std::uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, d + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < bytes; ++i) h = (h ^ d[i]) * 0x100000001b3ull;
  return mix64(h);
}

}  // namespace rzt
