// The reproducible-sum format (primitive/reproducible_sum.hpp): bins, truncation to words, the
// single correctly rounded conversion (hand-computed cases, a randomized comparison with a
// reference built from exact double operations, and an exact rational check of divisions), and
// the binned accumulator's independence of the order of its contributions.

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ringzero/collective/reproducible_accumulator.hpp"
#include "ringzero/core/half.hpp"
#include "ringzero/primitive/reproducible_arrays.hpp"
#include "ringzero/primitive/reproducible_sum.hpp"

namespace {

using namespace ringzero;
using namespace ringzero::primitive;

std::uint64_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
std::uint64_t bits_of(double x) { return std::bit_cast<std::uint64_t>(x); }

decoded_value decoded(float x) { return decode_bits(bits_of(x), format_of(dtype::float32)); }
decoded_value decoded(double x) { return decode_bits(bits_of(x), format_of(dtype::float64)); }

/// Rounds (sign * magnitude * 2^exponent / divisor) to `t` (the function under test).
std::uint64_t rounded(dtype t, std::int64_t s, int exponent, std::uint64_t divisor = 1) {
  return round_to_format(s < 0, static_cast<uint128>(s < 0 ? -static_cast<int128>(s) : s), exponent, divisor,
                         format_of(t));
}

/// Reference: `v` (an exact double) rounded to nearest-even at precision p with minimum normal
/// exponent emin and maximum exponent emax, using only exact double operations (scaling by
/// powers of two, nearbyint in the default rounding mode).
double reference_round(double v, int p, int emin, int emax) {
  if (v == 0) return 0.0;
  int e = 0;
  std::frexp(std::fabs(v), &e);  // |v| in [2^(e-1), 2^e)
  const int q = std::max(e - 1, emin) - (p - 1);
  const double r = std::ldexp(std::nearbyint(std::ldexp(std::fabs(v), -q)), q);
  if (r >= std::ldexp(1.0, emax + 1)) return std::copysign(INFINITY, v);
  return std::copysign(r, v);
}

/// The bits of `v` (already representable) in `t`.
std::uint64_t encode(double v, dtype t) {
  switch (t) {
    case dtype::float32: return bits_of(static_cast<float>(v));
    case dtype::float64: return bits_of(v);
    case dtype::float16: return ringzero::detail::float_to_half_bits(static_cast<float>(v));
    case dtype::bfloat16: return ringzero::detail::float_to_bfloat16_bits(static_cast<float>(v));
    default: return 0;
  }
}

}  // namespace

TEST_CASE("reproducible format: bins of values") {
  CHECK(top_bin(decoded(1.0f)) == 90);  // bit 0 + 1080 = 1080 = 12 * 90
  CHECK(top_bin(decoded(2047.0f)) == 90);
  CHECK(top_bin(decoded(4096.0f)) == 91);
  CHECK(top_bin(decoded(0.5f)) == 89);
  CHECK(top_bin(decoded(-0.5f)) == 89);
  CHECK(top_bin(decoded(0.0f)) == 0);
  CHECK(top_bin(decoded(-0.0)) == 0);
  CHECK(top_bin(decoded(std::ldexp(1.0, -1074))) == 0);
  CHECK(top_bin(decoded(1.7976931348623157e308)) == 175);
  CHECK(top_bin(decoded(INFINITY)) == reproducible_nonfinite_bin);
  CHECK(top_bin(decoded(-INFINITY)) == reproducible_nonfinite_bin);
  CHECK(top_bin(decoded(NAN)) == reproducible_nonfinite_bin);
  const decoded_value sub = decoded(std::ldexp(1.0f, -149));
  CHECK(sub.significand == 1);
  CHECK(sub.exponent == -149);
  CHECK(top_bin(decode_bits(0x0001, format_of(dtype::float16))) == (1080 - 24) / 12);
  CHECK(reproducible_kept_bins(dtype::float64) == 6);
  CHECK(reproducible_kept_bins(dtype::bfloat16) == 3);
  CHECK(reproducible_words(dtype::float64) == 2);
  CHECK(reproducible_words(dtype::float32) == 1);
}

