// Division by an invariant divisor (primitive/invariant_division.hpp), which the CUDA avg and
// divide kernels use for integers, against the `/` operator, and avg's prepared division
// (`divide(a, prepare_divisor(n))`) against the host primitive's `divide(a, n)` for every
// integer compute type. The method is exact or wrong for whole families of dividends, the ones
// just below and at multiples of the divisor, so those are checked for every divisor tried:
//   32-bit words: every dividend below 2^16 for divisors 1..1024; for 1..300, every power of
//   two and its neighbours and 2^32 - 1, dividends q*d - 1, q*d, q*d + d - 1 for random q, the
//   top of the range and random words.
//   64-bit words: the same forms with 64-bit divisors up to 2^64 - 1.
//   int8/uint8: every value for divisors 1..600 and large ones; int32/uint32/int64/uint64: the
//   extremes and the forms above.
// RINGZERO_TEST_EXHAUSTIVE=1 adds every 32-bit dividend for 12 divisors (a few seconds each).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ringzero/primitive/invariant_division.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace h = ringzero::primitive::detail;

namespace {

/// 1..small, every power of two 2^k below 2^bits with 2^k - 1 and 2^k + 1, the largest
/// divisor, and a few random ones.
template <class U>
std::vector<U> divisors(U small, std::mt19937_64& rng) {
  std::vector<U> d;
  for (U v = 1; v <= small; ++v) d.push_back(v);
  constexpr unsigned bits = sizeof(U) * 8;
  for (unsigned k = 2; k < bits; ++k)
    for (U v : {static_cast<U>((U(1) << k) - 1), static_cast<U>(U(1) << k), static_cast<U>((U(1) << k) + 1)})
      d.push_back(v);
  d.push_back(std::numeric_limits<U>::max());
  d.push_back(std::numeric_limits<U>::max() - 1);
  for (int i = 0; i < 64; ++i) {
    const U v = static_cast<U>(rng() >> (rng() % bits));
    if (v != 0) d.push_back(v);
  }
  return d;
}

/// Dividends where a wrong multiplier or shift shows first: around multiples of d, the top of
/// the range, and random words.
template <class U>
std::vector<U> dividends(U d, std::mt19937_64& rng) {
  constexpr U top = std::numeric_limits<U>::max();
  std::vector<U> n = {0,
                      1,
                      2,
                      top,
                      static_cast<U>(top - 1),
                      static_cast<U>(top / 2),
                      static_cast<U>(top / 2 + 1),
                      d,
                      static_cast<U>(d - 1),
                      static_cast<U>(d + 1)};
  const U max_q = top / d;
  for (int i = 0; i < 48; ++i) {
    const U q = i < 4 ? static_cast<U>(max_q - static_cast<U>(i)) : std::uniform_int_distribution<U>(0, max_q)(rng);
    const U m = static_cast<U>(q * d);  // no overflow: q <= top / d
    n.push_back(m);
    n.push_back(static_cast<U>(m - 1));
    if (top - m >= d - 1) n.push_back(static_cast<U>(m + (d - 1)));
  }
  for (int i = 0; i < 32; ++i) n.push_back(static_cast<U>(rng()));
  return n;
}

template <class U>
void check_forms(U small) {
  std::mt19937_64 rng(4242 + sizeof(U));
  for (U d : divisors<U>(small, rng)) {
    const auto p = h::prepare_invariant_divisor<U>(d);
    for (U n : dividends<U>(d, rng)) {
      const U got = h::divide_invariant(n, p);
      if (got != n / d) {
        CAPTURE(d);
        CAPTURE(n);
        CHECK(got == n / d);
        return;
      }
    }
  }
}

bool exhaustive_divisors() {
  const char* flag = std::getenv("RINGZERO_TEST_EXHAUSTIVE");
  return flag && std::string(flag) == "1";
}

/// `divide(a, prepare_divisor(n))` (the device's integer quotient) against `divide(a, n)` (the
/// host primitive's) for dividends `values` and divisors `ns`.
template <class C>
void check_prepared(const std::vector<C>& values, const std::vector<std::int64_t>& ns) {
  for (std::int64_t n : ns) {
    const auto p = h::prepare_divisor<C>(n);
    for (C a : values) {
      const C got = h::divide(a, p), want = h::divide(a, n);
      if (got != want) {
        CAPTURE(n);
        CAPTURE(static_cast<long long>(a));
        CHECK(static_cast<long long>(got) == static_cast<long long>(want));
        return;
      }
    }
  }
}

/// Divisors of avg: every world size up to `small`, and large ones up to the int64 limit.
std::vector<std::int64_t> world_sizes(std::int64_t small) {
  std::vector<std::int64_t> ns;
  for (std::int64_t n = 1; n <= small; ++n) ns.push_back(n);
  for (unsigned k = 8; k < 63; ++k)
    for (std::int64_t n : {(std::int64_t{1} << k) - 1, std::int64_t{1} << k, (std::int64_t{1} << k) + 1})
      ns.push_back(n);
  ns.push_back(std::numeric_limits<std::int64_t>::max());
  return ns;
}

template <class C>
std::vector<C> integer_values(std::int64_t extra_multiples_of) {
  std::mt19937_64 rng(99 + sizeof(C) + std::is_signed_v<C>);
  constexpr C lo = std::numeric_limits<C>::min(), hi = std::numeric_limits<C>::max();
  std::vector<C> v = {lo, static_cast<C>(lo + 1), hi, static_cast<C>(hi - 1), 0, 1, static_cast<C>(-1)};
  for (int i = 0; i < 2000; ++i) v.push_back(static_cast<C>(rng()));
  for (std::int64_t d = 2; d <= extra_multiples_of; ++d)
    for (int i = 0; i < 8; ++i) {
      const C m = static_cast<C>(static_cast<C>(rng() % 1000) * static_cast<C>(d));
      v.push_back(m);
      v.push_back(static_cast<C>(m - 1));
      v.push_back(static_cast<C>(m + 1));
      if constexpr (std::is_signed_v<C>) v.push_back(static_cast<C>(-m));
    }
  return v;
}

}  // namespace

