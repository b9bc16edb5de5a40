#pragma once
// Inputs whose reductions are exact in any order, and their expected results, for the
// benchmarks' bitwise correctness check (the method of nccl-tests: if every partial result is
// exactly representable, every algorithm and every summation order gives the same bits).
//
// Rank r's element i holds v(r, i) = pattern((i + 3 r) mod 16): small integers for
// sum/avg/premul_sum (sums over up to 16 ranks stay below 2^8, exact even in bfloat16), products
// of 1, -1 and a few 2s for prod (at most 2^16), arbitrary small values for min/max. The expected
// result of element i therefore depends only on i mod 16 and is tabulated once per
// (dtype, op, world size).

#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ringzero/core/dtype.hpp"
#include "ringzero/core/reduce_op.hpp"

namespace ringzero::bench {

inline constexpr int pattern_period = 16;
inline constexpr double premul_scalar = 2.0;

/// The integer value of pattern position k for a reduction `op` on `type`.
inline std::int64_t pattern_value(dtype type, reduce_kind op, int k) {
  const bool is_signed = is_floating_point(type) || is_signed_integer(type);
  switch (op) {
    case reduce_kind::prod:
      if (k % 5 == 0) return 2;
      return (is_signed && k % 3 == 0) ? -1 : 1;
    case reduce_kind::min:
    case reduce_kind::max: return is_signed ? (k * 5) % 16 - 8 : (k * 5) % 16;
    default: return is_signed ? k - 7 : k;
  }
}

/// v(r, i): rank r's input element i.
inline std::int64_t input_value(dtype type, reduce_kind op, int rank, std::uint64_t i) {
  return pattern_value(type, op, static_cast<int>((i + 3u * static_cast<std::uint64_t>(rank)) % pattern_period));
}

/// `x` stored as an element of type T (integers modulo 2^bits, floats exactly).
template <class T>
T as_element(std::int64_t x) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<std::uint64_t>(x));
  else if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>)
    return T(static_cast<float>(x));
  else
    return static_cast<T>(x);
}

/// Fills `count` elements of rank `rank`'s input starting at global element `first`.
inline void fill_input(void* buffer, std::uint64_t count, dtype type, reduce_kind op, int rank, std::uint64_t first) {
  visit_dtype(type, [&]<class T>() {
    std::array<T, pattern_period> period{};
    for (int k = 0; k < pattern_period; ++k)
      period[static_cast<std::size_t>(k)] = as_element<T>(pattern_value(type, op, k));
    T* out = static_cast<T*>(buffer);
    const std::uint64_t shift = (first + 3u * static_cast<std::uint64_t>(rank)) % pattern_period;
    for (std::uint64_t i = 0; i < count; ++i) out[i] = period[(i + shift) % pattern_period];
  });
}

/// The expected reduction over `world` ranks of pattern position k (global element index i with
/// i mod 16 == k), as the bytes of one element of `type`.
inline void expected_reduction(dtype type, reduce_kind op, int world, int k, void* out) {
  visit_dtype(type, [&]<class T>() {
    std::int64_t acc = 0;
    bool first = true;
    for (int r = 0; r < world; ++r) {
      const std::int64_t v = pattern_value(type, op, (k + 3 * r) % pattern_period);
      if (first) {
        acc = op == reduce_kind::premul_sum ? 2 * v : v;
        first = false;
        continue;
      }
      switch (op) {
        case reduce_kind::prod: acc *= v; break;
        case reduce_kind::min: acc = v < acc ? v : acc; break;
        case reduce_kind::max: acc = v > acc ? v : acc; break;
        case reduce_kind::premul_sum: acc += 2 * v; break;
        default: acc += v; break;
      }
    }
    T result;
    if (op == reduce_kind::avg) {
      if constexpr (std::is_integral_v<T>) {
        const T wrapped = as_element<T>(acc);
        if constexpr (std::is_signed_v<T>)
          result = static_cast<T>(static_cast<std::int64_t>(wrapped) / world);
        else
          result = static_cast<T>(static_cast<std::uint64_t>(wrapped) / static_cast<std::uint64_t>(world));
      } else if constexpr (std::is_same_v<T, double>) {
        result = static_cast<double>(acc) / world;
      } else {
        const float q = static_cast<float>(acc) / static_cast<float>(world);
        if constexpr (std::is_same_v<T, float>)
          result = q;
        else
          result = T(q);
      }
    } else {
      result = as_element<T>(acc);
    }
    std::memcpy(out, &result, sizeof(T));
  });
}

/// The input element of rank `rank` at global index `i` as bytes (for copies: gathers, broadcast).
inline void expected_copy(dtype type, reduce_kind op, int rank, std::uint64_t i, void* out) {
  visit_dtype(type, [&]<class T>() {
    const T v = as_element<T>(input_value(type, op, rank, i));
    std::memcpy(out, &v, sizeof(T));
  });
}

}  // namespace ringzero::bench