TEST_CASE("reproducible format: truncation toward zero to the kept bins") {
  std::int64_t w[2] = {0, 0};
  add_words(w, decoded(1.0f), 90, 3);  // unit 2^(12*88-1080) = 2^-24
  CHECK(w[0] == (std::int64_t{1} << 24));
  w[0] = 0;
  add_words(w, decoded(-1.5f), 90, 3);
  CHECK(w[0] == -(std::int64_t{3} << 23));
  w[0] = 0;
  add_words(w, decoded(1.0f + std::ldexp(1.0f, -23)), 91, 3);  // unit 2^-12: the low bit is dropped
  CHECK(w[0] == (std::int64_t{1} << 12));
  w[0] = 0;
  add_words(w, decoded(-(1.0f + std::ldexp(1.0f, -12) + std::ldexp(1.0f, -13))), 91, 3);  // toward zero
  CHECK(w[0] == -((std::int64_t{1} << 12) + 1));
  w[0] = 0;
  add_words(w, decoded(std::ldexp(1.0f, -30)), 90, 3);
  CHECK(w[0] == 0);
  // float64: two words of three bins, unit 2^(12*85-1080) = 2^-60 at top 90.
  add_words(w, decoded(1.0 + std::ldexp(1.0, -52)), 90, 6);
  CHECK(w[0] == (std::int64_t{1} << 24));
  CHECK(w[1] == (std::int64_t{1} << 8));
  w[0] = w[1] = 0;
  add_words(w, decoded(-(std::ldexp(1.0, -10) + std::ldexp(1.0, -59) + std::ldexp(1.0, -62))), 90, 6);
  CHECK(w[0] == -(std::int64_t{1} << 14));
  CHECK(w[1] == -2);  // 2^-62 truncated toward zero
  // Non-finite contributions at the non-finite top bin.
  w[0] = w[1] = 0;
  add_words(w, decoded(INFINITY), reproducible_nonfinite_bin, 3);
  add_words(w, decoded(3.0f), reproducible_nonfinite_bin, 3);
  CHECK(w[0] == 1);
  add_words(w, decoded(-INFINITY), reproducible_nonfinite_bin, 3);
  CHECK(w[0] == 1 + (std::int64_t{1} << 27));
}

