// core/checked_arithmetic.hpp: sums, products and round-ups of 64-bit sizes are exact or
// std::nullopt, at and around the overflow boundary, with 128-bit arithmetic as the reference.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "ringzero/core/checked_arithmetic.hpp"

using ringzero::detail::checked_add;
using ringzero::detail::checked_buffer_bytes;
using ringzero::detail::checked_mul;
using ringzero::detail::checked_round_up;

namespace {
constexpr std::uint64_t max64 = std::numeric_limits<std::uint64_t>::max();
__extension__ typedef unsigned __int128 u128;  // the reference arithmetic (GCC and Clang)

/// The operands of the sweep: small values, powers of two and their neighbours, the extremes.
std::vector<std::uint64_t> operands() {
  std::vector<std::uint64_t> v = {0, 1, 2, 3, 7, 16, 1000, max64 - 1, max64, max64 / 2, max64 / 2 + 1, max64 / 3};
  for (int b = 1; b < 64; b += 7) {
    const std::uint64_t p = std::uint64_t{1} << b;
    v.insert(v.end(), {p - 1, p, p + 1});
  }
  return v;
}
}  // namespace

TEST_CASE("checked_add and checked_mul: the exact result when it fits in 64 bits, else nullopt") {
  for (std::uint64_t a : operands())
    for (std::uint64_t b : operands()) {
      INFO(a << " and " << b);
      const u128 sum = u128{a} + b, product = u128{a} * b;
      const std::optional<std::uint64_t> s = checked_add(a, b), p = checked_mul(a, b);
      CHECK(s.has_value() == (sum <= max64));
      if (s) CHECK(*s == static_cast<std::uint64_t>(sum));
      CHECK(p.has_value() == (product <= max64));
      if (p) CHECK(*p == static_cast<std::uint64_t>(product));
      const auto bytes = checked_buffer_bytes(a, b);
      CHECK(bytes.has_value() == (product <= static_cast<u128>(std::numeric_limits<std::ptrdiff_t>::max())));
      if (bytes) CHECK(*bytes == static_cast<std::uint64_t>(product));
    }
}

TEST_CASE("checked_round_up: the least multiple of m at or above x, or nullopt when above 2^64 - 1") {
  for (std::uint64_t x : operands())
    for (std::uint64_t m : std::vector<std::uint64_t>{1, 2, 3, 64, 4096, 1000003, max64 / 2, max64}) {
      INFO(x << " to a multiple of " << m);
      const u128 up = (u128{x} + m - 1) / m * m;
      const std::optional<std::uint64_t> r = checked_round_up(x, m);
      CHECK(r.has_value() == (up <= max64));
      if (r) CHECK(*r == static_cast<std::uint64_t>(up));
    }
}
