#pragma once
/// @file
/// `float16` (IEEE 754 binary16) and `bfloat16` (the upper 16 bits of a binary32), as real
/// arithmetic types for host and CUDA device code.
///
/// Conversion from `float` rounds to nearest, ties to even (IEEE 754 roundTiesToEven); values
/// beyond the largest finite value round to infinity, NaN stays NaN (quieted, keeping the high
/// payload bits). Conversion to `float` is exact. Arithmetic converts both operands to `float`,
/// computes there and rounds once when the result is stored back into a 16-bit type (ringzero's
/// sums of these types go further and round once per reduction: docs/numerics.md).
///
/// Thread safety: plain values. Determinism: every conversion is a pure bit function.

#include <bit>
#include <cstdint>
#include <cstring>

#include "ringzero/core/config.hpp"

namespace ringzero {

namespace detail {

/// Bit pattern of a `float` (host and device; `std::bit_cast` is not available to nvcc device code).
RINGZERO_HOST_DEVICE inline std::uint32_t float_bits(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// The `float` with bit pattern `u`.
RINGZERO_HOST_DEVICE inline float bits_float(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// binary32 -> binary16 bits, round to nearest even.
/// Normal range: re-bias the exponent (127 -> 15) and round the 13 dropped mantissa bits
/// by adding 0x0fff plus the lowest kept bit (ties to even); a carry moves into the exponent,
/// which is exactly how rounding up to the next binade (or to infinity) must behave.
/// Subnormal range (|x| < 2^-14): adding 0.5f aligns the binary16 subnormal unit 2^-24
/// with bit 0 of the float mantissa, so the FPU's own round-to-nearest-even does the rounding.
/// In CUDA device code finite and infinite values use the hardware conversion
/// (`cvt.rn.f16.f32`, IEEE round to nearest even, subnormals kept), which gives the same bits
/// in a fraction of the instructions; a NaN gets the host's bits (payload kept) by a select,
/// so no software path is predicated into every conversion.
RINGZERO_HOST_DEVICE inline std::uint16_t float_to_half_bits(float value) noexcept {
#if defined(__CUDA_ARCH__)
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(value));
  const std::uint32_t bits = float_bits(value);
  const auto nan = static_cast<unsigned short>(((bits >> 16) & 0x8000u) | 0x7e00u | ((bits >> 13) & 0x03ffu));
  return value == value ? h : nan;
#else
  const std::uint32_t x = float_bits(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // infinity or NaN
    if (magnitude == 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x03ffu));
  }
  if (magnitude >= 0x47800000u)  // >= 65536: beyond every rounding to a finite half
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (magnitude < 0x38800000u) {  // below 2^-14: subnormal half or zero
    const float shifted = bits_float(magnitude) + 0.5f;
    return static_cast<std::uint16_t>(sign | (float_bits(shifted) - 0x3f000000u));
  }
  const std::uint32_t lowest_kept = (magnitude >> 13) & 1u;
  magnitude += 0xc8000fffu + lowest_kept;  // -(112 << 23) re-biases the exponent, +0x0fff rounds
  return static_cast<std::uint16_t>(sign | (magnitude >> 13));
#endif
}

/// binary16 bits -> binary32, exact. CUDA device code converts every non-NaN value with the
/// (exact) hardware instruction `cvt.f32.f16`; a NaN gets the host's bits (payload kept) by a
/// select.
RINGZERO_HOST_DEVICE inline float half_bits_to_float(std::uint16_t h) noexcept {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(h)));
  const float nan = bits_float((static_cast<std::uint32_t>(h & 0x8000u) << 16) | 0x7f800000u |
                               (static_cast<std::uint32_t>(h & 0x03ffu) << 13));
  return (h & 0x7fffu) <= 0x7c00u ? f : nan;
#else
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x03ffu;
  if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return bits_float(sign | float_bits(magnitude));
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
#endif
}

/// binary32 -> bfloat16 bits, round to nearest even; NaN is quieted (bit 6 of the result set).
RINGZERO_HOST_DEVICE inline std::uint16_t float_to_bfloat16_bits(float value) noexcept {
  std::uint32_t x = float_bits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

/// bfloat16 bits -> binary32, exact.
RINGZERO_HOST_DEVICE inline float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

/// IEEE 754 binary16: 1 sign bit, 5 exponent bits, 10 mantissa bits; largest finite 65504.
/// Layout is exactly one `std::uint16_t`, so buffers can be shared with `__half` and
/// `_Float16`. Construct from `float` (rounds to nearest even); converts to `float` implicitly.
struct float16 {
  std::uint16_t bits = 0;  ///< the raw binary16 pattern

  constexpr float16() noexcept = default;
  /// Rounds `value` to the nearest binary16 (ties to even).
  RINGZERO_HOST_DEVICE explicit float16(float value) noexcept : bits(detail::float_to_half_bits(value)) {}
  /// The value as `float` (exact).
  RINGZERO_HOST_DEVICE operator float() const noexcept { return detail::half_bits_to_float(bits); }
  /// Builds a value from its bit pattern.
  RINGZERO_HOST_DEVICE static constexpr float16 from_bits(std::uint16_t b) noexcept {
    float16 h;
    h.bits = b;
    return h;
  }
};

/// bfloat16: 1 sign bit, 8 exponent bits, 7 mantissa bits (a binary32 with its low 16 bits
/// dropped). Layout is one `std::uint16_t`, compatible with `__nv_bfloat16`. Construct from
/// `float` (rounds to nearest even); converts to `float` implicitly and exactly.
struct bfloat16 {
  std::uint16_t bits = 0;  ///< the raw bfloat16 pattern

  constexpr bfloat16() noexcept = default;
  /// Rounds `value` to the nearest bfloat16 (ties to even).
  RINGZERO_HOST_DEVICE explicit bfloat16(float value) noexcept : bits(detail::float_to_bfloat16_bits(value)) {}
  /// The value as `float` (exact).
  RINGZERO_HOST_DEVICE operator float() const noexcept { return detail::bfloat16_bits_to_float(bits); }
  /// Builds a value from its bit pattern.
  RINGZERO_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(float16) == 2 && alignof(float16) == 2);
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);

}  // namespace ringzero