TEST_CASE("reproducible format: hand-computed roundings") {
  const dtype f32 = dtype::float32, f64 = dtype::float64;
  CHECK(rounded(f32, 3, 0) == bits_of(3.0f));
  CHECK(rounded(f32, -3, 0) == bits_of(-3.0f));
  CHECK(rounded(f32, 0, 5) == 0);
  CHECK(rounded(f32, 1, 0, 3) == 0x3EAAAAABu);  // 1/3
  CHECK(rounded(f32, 2, 0, 3) == 0x3F2AAAABu);  // 2/3
  CHECK(rounded(f64, 1, 0, 3) == 0x3FD5555555555555u);
  CHECK(rounded(f32, 6, -1, 4) == bits_of(0.75f));
  // Ties to even, and the sticky bit of a remainder.
  CHECK(rounded(f32, (1 << 24) + 1, 0) == bits_of(16777216.0f));
  CHECK(rounded(f32, (1 << 24) + 3, 0) == bits_of(16777220.0f));
  CHECK(rounded(f32, (1 << 25) + 3, 0) == bits_of(33554436.0f));
  CHECK(rounded(f32, 3 * ((1 << 24) + 1), 0, 3) == bits_of(16777216.0f));      // exactly the tie
  CHECK(rounded(f32, 3 * ((1 << 24) + 1) + 1, 0, 3) == bits_of(16777218.0f));  // just above it
  CHECK(rounded(f32, 3 * ((1 << 24) + 1) - 1, 0, 3) == bits_of(16777216.0f));  // just below it
  // Subnormal results and the step into the normal range.
  CHECK(rounded(f32, 1, -149) == 1);
  CHECK(rounded(f32, 1, -150) == 0);  // half of the smallest subnormal: tie to even (zero)
  CHECK(rounded(f32, -1, -150) == 0x80000000u);
  CHECK(rounded(f32, 3, -151) == 1);
  CHECK(rounded(f32, 3, -150) == 2);
  CHECK(rounded(f32, (1 << 24) - 1, -150) == 0x00800000u);  // rounds up to the smallest normal
  CHECK(rounded(f32, 1, -149, 3) == 0);                     // a third of the smallest subnormal
  CHECK(rounded(f32, 2, -149, 3) == 1);
  CHECK(rounded(f64, 1, -1074) == 1);
  CHECK(rounded(f64, 3, -1076) == 1);
  CHECK(rounded(f64, 1, -1075) == 0);
  // Overflow.
  CHECK(rounded(f32, 1, 128) == 0x7F800000u);
  CHECK(rounded(f32, -1, 128) == 0xFF800000u);
  CHECK(rounded(f32, (1 << 24) - 1, 104) == 0x7F7FFFFFu);
  CHECK(rounded(f32, (1 << 25) - 1, 103) == 0x7F800000u);  // the tie above the largest float
  CHECK(rounded(dtype::float16, 65504, 0) == 0x7BFF);
  CHECK(rounded(dtype::float16, 65519, 0) == 0x7BFF);
  CHECK(rounded(dtype::float16, 65520, 0) == 0x7C00);
  CHECK(rounded(dtype::float16, 4 * 30000, 0, 4) == ringzero::detail::float_to_half_bits(30000.0f));
  CHECK(rounded(dtype::bfloat16, 257, 0) == 0x4380);
  CHECK(rounded(dtype::bfloat16, 259, 0) == 0x4382);
  CHECK(rounded(dtype::bfloat16, 1, -133) == 1);  // bfloat16's smallest subnormal
  // float64 from two words: S = hi * 2^36 + lo at top 90 (unit 2^-60).
  const float_format f = format_of(f64);
  auto two = [&](std::int64_t hi, std::int64_t lo, std::uint64_t divisor = 1) {
    const std::int64_t w[2] = {hi, lo};
    return convert_words(w, 90, divisor, 6, f);
  };
  CHECK(two(1 << 24, 0) == bits_of(1.0));
  CHECK(two(1 << 24, 1 << 7) == bits_of(1.0));  // 1 + 2^-53: tie to even
  CHECK(two(1 << 24, (1 << 7) + 1) == bits_of(1.0 + std::ldexp(1.0, -52)));
  CHECK(two(1 << 24, 3 << 7) == bits_of(1.0 + std::ldexp(1.0, -51)));
  CHECK(two(1 << 24, -(1 << 7)) == bits_of(1.0 - std::ldexp(1.0, -53)));  // exact below 1
  CHECK(two(-(1 << 24), -(1 << 7) - 1) == bits_of(-(1.0 + std::ldexp(1.0, -52))));
  CHECK(two(std::int64_t{1} << 61, (std::int64_t{1} << 36) - 1) == bits_of(std::ldexp(1.0, 37)));
  CHECK(two(3 << 24, 0, 3) == bits_of(1.0));
  CHECK(two(1 << 24, 0, 3) == 0x3FD5555555555555u);
  // Non-finite words, and avg of nothing.
  const std::int64_t pos[1] = {5}, neg[1] = {std::int64_t{2} << 27}, both[1] = {1 + (std::int64_t{1} << 27)};
  CHECK(convert_words(pos, reproducible_nonfinite_bin, 1, 3, format_of(f32)) == 0x7F800000u);
  CHECK(convert_words(neg, reproducible_nonfinite_bin, 4, 3, format_of(f32)) == 0xFF800000u);
  CHECK(std::isnan(std::bit_cast<float>(
      static_cast<std::uint32_t>(convert_words(both, reproducible_nonfinite_bin, 1, 3, format_of(f32))))));
  CHECK(convert_words(both, reproducible_nonfinite_bin, 1, 3, format_of(dtype::float16)) == 0x7E00);
  const std::int64_t one[1] = {1 << 24};
  CHECK(std::isnan(std::bit_cast<float>(static_cast<std::uint32_t>(convert_words(one, 90, 0, 3, format_of(f32))))));
}

