// The binned accumulator's array paths (primitive/reproducible_arrays.hpp: accumulate_array and
// add_accumulator_words) against the element functions (accumulate, add_limb_words), bit for bit,
// for every floating dtype: random bit patterns (every bin, zeros, subnormals, inf, NaN), values
// whose bins rise between contributions, mostly finite contributions, and block tails.

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ringzero/collective/reproducible_accumulator.hpp"
#include "ringzero/primitive/reproducible_arrays.hpp"
#include "ringzero/primitive/reproducible_sum.hpp"

namespace {

using namespace ringzero;
using namespace ringzero::primitive;

/// Raw bits of element `i` of `t` for contribution `k` of `rounds` under `pattern`.
std::uint64_t make_bits(std::mt19937_64& rng, dtype t, int pattern, int k, int rounds, std::uint64_t i) {
  const float_format f = format_of(t);
  const int mant_bits = f.precision - 1, total = f.exponent_bits + f.precision;
  const std::uint64_t all_ones = (std::uint64_t{1} << f.exponent_bits) - 1;
  const std::uint64_t sign = (rng() & 1) << (total - 1), frac = rng() & ((std::uint64_t{1} << mant_bits) - 1);
  switch (pattern) {
    case 0:  // any bit pattern: every bin, subnormals, inf, NaN
      return rng() & ((total == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << total) - 1));
    case 1: {  // finite, exponent rising with k (tops rise between contributions by 0..several bins)
      const std::uint64_t span = all_ones - 1;
      const std::uint64_t e = std::min<std::uint64_t>(
          span, span * static_cast<std::uint64_t>(k + 1) / static_cast<std::uint64_t>(rounds) + rng() % 40);
      return sign | (e << mant_bits) | frac;
    }
    case 2: {  // specials among ordinary values
      switch (rng() % 10) {
        case 0: return sign;                                                            // +-0
        case 1: return sign | 1;                                                        // smallest subnormal
        case 2: return sign | frac;                                                     // subnormal
        case 3: return sign | ((all_ones - 1) << mant_bits) | frac;                     // near the largest
        case 4: return rng() % 50 == 0 ? sign | (all_ones << mant_bits) : sign | frac;  // rare inf
        case 5: return rng() % 50 == 0 ? (all_ones << mant_bits) | 1 : sign;            // rare NaN
        default: return sign | ((all_ones / 2 + rng() % 24 - 12) << mant_bits) | frac;  // near 1
      }
    }
    case 4:  // every 8th element infinite or NaN, the others in one bin: after the first, no top moves
      if (i % 8 == 0) return rng() % 3 == 0 ? (all_ones << mant_bits) | 1 : sign | (all_ones << mant_bits);
      return sign | ((all_ones / 2 + rng() % 3) << mant_bits) | frac;
    case 5:  // positive, narrow range near one exponent: limbs grow fastest, tops stay
      return ((all_ones / 2 + rng() % 3) << mant_bits) | frac;
    default:  // narrow range near one exponent: limbs grow, tops stay
      return sign | ((all_ones / 2 + rng() % 3) << mant_bits) | frac;
  }
}

