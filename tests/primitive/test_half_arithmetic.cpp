// The host's float16 sum and product (combine in float32, round once to binary16) against an
// independent reference: IEEE 754 binary16 addition and multiplication rounded once to nearest
// even, computed in double (a sum or product of two binary16 values is exact in double).
// Equality is what lets the CUDA reduce_into add and multiply float16 pairs with the GPU's own
// binary16 instructions (`add.rn.f16x2`, `mul.rn.f16x2`; primitive/kernels/reduce_into.hpp) and still
// give the host's bits. Every binary16 value is combined with a sample of 271 second operands
// here: every 257th pattern and 15 edges (RINGZERO_TEST_EXHAUSTIVE=1: all 65536, 2^32 pairs per
// op; 5-7 minutes on a 2-core VM).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ringzero/core/half.hpp"
#include "ringzero/primitive/reduce.hpp"

using namespace ringzero;

namespace {

/// The binary16 value of bits `h` in double, decoded by hand (not through the code under test).
double half_value(std::uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0x1f) return mantissa ? std::nan("") : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

/// `x` rounded to binary16, to nearest, ties to even (IEEE 754 roundTiesToEven): the quantum is
/// 2^(e-10) in the binade [2^e, 2^(e+1)), 2^-24 below 2^-14; values from 65520 (halfway between
/// 65504 and 2^16, whose tie goes to the even 2^16) up overflow to infinity.
double round_to_half(double x) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const double magnitude = std::fabs(x);
  if (magnitude >= 65520.0) return std::copysign(INFINITY, x);
  int e = 0;
  (void)std::frexp(magnitude, &e);  // magnitude in [2^(e-1), 2^e)
  const int quantum = std::max(e - 1 - 10, -24);
  const double q = std::nearbyint(std::ldexp(magnitude, -quantum));  // exact scaling; ties to even
  return std::copysign(std::ldexp(q, quantum), x);
}

/// Whether the host's result bits `got` are `want` (a double), zeros compared with their sign;
/// a NaN wants a NaN, any payload.
bool same(std::uint16_t got, double want) {
  const double g = half_value(got);
  if (std::isnan(want)) return std::isnan(g);
  return g == want && std::signbit(g) == std::signbit(want);
}

/// Second operands: every 257th pattern (256 of them: all exponents and signs, varied mantissas)
/// and 15 edges.
std::vector<std::uint16_t> second_operands(bool exhaustive) {
  std::vector<std::uint16_t> v;
  if (exhaustive) {
    for (std::uint32_t b = 0; b < 65536; ++b) v.push_back(static_cast<std::uint16_t>(b));
    return v;
  }
  for (std::uint32_t b = 0; b < 65536; b += 257) v.push_back(static_cast<std::uint16_t>(b));
  for (std::uint16_t b : {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x3c01, 0x7bff, 0xfbff,
                          0x7c00, 0xfc00, 0x7e01, 0x0002})
    v.push_back(b);
  return v;
}

void check_op(reduce_kind kind) {
  const char* flag = std::getenv("RINGZERO_TEST_EXHAUSTIVE");
  const bool exhaustive = flag && std::string(flag) == "1";
  std::vector<float16> a(65536), b(65536), out(65536);
  std::vector<double> value(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    a[i] = float16::from_bits(static_cast<std::uint16_t>(i));
    value[i] = half_value(static_cast<std::uint16_t>(i));
  }
  primitive::reduce_spec spec;
  spec.type = dtype::float16;
  spec.kind = kind;
  std::uint64_t checked = 0;
  const std::vector<std::uint16_t> seconds = second_operands(exhaustive);
  for (std::uint16_t second : seconds) {
    std::fill(b.begin(), b.end(), float16::from_bits(second));
    primitive::reduce_into(out.data(), a.data(), b.data(), a.size(), spec);
    const double y = half_value(second);
    for (std::uint32_t i = 0; i < 65536; ++i) {
      const double exact = kind == reduce_kind::sum ? value[i] + y : value[i] * y;  // exact in double
      if (!same(out[i].bits, round_to_half(exact))) {
        char what[96];
        std::snprintf(what, sizeof what, "%s of binary16 bits 0x%04x and 0x%04x gave 0x%04x",
                      std::string(reduce_kind_name(kind)).c_str(), static_cast<unsigned>(i),
                      static_cast<unsigned>(second), static_cast<unsigned>(out[i].bits));
        FAIL_CHECK(what);
        return;
      }
      ++checked;
    }
  }
  MESSAGE(reduce_kind_name(kind) << ": " << checked << " pairs");
  CHECK(checked == 65536ull * seconds.size());
}

}  // namespace

TEST_CASE("the reference rounding itself: known binary16 values") {
  CHECK(round_to_half(65519.99) == 65504.0);
  CHECK(std::isinf(round_to_half(65520.0)));
  CHECK(round_to_half(1.0 + std::ldexp(1.0, -11)) == 1.0);                            // tie to even (down)
  CHECK(round_to_half(1.0 + 3 * std::ldexp(1.0, -11)) == 1.0 + std::ldexp(1.0, -9));  // tie to even (up)
  CHECK(round_to_half(std::ldexp(1.0, -25)) == 0.0);                                  // tie below the least subnormal
  CHECK(round_to_half(std::ldexp(3.0, -26)) == std::ldexp(1.0, -24));
  CHECK(half_value(0x3c00) == 1.0);
  CHECK(half_value(0x0001) == std::ldexp(1.0, -24));
  CHECK(half_value(0x7bff) == 65504.0);
}

TEST_CASE("float16 sum: float32 then one rounding equals binary16 addition, for every first operand") {
  check_op(reduce_kind::sum);
}

TEST_CASE("float16 prod: float32 then one rounding equals binary16 multiplication, for every first operand") {
  check_op(reduce_kind::prod);
}