TEST_CASE("reproducible format: randomized roundings match an exact-double reference") {
  std::mt19937_64 gen(2026);
  const dtype types[] = {dtype::float32, dtype::float16, dtype::bfloat16, dtype::float64};
  int checked = 0;
  for (int i = 0; i < 40000; ++i) {
    const dtype t = types[i % 4];
    const float_format f = format_of(t);
    const int bits = 1 + static_cast<int>(gen() % 53);
    std::int64_t s = static_cast<std::int64_t>(gen() >> (64 - bits));
    if (gen() & 1) s = -s;
    const int k = static_cast<int>(gen() % 27);  // divisor 2^k
    const int emin = 1 - f.bias, emax = f.bias;
    // Exponents around the whole range of the format: subnormal, normal and overflowing results.
    const int lo = emin - f.precision - bits - 2, hi = emax + 2 - bits + k;
    const int e = lo + static_cast<int>(gen() % static_cast<std::uint64_t>(hi - lo + 1));
    const double v = std::ldexp(static_cast<double>(s), e - k);
    if (t == dtype::float64 && (std::fabs(v) < 0x1p-1000 || std::isinf(v))) continue;  // not exact in double
    const double ref = reference_round(v, f.precision, emin, emax);
    const std::uint64_t got = rounded(t, s, e, std::uint64_t{1} << k);
    INFO("dtype " << dtype_name(t) << " s " << s << " e " << e << " k " << k);
    if (ref == 0)
      CHECK((got & ~(std::uint64_t{1} << (f.exponent_bits + f.precision - 1))) == 0);
    else
      CHECK(got == encode(ref, t));
    ++checked;
  }
  CHECK(checked > 30000);
}

TEST_CASE("reproducible format: divisions round to the nearest float32 (exact rational check)") {
  std::mt19937_64 gen(7);
  for (int i = 0; i < 20000; ++i) {
    const std::int64_t s = static_cast<std::int64_t>(gen() >> 24);  // < 2^40
    const std::uint64_t d = 1 + (gen() >> 44);                      // < 2^20
    if (s == 0) continue;
    const float r = std::bit_cast<float>(static_cast<std::uint32_t>(rounded(dtype::float32, s, 0, d)));
    REQUIRE(std::isnormal(r));
    // Distances |s - c*d| for c in {r, its neighbours}, all scaled by 2^60 to integers.
    auto distance = [&](float c) {
      const int128 scaled_c = static_cast<int128>(std::ldexp(static_cast<double>(c), 40)) * static_cast<int128>(d);
      const int128 diff = (static_cast<int128>(s) << 40) - scaled_c;
      return diff < 0 ? -diff : diff;
    };
    const int128 here = distance(r), below = distance(std::nextafter(r, 0.0f)),
                 above = distance(std::nextafter(r, INFINITY));
    INFO("s " << s << " d " << d);
    CHECK(here <= below);
    CHECK(here <= above);
    if (here == below || here == above) CHECK((std::bit_cast<std::uint32_t>(r) & 1) == 0);
  }
}