void compare_paths(dtype t, std::uint64_t count, int pattern, int rounds, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int kept = reproducible_kept_bins(t);
  const std::size_t es = dtype_size(t);
  std::vector<std::uint8_t> tops_ref(count, 0), tops_fast(count, 0);
  std::vector<std::int64_t> limbs_ref(count * static_cast<std::size_t>(kept), 0), limbs_fast(limbs_ref.size(), 0);
  reproducible_accumulator acc(count, t);
  std::vector<unsigned char> values(count * es);
  for (int k = 0; k < rounds; ++k) {
    for (std::uint64_t i = 0; i < count; ++i) store_bits(values.data(), i, t, make_bits(rng, t, pattern, k, rounds, i));
    for (std::uint64_t i = 0; i < count; ++i)
      accumulate(tops_ref[i], limbs_ref.data() + i * static_cast<std::uint64_t>(kept), kept,
                 decode_bits(load_bits(values.data(), i, t), format_of(t)));
    accumulate_array(tops_fast.data(), limbs_fast.data(), values.data(), count, t);
    acc.add(values.data());
    REQUIRE(tops_fast == tops_ref);
    REQUIRE(limbs_fast == limbs_ref);
  }
  const binned_view view = acc.view();
  CHECK(std::equal(tops_ref.begin(), tops_ref.end(), view.tops));
  std::vector<std::int64_t> limbs_acc(limbs_ref.size());
  for (std::uint64_t i = 0; i < count; ++i) view.limbs_of(i, limbs_acc.data() + i * static_cast<std::uint64_t>(kept));
  CHECK(limbs_acc == limbs_ref);
  // Words at global tops = local, local + 0..4 and the non-finite bin.
  const int w = reproducible_words(t);
  for (int raise = 0; raise < 6; ++raise) {
    std::vector<std::uint8_t> global(count);
    for (std::uint64_t i = 0; i < count; ++i) {
      const int up = raise == 5
                         ? 255
                         : std::min(255, tops_ref[i] + static_cast<int>(rng() % static_cast<std::uint64_t>(raise + 1)));
      global[i] =
          tops_ref[i] == reproducible_nonfinite_bin ? reproducible_nonfinite_bin : static_cast<std::uint8_t>(up);
    }
    const std::uint64_t first = count / 3, len = count - first;
    std::vector<std::int64_t> ref(len * static_cast<std::uint64_t>(w), 7), fast(ref.size(), 7);
    for (std::uint64_t i = 0; i < len; ++i)
      add_limb_words(ref.data() + i * static_cast<std::uint64_t>(w), tops_ref[first + i],
                     limbs_ref.data() + (first + i) * static_cast<std::uint64_t>(kept), kept, global[first + i]);
    add_accumulator_words(view, fast.data(), global.data() + first, first, len);
    CHECK(fast == ref);
  }
}

}  // namespace

TEST_CASE("reproducible accumulate_array and add_accumulator_words equal the element functions") {
  for (const dtype t : {dtype::float32, dtype::bfloat16, dtype::float16, dtype::float64})
    for (int pattern = 0; pattern < 5; ++pattern)
      for (const std::uint64_t count : {std::uint64_t{1}, std::uint64_t{1023}, std::uint64_t{2500}}) {
        CAPTURE(dtype_name(t));
        CAPTURE(pattern);
        CAPTURE(count);
        compare_paths(t, count, pattern, pattern == 1 ? 24 : 6, 1000 * static_cast<std::uint64_t>(pattern) + count);
      }
}

TEST_CASE(
    "reproducible accumulator: more contributions than one packed word holds (flushes) keep the element functions' "
    "limbs") {
  // 600 contributions: two flushes of the packed limbs (every 256), limbs beyond 2^20 (pattern 5),
  // tops rising over flushed limbs (pattern 1), non-finite values arriving after a flush (pattern 2).
  for (const dtype t : {dtype::float32, dtype::bfloat16, dtype::float16})
    for (const int pattern : {1, 2, 5}) {
      CAPTURE(dtype_name(t));
      CAPTURE(pattern);
      compare_paths(t, 1100, pattern, 600, 77 + static_cast<std::uint64_t>(pattern));
    }
  reproducible_accumulator acc(1, dtype::float32);
  const float big = 0x1.fffffep0f;  // digits 0x1, 0xFFF, 0xFFF at its top bin
  for (int k = 0; k < 600; ++k) acc.add(std::span<const float>(&big, 1));
  std::int64_t limbs[6];
  acc.view().limbs_of(0, limbs);
  CHECK(limbs[1] == 600 * 0xFFF);  // > 2^20: only exact because of the flushes
}