TEST_CASE("divide_invariant: every dividend below 2^16 for divisors 1..1024 (32-bit words)") {
  for (std::uint32_t d = 1; d <= 1024; ++d) {
    const auto p = h::prepare_invariant_divisor<std::uint32_t>(d);
    std::uint32_t wrong = 0, first = 0;
    for (std::uint32_t n = 0; n < 65536; ++n)
      if (h::divide_invariant(n, p) != n / d && wrong++ == 0) first = n;
    CAPTURE(d);
    CAPTURE(first);
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("divide_invariant: dividends around multiples of the divisor, every form of divisor (32- and 64-bit)") {
  check_forms<std::uint32_t>(300);
  check_forms<std::uint64_t>(300);
}

TEST_CASE("divide_invariant: divisors of 2^N and above divide every N-bit dividend into 0") {
  for (std::uint64_t d : {std::uint64_t{1} << 32, (std::uint64_t{1} << 32) + 1, std::uint64_t{1} << 40,
                          std::numeric_limits<std::uint64_t>::max()}) {
    const auto p = h::prepare_invariant_divisor<std::uint32_t>(d);
    for (std::uint32_t n : {0u, 1u, 0x7fffffffu, 0x80000000u, 0xffffffffu}) CHECK(h::divide_invariant(n, p) == 0u);
  }
}

TEST_CASE("divide(a, prepare_divisor(n)) equals divide(a, n) for every integer dtype") {
  SUBCASE("int8 and uint8: every value, divisors 1..600 and large ones") {
    std::vector<std::int8_t> s;
    std::vector<std::uint8_t> u;
    for (int i = 0; i < 256; ++i) {
      s.push_back(static_cast<std::int8_t>(i));
      u.push_back(static_cast<std::uint8_t>(i));
    }
    check_prepared(s, world_sizes(600));
    check_prepared(u, world_sizes(600));
  }
  SUBCASE("int32, uint32, int64, uint64: extremes, random values and multiples of small divisors") {
    check_prepared(integer_values<std::int32_t>(64), world_sizes(300));
    check_prepared(integer_values<std::uint32_t>(64), world_sizes(300));
    check_prepared(integer_values<std::int64_t>(64), world_sizes(300));
    check_prepared(integer_values<std::uint64_t>(64), world_sizes(300));
  }
  SUBCASE("the most negative values keep their quotient (magnitude 2^(N-1) exact in the word)") {
    CHECK(h::divide(std::int8_t{-128}, h::prepare_divisor<std::int8_t>(1)) == -128);
    CHECK(h::divide(std::int8_t{-128}, h::prepare_divisor<std::int8_t>(128)) == -1);
    CHECK(h::divide(std::numeric_limits<std::int32_t>::min(), h::prepare_divisor<std::int32_t>(1)) ==
          std::numeric_limits<std::int32_t>::min());
    CHECK(h::divide(std::numeric_limits<std::int32_t>::min(),
                    h::prepare_divisor<std::int32_t>(std::int64_t{1} << 31)) == -1);
    CHECK(h::divide(std::numeric_limits<std::int64_t>::min(), h::prepare_divisor<std::int64_t>(1)) ==
          std::numeric_limits<std::int64_t>::min());
    CHECK(h::divide(std::numeric_limits<std::int64_t>::min(), h::prepare_divisor<std::int64_t>(3)) ==
          std::numeric_limits<std::int64_t>::min() / 3);
  }
}

TEST_CASE("divide_invariant: every 32-bit dividend for 12 divisors (RINGZERO_TEST_EXHAUSTIVE=1)") {
  if (!exhaustive_divisors()) return;
  for (std::uint32_t d :
       {3u, 5u, 6u, 7u, 641u, 1000u, 65535u, 65537u, 0x7fffffffu, 0x80000001u, 0xfffffffeu, 0xffffffffu}) {
    const auto p = h::prepare_invariant_divisor<std::uint32_t>(d);
    std::uint64_t wrong = 0;
    std::uint32_t n = 0;
    do { wrong += h::divide_invariant(n, p) != n / d; } while (++n != 0);
    CAPTURE(d);
    CHECK(wrong == 0);
  }
}