TEST_CASE("reproducible format: the array functions equal the element functions on random bit patterns") {
  std::mt19937_64 gen(123);
  for (dtype t : {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16}) {
    const int w = reproducible_words(t), kept = reproducible_kept_bins(t);
    const float_format f = format_of(t);
    const std::uint64_t n = 50000;
    std::vector<unsigned char> values(n * dtype_size(t));
    for (std::uint64_t i = 0; i < n; ++i) {
      std::uint64_t b = gen();
      if (i % 3 == 0)
        b &= ~(std::uint64_t{0x7FF} << 52) & ~(std::uint64_t{0xFF} << 23) & ~(std::uint64_t{0x7C00});  // subnormals
      store_bits(values.data(), i, t, b);
    }
    std::vector<std::uint8_t> tops(n, 0);
    fold_top_bins(tops.data(), values.data(), n, t);
    for (std::uint64_t i = 0; i < n; ++i) {
      INFO(dtype_name(t) << " bits " << load_bits(values.data(), i, t));
      REQUIRE(tops[i] == top_bin(decode_bits(load_bits(values.data(), i, t), f)));
    }
    // Global tops at or above each element's own (another rank's larger values), up to 175.
    for (auto& top : tops)
      if (top != reproducible_nonfinite_bin)
        top = static_cast<std::uint8_t>(std::min<std::uint64_t>(175, top + gen() % 4));
    std::vector<std::int64_t> fast(n * static_cast<std::uint64_t>(w), 0), slow(fast.size(), 0);
    add_truncated_words(fast.data(), values.data(), tops.data(), n, t);
    for (std::uint64_t i = 0; i < n; ++i)
      add_words(slow.data() + i * static_cast<std::uint64_t>(w), decode_bits(load_bits(values.data(), i, t), f),
                tops[i], kept);
    CHECK(fast == slow);
  }
}

TEST_CASE("reproducible format: the portable loops (not the AVX-512 copies) equal the element functions") {
  std::mt19937_64 gen(321);
  for (int round = 0; round < 20; ++round) {
    const std::uint64_t n = ringzero::primitive::detail::reproducible_block;  // the loops' largest block
    std::vector<std::uint32_t> b32(n);
    std::vector<std::uint64_t> b64(n);
    for (std::uint64_t i = 0; i < n; ++i) {
      b32[i] = static_cast<std::uint32_t>(gen());
      b64[i] = gen();
      if (i % 3 == 0) {
        b32[i] &= ~(std::uint32_t{0xFF} << 23);
        b64[i] &= ~(std::uint64_t{0x7FF} << 52);
      }
    }
    std::vector<std::uint8_t> t32(n, 0), t64(n, 0), slow(n, 0);
    std::vector<float> f32(n);
    for (std::uint64_t i = 0; i < n; ++i) f32[i] = std::bit_cast<float>(b32[i]);
    ringzero::primitive::detail::fold_tops_f32_body(t32.data(), f32.data(), n);
    ringzero::primitive::detail::fold_tops_f64_body(t64.data(), slow.data(), b64.data(), n);
    for (std::uint64_t i = 0; i < n; ++i) {
      REQUIRE(t32[i] == top_bin(decode_bits(b32[i], format_of(dtype::float32))));
      if (slow[i] == 0)
        REQUIRE(t64[i] == top_bin(decode_bits(b64[i], format_of(dtype::float64))));
      else
        t64[i] = top_bin(decode_bits(b64[i], format_of(dtype::float64)));  // a subnormal: the caller's fix-up
    }
    for (std::uint64_t i = 0; i < n; ++i) {
      if (t32[i] != reproducible_nonfinite_bin)
        t32[i] = static_cast<std::uint8_t>(std::min<std::uint64_t>(175, t32[i] + gen() % 3));
      if (t64[i] != reproducible_nonfinite_bin)
        t64[i] = static_cast<std::uint8_t>(std::min<std::uint64_t>(175, t64[i] + gen() % 3));
    }
    std::vector<std::int64_t> w32(n, 0), e32(n, 0), w64(2 * n, 0), e64(2 * n, 0);
    ringzero::primitive::detail::add_words_f32_body(w32.data(), f32.data(), t32.data(), n);
    ringzero::primitive::detail::add_words_f64_body(w64.data(), slow.data(), b64.data(), t64.data(), n);
    for (std::uint64_t i = 0; i < n; ++i) {
      add_words(e32.data() + i, decode_bits(b32[i], format_of(dtype::float32)), t32[i], 3);
      if (slow[i] != 0) add_words(w64.data() + 2 * i, decode_bits(b64[i], format_of(dtype::float64)), t64[i], 6);
      add_words(e64.data() + 2 * i, decode_bits(b64[i], format_of(dtype::float64)), t64[i], 6);
    }
    CHECK(w32 == e32);
    CHECK(w64 == e64);
    std::vector<float> out(n);
    for (int shift : {0, 1, 5}) {
      ringzero::primitive::detail::convert_f32_body(out.data(), slow.data(), w32.data(), t32.data(), n, shift);
      for (std::uint64_t i = 0; i < n; ++i)
        if (slow[i] == 0)
          REQUIRE(std::bit_cast<std::uint32_t>(out[i]) ==
                  convert_words(w32.data() + i, t32[i], std::uint64_t{1} << shift, 3, format_of(dtype::float32)));
    }
  }
}