TEST_CASE("reproducible accumulate_array covers every float32 exponent rising over one element's top") {
  // Each element sees every exponent field in increasing order, then in decreasing order.
  const std::uint64_t count = 512;
  std::vector<std::uint8_t> tops_ref(count, 0), tops_fast(count, 0);
  std::vector<std::int64_t> limbs_ref(3 * count, 0), limbs_fast(3 * count, 0);
  std::vector<std::uint32_t> values(count);
  std::mt19937_64 rng(7);
  for (int step = 0; step < 2 * 255; ++step) {
    const std::uint32_t e = static_cast<std::uint32_t>(step < 255 ? step : 509 - step);
    for (std::uint64_t i = 0; i < count; ++i)
      values[i] =
          (static_cast<std::uint32_t>(rng() & 1) << 31) | (e << 23) | static_cast<std::uint32_t>(rng() & 0x7FFFFF);
    for (std::uint64_t i = 0; i < count; ++i)
      accumulate(tops_ref[i], limbs_ref.data() + 3 * i, 3, decode_bits(values[i], format_of(dtype::float32)));
    accumulate_array(tops_fast.data(), limbs_fast.data(), values.data(), count, dtype::float32);
    REQUIRE(tops_fast == tops_ref);
    REQUIRE(limbs_fast == limbs_ref);
  }
}

TEST_CASE("reproducible packed deposit: the portable loop (not the AVX-512 copy) equals the element function") {
  // Tops rising by 0, 1, 2 and more bins between contributions, zeros, subnormals, inf and NaN;
  // with and without flushed limbs (where rising tops are the element function's); every other
  // round without the within-top pass.
  std::mt19937_64 rng(11);
  const std::uint64_t n = ringzero::primitive::detail::reproducible_block;
  for (const bool flushed : {false, true}) {
    std::vector<std::uint8_t> tops_ref(n, 0), tops_fast(n, 0), slow(n, 0);
    std::vector<std::int64_t> packed_ref(n, 0), packed_fast(n, 0);
    std::vector<std::int64_t> cold_ref(3 * n, 0), cold_fast(3 * n, 0);
    std::vector<float> values(n);
    for (std::uint64_t i = 0; i < n; ++i) {  // the first deposit overwrites (empty = true): garbage before it
      tops_fast[i] = static_cast<std::uint8_t>(rng());
      packed_fast[i] = static_cast<std::int64_t>(rng());
    }
    for (int k = 0; k < 40; ++k) {
      if (flushed && k % 10 == 5) {  // flushed limbs that later rises move
        flush_packed(tops_ref.data(), packed_ref.data(), cold_ref.data(), n);
        flush_packed(tops_fast.data(), packed_fast.data(), cold_fast.data(), n);
      }
      for (std::uint64_t i = 0; i < n; ++i) {
        std::uint32_t e = static_cast<std::uint32_t>(20 + 5 * k + static_cast<int>(rng() % 30));
        if (rng() % 200 == 0) e = 255;
        if (rng() % 50 == 0) e = 0;
        values[i] = std::bit_cast<float>((static_cast<std::uint32_t>(rng() & 1) << 31) | (std::min(e, 255u) << 23) |
                                         static_cast<std::uint32_t>(rng() & 0x7FFFFF));
      }
      for (std::uint64_t i = 0; i < n; ++i)
        accumulate_packed(tops_ref[i], packed_ref[i], flushed ? cold_ref.data() + 3 * i : nullptr,
                          decode_bits(std::bit_cast<std::uint32_t>(values[i]), format_of(dtype::float32)));
      ringzero::primitive::detail::accumulate_packed_f32_body(tops_fast.data(), packed_fast.data(), slow.data(),
                                                              values.data(), n, flushed, k % 2 == 0, k == 0);
      for (std::uint64_t i = 0; i < n; ++i)
        if (slow[i] != 0)
          accumulate_packed(tops_fast[i], packed_fast[i], flushed ? cold_fast.data() + 3 * i : nullptr,
                            decode_bits(std::bit_cast<std::uint32_t>(values[i]), format_of(dtype::float32)));
      REQUIRE(tops_fast == tops_ref);
      REQUIRE(packed_fast == packed_ref);
      REQUIRE(cold_fast == cold_ref);
    }
  }
}

