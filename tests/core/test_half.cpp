// float16 / bfloat16: conversions round to nearest even; checked exhaustively against
// g++'s _Float16 for float16 and against an independent double-precision reference for bfloat16.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "ringzero/core/half.hpp"

using ringzero::bfloat16;
using ringzero::float16;

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Reference bfloat16 rounding: the nearer of the two truncation neighbours, compared in double
// (exact for these magnitudes), ties to the even mantissa; above the largest finite value the
// upper neighbour is 2^128, which rounds to infinity exactly as IEEE 754 prescribes.
std::uint16_t bf16_reference(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  if ((u & 0xffffu) == 0) return static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t down = static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t up = static_cast<std::uint16_t>(down + 1);
  const double dx = std::fabs(static_cast<double>(x));
  const double dd = std::fabs(static_cast<double>(from_bits(std::uint32_t{down} << 16)));
  const float upf = from_bits(std::uint32_t{up} << 16);
  const double du = std::isinf(upf) ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(upf));
  const double to_down = dx - dd, to_up = du - dx;
  if (to_down < to_up) return down;
  if (to_down > to_up) return up;
  return (down & 1) ? up : down;
}

}  // namespace

TEST_CASE("float16 -> float -> float16 round-trips every bit pattern") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float16 h = float16::from_bits(static_cast<std::uint16_t>(b));
    const float f = h;
    _Float16 ref;
    std::memcpy(&ref, &h.bits, 2);
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(ref)));
      continue;
    }
    REQUIRE(f == static_cast<float>(ref));
    REQUIRE(float16(f).bits == h.bits);
  }
}

TEST_CASE("float -> float16 rounds to nearest even like _Float16") {
  // every float whose exponent is near the half range, sampled densely, plus all boundaries
  std::uint64_t checked = 0;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4093) {
    const float f = from_bits(static_cast<std::uint32_t>(u));
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    std::uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    REQUIRE_MESSAGE(float16(f).bits == ref_bits, "float bits " << u);
    ++checked;
  }
  for (float f : {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e30f, -65520.0f, 5.9604645e-08f, 2.9802322e-08f,
                  2.9802326e-08f, 6.1035156e-05f, 6.1035153e-05f, 0.0f, -0.0f}) {
    const _Float16 ref = static_cast<_Float16>(f);
    std::uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    CHECK(float16(f).bits == ref_bits);
  }
  CHECK(checked > 1000000);
}

TEST_CASE("bfloat16 conversions") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const bfloat16 h = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    const float f = h;
    if (std::isnan(f)) continue;
    REQUIRE(bfloat16(f).bits == h.bits);
  }
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4093) {
    const float f = from_bits(static_cast<std::uint32_t>(u));
    REQUIRE_MESSAGE(bfloat16(f).bits == bf16_reference(f), "float bits " << u);
  }
  CHECK(bfloat16(1.0f).bits == 0x3f80);
  CHECK(bfloat16(from_bits(0x3f808000u)).bits == 0x3f80);  // tie, even stays
  CHECK(bfloat16(from_bits(0x3f818000u)).bits == 0x3f82);  // tie, odd rounds up
  CHECK(bfloat16(std::numeric_limits<float>::max()).bits == 0x7f80);
  CHECK(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
}