TEST_CASE("reproducible format: the array conversion equals the element conversion (float32's fast route too)") {
  std::mt19937_64 gen(99);
  for (dtype t : {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16}) {
    const int w = reproducible_words(t), kept = reproducible_kept_bins(t);
    const std::uint64_t n = 20000;
    std::vector<std::int64_t> words(n * static_cast<std::uint64_t>(w));
    std::vector<std::uint8_t> tops(n);
    for (std::uint64_t i = 0; i < n; ++i) {
      tops[i] = static_cast<std::uint8_t>(gen() % 176);
      if (i % 97 == 0) tops[i] = reproducible_nonfinite_bin;
      for (int j = 0; j < w; ++j) {
        const int bits = static_cast<int>(gen() % 63);
        auto v = static_cast<std::int64_t>(gen() >> (64 - bits - 1) >> 1);
        words[i * static_cast<std::uint64_t>(w) + static_cast<std::uint64_t>(j)] = (gen() & 1) ? -v : v;
      }
    }
    for (std::uint64_t divisor :
         {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{8}, std::uint64_t{3}, std::uint64_t{1} << 26}) {
      std::vector<std::uint64_t> out(n, 0);
      std::vector<unsigned char> packed(n * dtype_size(t));
      convert_to(packed.data(), words.data(), tops.data(), n, t, divisor);
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint64_t expected =
            convert_words(words.data() + i * static_cast<std::uint64_t>(w), tops[i], divisor, kept, format_of(t));
        INFO(dtype_name(t) << " element " << i << " divisor " << divisor);
        REQUIRE(load_bits(packed.data(), i, t) == expected);
      }
    }
  }
}

namespace {

/// Adversarial contributions: values spanning 2^-60..2^60 of both signs, with cancellation.
template <class T>
std::vector<std::vector<T>> adversarial(int contributions, std::size_t count, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::vector<T>> out(static_cast<std::size_t>(contributions), std::vector<T>(count));
  for (std::size_t i = 0; i < count; ++i)
    for (int c = 0; c < contributions; ++c) {
      double v = std::ldexp(1.0 + static_cast<double>(gen() % 1000) / 1000.0, static_cast<int>(gen() % 121) - 60);
      if (gen() & 1) v = -v;
      if (i % 5 == 1 && c < 2) v = c == 0 ? 0x1p60 : -0x1p60;  // cancels exactly
      if (i % 7 == 3) v = std::ldexp(v, -30);
      out[static_cast<std::size_t>(c)][i] = static_cast<T>(static_cast<float>(v));
      if constexpr (std::is_same_v<T, double>) out[static_cast<std::size_t>(c)][i] = v;
    }
  return out;
}

/// The accumulator of `values` added in the order `order`, as (tops, limbs) bytes.
template <class T>
std::vector<std::uint8_t> storage_after(const std::vector<std::vector<T>>& values, const std::vector<int>& order) {
  reproducible_accumulator acc(values[0].size(), dtype_of<T>);
  for (int c : order) acc.add(std::span<const T>(values[static_cast<std::size_t>(c)]));
  const binned_view v = acc.view();
  const std::size_t kept = static_cast<std::size_t>(reproducible_kept_bins(v.type));
  std::vector<std::int64_t> limbs(v.count * kept);
  for (std::size_t i = 0; i < v.count; ++i) v.limbs_of(i, limbs.data() + i * kept);
  std::vector<std::uint8_t> bytes(v.count + limbs.size() * 8);
  std::memcpy(bytes.data(), v.tops, v.count);
  std::memcpy(bytes.data() + v.count, limbs.data(), limbs.size() * 8);
  return bytes;
}

}  // namespace