TEST_CASE(
    "reproducible packed deposit: values within their tops (none, a few, or many outside, bin boundaries) equal the "
    "element function") {
  // After a first contribution sets the tops, each round puts a share of the elements outside
  // their top (0, 1 in 1000, 1 in 100, 1 in 10, 1 in 2: the within-top pass alone, then few or
  // many gathered, or the whole block), the others within it; values at both sides of each element's top bin
  // boundary (the largest float32 below 2^(12 (T + 1) - 1080), and that power of two itself),
  // zeros of either sign, subnormals and rare inf / NaN. Both the portable loop and the
  // dispatched one (AVX-512 where the CPU has it), with and without flushed limbs; every third
  // round without the within-top pass (within = false: the full deposit only).
  std::mt19937_64 rng(23);
  const std::uint64_t n = 2 * ringzero::primitive::detail::reproducible_block + 1003;  // two blocks and a tail
  const float_format f32 = format_of(dtype::float32);
  for (const bool portable : {true, false})
    for (const bool flushed : {false, true}) {
      CAPTURE(portable);
      CAPTURE(flushed);
      std::vector<std::uint8_t> tops_ref(n, 0), tops_fast(n, 0), slow(n, 0);
      std::vector<std::int64_t> packed_ref(n, 0), packed_fast(n, 0), cold_ref(3 * n, 0), cold_fast(3 * n, 0);
      std::vector<float> values(n);
      for (std::uint64_t i = 0; i < n; ++i) {  // the first deposit overwrites (empty = true): garbage before it
        tops_fast[i] = static_cast<std::uint8_t>(rng());
        packed_fast[i] = static_cast<std::int64_t>(rng());
      }
      const std::uint64_t shares[] = {0, 1000, 100, 10, 2};
      for (int k = 0; k < 26; ++k) {
        if (flushed && k % 6 == 3) {
          flush_packed(tops_ref.data(), packed_ref.data(), cold_ref.data(), n);
          flush_packed(tops_fast.data(), packed_fast.data(), cold_fast.data(), n);
        }
        const std::uint64_t share = shares[k % 5];
        const bool within = k % 3 != 2;
        for (std::uint64_t i = 0; i < n; ++i) {
          const int top = tops_ref[i];
          const float sign = (rng() & 1) != 0 ? -1.0f : 1.0f;
          const int boundary = 12 * (top + 1) - 1080;  // the top bin's upper boundary: 2^boundary
          float v = 0;
          if (k == 0 || top == 0 || top == reproducible_nonfinite_bin)
            v = sign *
                std::ldexp(1.0f + static_cast<float>(rng() % 4096) / 4096.0f, -30 + static_cast<int>(rng() % 40));
          else if (share != 0 && rng() % share == 0)  // outside: the boundary itself, or a bin or more above
            v = rng() % 2 == 0 && boundary <= 127
                    ? sign * std::ldexp(1.0f, boundary)
                    : sign * std::ldexp(1.5f, std::min(127, boundary + 1 + static_cast<int>(rng() % 20)));
          else
            switch (rng() % 8) {
              case 0: v = boundary <= 128 ? sign * std::nextafter(std::ldexp(1.0f, boundary), 0.0f) : sign; break;
              case 1: v = sign * 0.0f; break;
              case 2: v = sign * std::bit_cast<float>(static_cast<std::uint32_t>(rng() % 0x7FFFFF + 1)); break;
              default:
                v = sign * std::ldexp(1.0f + static_cast<float>(rng() % 4096) / 4096.0f,
                                      std::min(boundary, 128) - 1 - static_cast<int>(rng() % 30));
            }
          if (rng() % 3000 == 0) v = rng() % 2 == 0 ? sign * INFINITY : NAN;
          values[i] = v;
        }
        for (std::uint64_t i = 0; i < n; ++i)
          accumulate_packed(tops_ref[i], packed_ref[i], flushed ? cold_ref.data() + 3 * i : nullptr,
                            decode_bits(std::bit_cast<std::uint32_t>(values[i]), f32));
        if (portable) {
          for (std::uint64_t first = 0; first < n; first += ringzero::primitive::detail::reproducible_block) {
            const std::uint64_t len = std::min(ringzero::primitive::detail::reproducible_block, n - first);
            ringzero::primitive::detail::accumulate_packed_f32_body(
                tops_fast.data() + first, packed_fast.data() + first, slow.data() + first, values.data() + first, len,
                flushed, within, k == 0);
          }
          for (std::uint64_t i = 0; i < n; ++i)
            if (slow[i] != 0)
              accumulate_packed(tops_fast[i], packed_fast[i], flushed ? cold_fast.data() + 3 * i : nullptr,
                                decode_bits(std::bit_cast<std::uint32_t>(values[i]), f32));
        } else {
          accumulate_packed_array(tops_fast.data(), packed_fast.data(), flushed ? cold_fast.data() : nullptr,
                                  values.data(), n, dtype::float32, within, k == 0);
        }
        REQUIRE(tops_fast == tops_ref);
        REQUIRE(packed_fast == packed_ref);
        REQUIRE(cold_fast == cold_ref);
      }
    }
}

