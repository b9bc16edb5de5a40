#pragma once
/// @file
/// Element-wise combines of small elements packed in one 32-bit word ("SIMD within a
/// register"), for host and CUDA device code. The CUDA `reduce_into` combines whole vectors a
/// word at a time with them (primitive/kernels/reduce_into.hpp) instead of unpacking every 8- or 16-bit
/// element into a register of its own; the host tests run the same functions against the host
/// primitive (primitive/reduce.hpp): every pair of byte values, and every float16 and bfloat16
/// value against a sample of second operands (all 2^32 pairs with RINGZERO_TEST_EXHAUSTIVE=1;
/// tests/primitive/test_lanes.cpp).
///
/// Lanes: a word holds two 16-bit lanes (lane i is bits [16i, 16i + 16)) or four 8-bit lanes
/// (bits [8i, 8i + 8)), which is how consecutive elements of memory load into a word on a
/// little-endian machine (x86-64, every CUDA device). Lanes never affect each other.
///
/// Thread safety: pure functions. Determinism: bit functions of their arguments, the same on
/// the host and the device except where a function says otherwise.

#include <cstdint>
#include <type_traits>

#include "ringzero/core/config.hpp"
#include "ringzero/core/half.hpp"

namespace ringzero::primitive::lanes {

/// Four 8-bit lanes: `x_i + y_i` modulo 256, the bits of an int8 or uint8 sum (integer sums wrap,
/// as in primitive/reduce.hpp; two's-complement addition gives the same bits signed or unsigned).
/// The low 7 bits of the lanes are added with the top bits cleared, so no carry leaves a lane
/// (0x7f + 0x7f = 0xfe); each lane's top bit is then the exclusive or of both top bits and the
/// carry into it.
RINGZERO_HOST_DEVICE inline std::uint32_t add_bytes(std::uint32_t x, std::uint32_t y) noexcept {
  return ((x & 0x7f7f7f7fu) + (y & 0x7f7f7f7fu)) ^ ((x ^ y) & 0x80808080u);
}

/// Four 8-bit lanes: the min (`Max` false) or max of `x_i` and `y_i` as signed (int8) or unsigned
/// (uint8) bytes, the host's `min_of` / `max_of` (equal values have equal bits, so which one is
/// taken does not show). On a CUDA device one SIMD intrinsic, `__vmins4`, `__vminu4`, `__vmaxs4`
/// or `__vmaxu4` (CUDA Math API, "SIMD Intrinsics": per-byte signed or unsigned min and max);
/// the host compares byte by byte.
template <bool Signed, bool Max>
RINGZERO_HOST_DEVICE inline std::uint32_t min_max_bytes(std::uint32_t x, std::uint32_t y) noexcept {
#if defined(__CUDA_ARCH__)
  if constexpr (Signed)
    return Max ? __vmaxs4(x, y) : __vmins4(x, y);
  else
    return Max ? __vmaxu4(x, y) : __vminu4(x, y);
#else
  std::uint32_t r = 0;
  for (int lane = 0; lane < 4; ++lane) {
    const int shift = 8 * lane;
    const std::uint32_t ux = (x >> shift) & 0xffu, uy = (y >> shift) & 0xffu;
    const int a = Signed ? static_cast<int>(static_cast<std::int8_t>(ux)) : static_cast<int>(ux);
    const int b = Signed ? static_cast<int>(static_cast<std::int8_t>(uy)) : static_cast<int>(uy);
    const bool take_y = Max ? a < b : b < a;
    r |= (take_y ? uy : ux) << shift;
  }
  return r;
#endif
}

/// Two 16-bit lanes of a sign-magnitude floating type whose infinity has magnitude bits
/// `Infinity` (float16 0x7c00, bfloat16 0x7f80): 0xffff in each lane that holds a NaN (a
/// magnitude above infinity's), 0 elsewhere. Adding 0x7fff - Infinity to a magnitude carries
/// into the lane's top bit exactly when the magnitude exceeds `Infinity`, and never beyond it.
template <std::uint32_t Infinity>
RINGZERO_HOST_DEVICE inline std::uint32_t nan_lanes(std::uint32_t x) noexcept {
  static_assert(Infinity > 0 && Infinity < 0x8000);
  constexpr std::uint32_t bias = (0x7fffu - Infinity) * 0x00010001u;
  const std::uint32_t top = ((x & 0x7fff7fffu) + bias) & 0x80008000u;
  return (top >> 15) * 0xffffu;
}

/// The bits of the 16-bit floating types that the lane functions need: the magnitude bits of
/// infinity (a larger magnitude is a NaN) and the bit that quiets a NaN.
template <class T>
struct half_bits;
template <>
struct half_bits<float16> {
  static constexpr std::uint32_t infinity = 0x7c00u;
  static constexpr std::uint32_t quiet = 0x0200u;
};
template <>
struct half_bits<bfloat16> {
  static constexpr std::uint32_t infinity = 0x7f80u;
  static constexpr std::uint32_t quiet = 0x0040u;
};

/// Two lanes of T (float16 or bfloat16): 0xffff where `a_i < b_i` or either is NaN ("less
/// than, or unordered"; -0 and +0 are equal; subnormals compare by value), 0 elsewhere. On a
/// CUDA device this is one instruction, `set.ltu.u32.f16x2` or, from sm_90,
/// `set.ltu.u32.bf16x2` (PTX ISA, `set`: without `.ftz` subnormal inputs are kept; CUDA's
/// `__hltu2_mask` documents the same 0xffff-per-true-lane result); the host computes the same
/// predicate from the exact float32 values, which is what the host tests of the functions
/// built on it run.
template <class T>
RINGZERO_HOST_DEVICE inline std::uint32_t less_unordered_lanes(std::uint32_t a, std::uint32_t b) noexcept {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float16>) {
    std::uint32_t r;
    asm("set.ltu.u32.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
  }
#if __CUDA_ARCH__ >= 900
  if constexpr (std::is_same_v<T, bfloat16>) {
    std::uint32_t r;
    asm("set.ltu.u32.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
  }
#endif
#endif
  std::uint32_t r = 0;
  for (int lane = 0; lane < 2; ++lane) {
    const float x = static_cast<float>(T::from_bits(static_cast<std::uint16_t>(a >> (16 * lane))));
    const float y = static_cast<float>(T::from_bits(static_cast<std::uint16_t>(b >> (16 * lane))));
    if (!(x >= y)) r |= 0xffffu << (16 * lane);  // false for ordered x >= y, true for x < y or a NaN
  }
  return r;
}

/// Two lanes of T (float16 or bfloat16): the min (`Max` false) or max of `a_i` and `b_i` with
/// exactly the host's rule (primitive/reduce.hpp, `min_of` / `max_of` on the float32 values,
/// rounded back): a NaN `a_i` wins, then a NaN `b_i`, and the NaN comes out quieted (float16:
/// bit 9 set, bfloat16: bit 6, payload kept, as the round trip through float32 leaves it);
/// otherwise `b_i` when it is strictly less (min) or strictly greater (max) than `a_i`, else
/// `a_i`, so -0 and +0 give `a_i`. Branch-free: one comparison, two NaN tests and selects by
/// mask per word.
template <class T, bool Max>
RINGZERO_HOST_DEVICE inline std::uint32_t min_max_lanes(std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t nan_a = nan_lanes<half_bits<T>::infinity>(a);
  const std::uint32_t nan_b = nan_lanes<half_bits<T>::infinity>(b);
  // lanes that take b: b strictly better, or b NaN (unordered), but never over a NaN a
  const std::uint32_t better = Max ? less_unordered_lanes<T>(a, b) : less_unordered_lanes<T>(b, a);
  const std::uint32_t take_b = better & ~nan_a;
  const std::uint32_t r = (b & take_b) | (a & ~take_b);
  return r | ((nan_a | nan_b) & (half_bits<T>::quiet * 0x00010001u));
}

}  // namespace ringzero::primitive::lanes