TEST_CASE_TEMPLATE("reproducible accumulator: the order of contributions never matters", T, float, double, float16,
                   bfloat16) {
  const auto values = adversarial<T>(8, 257, 11);
  std::vector<int> order(8);
  for (int i = 0; i < 8; ++i) order[static_cast<std::size_t>(i)] = i;
  const auto first = storage_after(values, order);
  std::mt19937 gen(5);
  for (int trial = 0; trial < 20; ++trial) {
    std::shuffle(order.begin(), order.end(), gen);
    CHECK(storage_after(values, order) == first);
  }
  // The accumulator's words at its own top equal the direct truncation of every contribution.
  reproducible_accumulator acc(values[0].size(), dtype_of<T>);
  for (const auto& v : values) acc.add(std::span<const T>(v));
  const binned_view view = acc.view();
  const int w = reproducible_words(dtype_of<T>);
  std::vector<std::uint8_t> tops(view.count, 0);
  for (const auto& v : values) fold_top_bins(tops.data(), v.data(), view.count, dtype_of<T>);
  CHECK(std::equal(tops.begin(), tops.end(), view.tops));
  std::vector<std::int64_t> direct(view.count * static_cast<std::size_t>(w), 0), binned(direct.size(), 0);
  for (const auto& v : values) add_truncated_words(direct.data(), v.data(), tops.data(), view.count, dtype_of<T>);
  view.add_words(binned.data(), tops.data(), 0, view.count);
  CHECK(direct == binned);
  // At a higher global top bin too (what another rank's larger values cause).
  std::vector<std::uint8_t> higher(tops);
  for (auto& t : higher)
    if (t != reproducible_nonfinite_bin) t = static_cast<std::uint8_t>(std::min(175, t + 1));
  std::fill(direct.begin(), direct.end(), 0);
  std::fill(binned.begin(), binned.end(), 0);
  for (const auto& v : values) add_truncated_words(direct.data(), v.data(), higher.data(), view.count, dtype_of<T>);
  view.add_words(binned.data(), higher.data(), 0, view.count);
  CHECK(direct == binned);
}

TEST_CASE("reproducible accumulator: arguments and clear") {
  CHECK_THROWS_AS(reproducible_accumulator(4, dtype::int32), ringzero::error);
  reproducible_accumulator acc(3, dtype::float32);
  const std::vector<float> three{1.0f, 2.0f, 3.0f}, two{1.0f, 2.0f};
  const std::vector<double> wrong{1.0, 2.0, 3.0};
  CHECK_THROWS_AS(acc.add(std::span<const float>(two)), ringzero::error);
  CHECK_THROWS_AS(acc.add(std::span<const double>(wrong)), ringzero::error);
  CHECK_THROWS_AS(acc.add(nullptr), ringzero::error);
  acc.add(std::span<const float>(three));
  acc.add(std::span<const float>(three));
  CHECK(acc.contributions() == 2);
  CHECK(acc.count() == 3);
  CHECK(acc.type() == dtype::float32);
  acc.clear();
  CHECK(acc.contributions() == 0);
  std::uint8_t folded[3] = {0, 0, 0};  // cleared: no top folds in (the storage is not read)
  acc.view().fold_tops(folded, 0, 3);
  CHECK((folded[0] == 0 && folded[1] == 0 && folded[2] == 0));
  std::int64_t limbs[6] = {1, 1, 1, 1, 1, 1};
  acc.view().limbs_of(2, limbs);
  CHECK((limbs[0] == 0 && limbs[1] == 0 && limbs[2] == 0));
}