TEST_CASE("reproducible_accumulator: after clear() nothing is read, and the next contribution overwrites") {
  // clear() leaves the float16/bfloat16/float32 storage as it was: a cleared accumulator must
  // fold no top and add no word, and contributions after it must give the bits of a fresh
  // accumulator's (also after a flush of the packed limbs, and for float64, which clears eagerly).
  for (const dtype t : {dtype::float16, dtype::bfloat16, dtype::float32, dtype::float64}) {
    CAPTURE(dtype_name(t));
    std::mt19937_64 rng(41);
    const std::uint64_t count = 2 * ringzero::primitive::detail::reproducible_block + 77;
    const std::size_t es = dtype_size(t);
    const int kept = reproducible_kept_bins(t), w = reproducible_words(t);
    reproducible_accumulator used(count, t);
    std::vector<unsigned char> values(count * es);
    const int before = t == dtype::float64 ? 5 : static_cast<int>(reproducible_packed_contributions) + 3;
    for (int k = 0; k < before; ++k) {  // beyond a flush for the packed dtypes
      for (std::uint64_t i = 0; i < count; ++i) store_bits(values.data(), i, t, make_bits(rng, t, 0, k, before, i));
      used.add(values.data());
    }
    used.clear();
    CHECK(used.contributions() == 0);
    const binned_view cleared = used.view();
    std::vector<std::uint8_t> tops(count, 3);
    cleared.fold_tops(tops.data(), 0, count);
    CHECK(std::all_of(tops.begin(), tops.end(), [](std::uint8_t x) { return x == 3; }));
    std::vector<std::int64_t> words(count * static_cast<std::uint64_t>(w), 5);
    add_accumulator_words(cleared, words.data(), tops.data(), 0, count);
    CHECK(std::all_of(words.begin(), words.end(), [](std::int64_t x) { return x == 5; }));
    std::vector<std::int64_t> limbs(static_cast<std::size_t>(kept), 9);
    cleared.limbs_of(count / 2, limbs.data());
    CHECK(std::all_of(limbs.begin(), limbs.end(), [](std::int64_t x) { return x == 0; }));

    reproducible_accumulator fresh(count, t);
    for (int k = 0; k < 6; ++k) {
      for (std::uint64_t i = 0; i < count; ++i)
        store_bits(values.data(), i, t, make_bits(rng, t, k % 3 == 0 ? 0 : 2, k, 6, i));
      used.add(values.data());
      fresh.add(values.data());
      const binned_view a = used.view(), b = fresh.view();
      REQUIRE(std::equal(a.tops, a.tops + count, b.tops));
      std::vector<std::int64_t> la(static_cast<std::size_t>(kept)), lb(la.size());
      for (std::uint64_t i = 0; i < count; ++i) {
        a.limbs_of(i, la.data());
        b.limbs_of(i, lb.data());
        REQUIRE(la == lb);
      }
    }
  }
}