namespace {

/// The reproducible float32 sum of element i of `inputs` over every input, by the element
/// functions: the max top bin, the words at it, one conversion.
std::uint32_t element_sum_f32(const std::vector<std::vector<float>>& inputs, std::size_t i, std::uint64_t divisor) {
  const float_format f = format_of(dtype::float32);
  std::uint8_t top = 0;
  for (const auto& x : inputs) top = std::max(top, top_bin(decoded(x[i])));
  std::int64_t word = 0;
  for (const auto& x : inputs) add_words(&word, decoded(x[i]), top, 3);
  return static_cast<std::uint32_t>(convert_words(&word, top, divisor, 3, f));
}

/// A float32 block of `kind`: 0 normal values over the whole range with cancellation, 1 values
/// near the bottom of the normal range (some results subnormal), 2 with subnormals, 3 with
/// infinities and NaNs, 4 near the top of the range (sums that overflow).
float block_value(std::mt19937_64& gen, int kind, int input) {
  const float sign = (gen() & 1) != 0 ? -1.0f : 1.0f;
  const float mantissa = 1.0f + static_cast<float>(gen() % (1u << 23)) * 0x1p-23f;
  switch (kind) {
    case 0: {
      if (gen() % 8 == 0) return input % 2 == 0 ? 0x1p40f : -0x1p40f;  // cancels between inputs 0 and 1
      if (gen() % 16 == 0) return 0.0f;
      return sign * std::ldexp(mantissa, static_cast<int>(gen() % 240) - 120);
    }
    case 1: return sign * std::ldexp(mantissa, -126 + static_cast<int>(gen() % 4));
    case 2:
      return gen() % 4 == 0 ? sign * std::bit_cast<float>(static_cast<std::uint32_t>(gen() % 0x7FFFFF) + 1)
                            : sign * mantissa;
    case 3: {
      const std::uint64_t pick = gen() % 8;
      return pick == 0 ? sign * INFINITY : pick == 1 ? NAN : sign * mantissa;
    }
    default: return sign * std::ldexp(mantissa, 126 + static_cast<int>(gen() % 2));
  }
}

}  // namespace

TEST_CASE("reproducible format: the fused float32 sum equals the element functions") {
  std::mt19937_64 gen(2024);
  constexpr std::uint64_t block = ringzero::primitive::detail::reproducible_fused_block;
  for (int n_in : {1, 2, 3, 4, 5, 6, 7, 8, 16}) {
    for (int kind = 0; kind < 5; ++kind) {
      for (std::uint64_t len : {std::uint64_t{1}, std::uint64_t{17}, block}) {
        const std::uint64_t first = gen() % 7;  // blocks that start inside the inputs
        std::vector<std::vector<float>> inputs(static_cast<std::size_t>(n_in), std::vector<float>(first + len));
        for (auto& x : inputs)
          for (std::uint64_t i = 0; i < first + len; ++i)
            x[i] = block_value(gen, kind, static_cast<int>(&x - inputs.data()));
        if (kind == 0 && len == block) inputs[0][first + len / 2] = 0x1p-149f;  // one subnormal in an ordinary block
        std::vector<const float*> ins;
        for (const auto& x : inputs) ins.push_back(x.data());
        for (std::uint64_t divisor : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{4}, std::uint64_t{3}}) {
          std::vector<float> result(len);
          reproducible_sum_f32(result.data(), ins.data(), n_in, first, len, divisor);
          for (std::uint64_t i = 0; i < len; ++i) {
            INFO("inputs " << n_in << " kind " << kind << " len " << len << " divisor " << divisor << " element " << i);
            REQUIRE(std::bit_cast<std::uint32_t>(result[i]) == element_sum_f32(inputs, first + i, divisor));
          }
          // The portable loop (not the AVX-512 copy): where it reports no rare element, the same bits.
          std::vector<float> portable(len);
          if (ringzero::primitive::detail::sum_f32_body(portable.data(), ins.data(), n_in, first, len,
                                                        divisor == 3 ? 0 : std::countr_zero(divisor)) == 0 &&
              divisor != 3)
            CHECK(std::memcmp(portable.data(), result.data(), len * 4) == 0);
          if (kind == 0 && divisor == 1 && len == 17)
            CHECK(ringzero::primitive::detail::sum_f32_body(portable.data(), ins.data(), n_in, first, len, 0) == 0);
        }
      }
    }
  }
}
