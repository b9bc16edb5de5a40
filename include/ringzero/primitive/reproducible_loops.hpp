#pragma once
/// @file
/// The loops of the reproducible sum's array operations (format: primitive/reproducible_sum.hpp;
/// the operations and their choice of loop: primitive/reproducible_arrays.hpp): one branch-free
/// loop body per operation and dtype family, written so that compilers vectorise it, and
/// compiled twice by reproducible_arrays.hpp (for the build's target and, on x86-64, for
/// AVX-512). Each computes bit for bit what the element functions of reproducible_sum.hpp
/// compute, through the exact shortcuts that file's comment lists; elements outside them are
/// flagged for the element functions. Host functions, pure and thread-safe.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ringzero/core/half.hpp"
#include "ringzero/primitive/reproducible_sum.hpp"

namespace ringzero::primitive::detail {

/// Elements per block of the array functions (their float32 staging stays in L1).
inline constexpr std::uint64_t reproducible_block = 1024;

/// 2^k as a double, for -1022 <= k <= 1023.
inline double pow2(int k) noexcept { return std::bit_cast<double>(static_cast<std::uint64_t>(k + 1023) << 52); }

/// `n` values of 16-bit or 32-bit floating dtype `t` as float32 values (exact): float32 arrays
/// as they are, 16-bit ones converted into `staging`.
inline const float* as_float32(float* staging, const void* values, std::uint64_t n, dtype t) noexcept {
  if (t == dtype::float32) return static_cast<const float*>(values);
  const auto* h = static_cast<const std::uint16_t*>(values);
  for (std::uint64_t i = 0; i < n; ++i)
    staging[i] = t == dtype::float16 ? ringzero::detail::half_bits_to_float(h[i])
                                     : ringzero::detail::bfloat16_bits_to_float(h[i]);
  return staging;
}

// ---- float32 (and 16-bit through it) ---------------------------------------------------------

/// tops[i] = max(tops[i], top bin of float32 bits b[i]), n <= reproducible_block. A
/// subnormal's leading bit comes from the exponent of its fraction converted to float (exact
/// below 2^24); x / 12 is (x * 43691) >> 19 for x < 2^17 (43691 * 12 = 2^19 + 4). The
/// floating-point conversions run in a loop of their own, unconditionally, and the selections
/// in an integer loop: compilers vectorise both (a conversion that might trap is never
/// if-converted).
[[gnu::always_inline]] inline void fold_tops_f32_body(std::uint8_t* tops, const float* b, std::uint64_t n) noexcept {
  alignas(64) std::uint32_t fraction_exponent[reproducible_block];
  for (std::uint64_t i = 0; i < n; ++i)
    fraction_exponent[i] = std::bit_cast<std::uint32_t>(static_cast<float>(
                               static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(b[i]) & 0x7FFFFF))) >>
                           23;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(b[i]), e = (bits >> 23) & 0xFF;
    const std::uint32_t position =
        e != 0 ? e + 953 : fraction_exponent[i] + 804;  // leading bit + reproducible_bin_offset
    std::uint32_t bin = (position * 43691u) >> 19;
    bin = e == 255 ? reproducible_nonfinite_bin : bin;
    bin = (bits << 1) == 0 ? 0 : bin;
    tops[i] = std::max(tops[i], static_cast<std::uint8_t>(bin));
  }
}

/// words[i] += the word of float32 bits b[i] at top bin tops[i] (K = 3, unit 2^(12 T - 1104)),
/// n <= reproducible_block. Bins 7..175 scale by 2^-unit, a normal double; below them only
/// zeros occur (the scale is clamped to 2^1023: still 0) and above them the scale is clamped
/// to 2^-1022 (such bins lie far above any 16/32-bit value: 0, as truncation gives). A block
/// with a non-finite element masks values to zero before any floating-point operation and puts
/// the non-finite counts in its words.
[[gnu::always_inline]] inline void add_words_f32_body(std::int64_t* words, const float* b, const std::uint8_t* tops,
                                                      std::uint64_t n) noexcept {
  std::uint8_t nonfinite_block = 0;
  for (std::uint64_t i = 0; i < n; ++i) nonfinite_block |= tops[i] == reproducible_nonfinite_bin ? 1 : 0;
  if (nonfinite_block == 0) {  // the common case: one loop, the scale's exponent clamped to [1, 2046]
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::int32_t field = std::clamp(2127 - 12 * static_cast<std::int32_t>(tops[i]), 1, 2046);
      words[i] += static_cast<std::int64_t>(static_cast<double>(b[i]) *
                                            std::bit_cast<double>(static_cast<std::uint64_t>(field) << 52));
    }
    return;
  }
  alignas(64) std::int64_t scaled[reproducible_block];
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t top = tops[i];
    const std::uint32_t keep = 0u - static_cast<std::uint32_t>(top - 7u < 169u);
    const std::uint64_t field = ((2127u - 12u * top) & keep) | (1023u & ~keep);
    const double x = static_cast<double>(std::bit_cast<float>(std::bit_cast<std::uint32_t>(b[i]) & keep));
    scaled[i] = static_cast<std::int64_t>(x * std::bit_cast<double>(field << 52));  // |x| < 2^(unit+36): exact
  }
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(b[i]), magnitude = bits & 0x7FFFFFFF;
    const std::int64_t nan = magnitude > 0x7F800000u, infinite = magnitude == 0x7F800000u, negative = bits >> 31;
    const std::int64_t nonfinite =
        (nan | (infinite & (negative ^ 1))) + ((nan | (infinite & negative)) << reproducible_negative_inf_shift);
    words[i] += tops[i] == reproducible_nonfinite_bin ? nonfinite : scaled[i];
  }
}

/// out[i] = float32 bits of words[i] at top bin tops[i] divided by 2^shift where the result is
/// normal (the correctly rounded conversion, then the exponent moved); slow[i] = 1 elsewhere.
[[gnu::always_inline]] inline void convert_f32_body(float* out, std::uint8_t* slow, const std::int64_t* words,
                                                    const std::uint8_t* tops, std::uint64_t n, int shift) noexcept {
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::int64_t s = words[i];
    const std::uint32_t top = tops[i];
    const std::uint32_t r = std::bit_cast<std::uint32_t>(static_cast<float>(s));
    const std::int32_t e = static_cast<std::int32_t>(12 * top) - 1104 - shift;
    const std::int32_t biased = static_cast<std::int32_t>((r >> 23) & 0xFF) + e;
    // >= 2: normal before the conversion rounded too (a result just below 2^-126 rounds as a subnormal).
    const bool fast = top != reproducible_nonfinite_bin && (s == 0 || (biased >= 2 && biased <= 254));
    out[i] = std::bit_cast<float>(s == 0 ? 0u : r + static_cast<std::uint32_t>(e) * (1u << 23));
    slow[i] = fast ? 0 : 1;
  }
}

/// The first passes of a block deposit (accumulate_f32_body, accumulate_packed_f32_body),
/// n <= reproducible_block: new_top[i] = max(tops[i], the bin of b[i]) (bins from the exponent
/// field, subnormals through their fraction's exponent; zero in bin 0, inf/NaN in the
/// non-finite bin), and scaled[i] = trunc(b[i] * 2^(1104 - 12 * new_top[i])), the scale's
/// exponent clamped to a normal double's (0 for non-finite values, masked before any
/// floating-point step). Branch-free loops, so that each vectorises. `Empty`: tops[] is not read
/// (every stored top counts as 0, an empty element).
template <bool Empty = false>
[[gnu::always_inline]] inline void deposit_tops_and_scaled_f32(const std::uint8_t* tops, const float* b,
                                                               std::uint64_t n, std::uint32_t* new_top,
                                                               std::int64_t* scaled) noexcept {
  alignas(64) std::uint32_t fraction_exponent[reproducible_block];
  for (std::uint64_t i = 0; i < n; ++i)
    fraction_exponent[i] = std::bit_cast<std::uint32_t>(static_cast<float>(
                               static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(b[i]) & 0x7FFFFF))) >>
                           23;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(b[i]), e = (bits >> 23) & 0xFF, fe = fraction_exponent[i];
    const std::uint32_t position = e != 0 ? e + 953 : fe + 804;  // both loads unconditional: the loop vectorises
    std::uint32_t bin = (position * 43691u) >> 19;
    bin = e == 255 ? reproducible_nonfinite_bin : bin;
    bin = (bits << 1) == 0 ? 0 : bin;
    new_top[i] = Empty ? bin : std::max(static_cast<std::uint32_t>(tops[i]), bin);
  }
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t top = new_top[i];
    const std::uint32_t keep = 0u - static_cast<std::uint32_t>(top != reproducible_nonfinite_bin);
    const std::int32_t field = std::clamp(2127 - 12 * static_cast<std::int32_t>(top), 1, 2046);
    const double x = static_cast<double>(std::bit_cast<float>(std::bit_cast<std::uint32_t>(b[i]) & keep));
    scaled[i] = static_cast<std::int64_t>(x * std::bit_cast<double>(static_cast<std::uint64_t>(field) << 52));
  }
}

/// One float32 contribution b[i] deposited into a binned accumulator element (K = 3; local top
/// tops[i], limbs limbs[3i..3i+2]), bit for bit primitive::accumulate, n <= reproducible_block,
/// where the element's top stays or the element is empty (top 0: its limbs are 0, so no shift
/// is needed). The bin comes as in fold_tops_f32_body; the digits are those of
/// trunc(|x| / 2^unit), computed like add_words_f32_body's word (exact, < 2^36 as the value's
/// bin is at most the top). Elements whose top rises from a non-zero bin or becomes the
/// non-finite bin are left alone with slow[i] = 1 (the caller runs the element function);
/// their values are masked to zero before any floating-point step when non-finite.
[[gnu::always_inline]] inline void accumulate_f32_body(std::uint8_t* tops, std::int64_t* limbs, std::uint8_t* slow,
                                                       const float* b, std::uint64_t n) noexcept {
  alignas(64) std::uint32_t new_top[reproducible_block];
  alignas(64) std::int64_t scaled[reproducible_block];
  deposit_tops_and_scaled_f32(tops, b, n, new_top, scaled);
  alignas(64) std::int64_t digit[3][reproducible_block];
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t old = tops[i], top = new_top[i];
    const bool fast = (top == old || old == 0) && top != reproducible_nonfinite_bin;
    const std::int64_t s = fast ? scaled[i] : 0;                       // slow elements: all digits 0
    const std::int64_t m = s < 0 ? -s : s, negative = s < 0 ? -1 : 0;  // (x ^ -1) - -1 == -x
    digit[0][i] = ((m >> 24) ^ negative) - negative;
    digit[1][i] = (((m >> 12) & 0xFFF) ^ negative) - negative;
    digit[2][i] = ((m & 0xFFF) ^ negative) - negative;
    tops[i] = static_cast<std::uint8_t>(fast ? top : old);
    slow[i] = fast ? 0 : 1;
  }
  for (std::uint64_t i = 0; i < n; ++i) {
    limbs[3 * i] += digit[0][i];
    limbs[3 * i + 1] += digit[1][i];
    limbs[3 * i + 2] += digit[2][i];
  }
}

/// The word scale 2^-unit (a double) of top bin `bin` for float32 values, as add_words_f32_body.
[[gnu::always_inline]] inline double word_scale_f32(std::uint32_t bin) noexcept {
  const std::int32_t field = std::clamp(2127 - 12 * static_cast<std::int32_t>(bin), 1, 2046);
  return std::bit_cast<double>(static_cast<std::uint64_t>(field) << 52);
}

/// True when float32 value x lies within finite top bin `top` (its bin is at most top; zeros
/// always): exactly when |x| * 2^(1104 - 12 top) < 2^36, as bin `top` ends at 2^36 units of
/// the word at `top`. The scale is word_scale_f32's (clamped for bins below 7, where no
/// non-zero float32 lies within, and the product still reaches 2^36).
[[gnu::always_inline]] inline bool within_top_f32(float x, std::uint32_t top) noexcept {
  return std::fabs(static_cast<double>(x) * word_scale_f32(top)) < 0x1p36 && top != reproducible_nonfinite_bin;
}

/// The common case of a packed deposit, n <= reproducible_block: elements whose value lies
/// within their stored finite top bin (within_top_f32) keep their top, so their word is
/// trunc(b[i] * 2^(1104 - 12 tops[i])) and its digits add to packed[i], with no bin computed
/// (bit for bit deposit_packed_f32). The others get nothing and outside[i] = 1 (their value
/// is not used in any integer conversion). Returns the number of elements outside.
[[gnu::always_inline]] inline std::uint64_t deposit_within_tops_f32(const std::uint8_t* tops, std::int64_t* packed,
                                                                    std::uint8_t* outside, const float* b,
                                                                    std::uint64_t n) noexcept {
  std::uint64_t count = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t top = tops[i];
    const double x = static_cast<double>(b[i]) * word_scale_f32(top);
    const bool in = std::fabs(x) < 0x1p36 && top != reproducible_nonfinite_bin;  // false for NaN
    const std::int64_t s = static_cast<std::int64_t>(in ? x : 0.0);
    const std::int64_t m = s < 0 ? -s : s, negative = s < 0 ? -1 : 0;  // (x ^ -1) - -1 == -x
    const std::int64_t fields = ((m >> 24) << 42) | (((m >> 12) & 0xFFF) << 21) | (m & 0xFFF);
    packed[i] += (fields ^ negative) - negative;
    outside[i] = in ? 0 : 1;
    count += in ? 0u : 1u;
  }
  return count;
}

/// accumulate_f32_body for packed elements (local top tops[i], packed limbs packed[i]), bit for
/// bit accumulate_packed, n <= reproducible_block: the digits go into their fields of one int64
/// (pack_limbs), and a rising top moves the packed limbs down in the same loop (one bin up: the
/// word without its low field, shifted by 21 bits; two: the top field alone; more: nothing
/// kept). Left alone with slow[i] = 1 (the caller runs the element function): elements whose
/// top becomes the non-finite bin, and, when `flushed` is true (flushed limbs exist, and they
/// would have to move too), elements whose top rises from a non-zero bin. `Empty`: tops[] and
/// packed[] are written, not read (every element counts as empty: top 0, packed limbs 0).
template <bool Empty = false>
[[gnu::always_inline]] inline void deposit_packed_f32(std::uint8_t* tops, std::int64_t* packed, std::uint8_t* slow,
                                                      const float* b, std::uint64_t n, bool flushed) noexcept {
  alignas(64) std::uint32_t new_top[reproducible_block];
  alignas(64) std::int64_t scaled[reproducible_block];
  deposit_tops_and_scaled_f32<Empty>(tops, b, n, new_top, scaled);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t old = Empty ? 0u : tops[i], top = new_top[i], rise = top - old;
    const bool fast = (rise == 0 || old == 0 || !flushed) && top != reproducible_nonfinite_bin;
    const std::int64_t s = fast ? scaled[i] : 0;                       // slow elements: all digits 0
    const std::int64_t m = s < 0 ? -s : s, negative = s < 0 ? -1 : 0;  // (x ^ -1) - -1 == -x
    const std::int64_t fields = ((m >> 24) << 42) | (((m >> 12) & 0xFFF) << 21) | (m & 0xFFF);
    const std::int64_t p = Empty ? 0 : packed[i];
    const std::int64_t low = static_cast<std::int64_t>(static_cast<std::uint64_t>(p) << 43) >> 43,
                       rest = (p - low) >> 21;
    const std::int64_t middle = static_cast<std::int64_t>(static_cast<std::uint64_t>(rest) << 43) >> 43;
    const std::int64_t moved = rise == 0 ? p : rise == 1 ? rest : rise == 2 ? (rest - middle) >> 21 : 0;
    packed[i] = (fast ? moved : p) + ((fields ^ negative) - negative);
    tops[i] = static_cast<std::uint8_t>(fast ? top : old);
    slow[i] = fast ? 0 : 1;
  }
}

/// deposit_packed_f32 for the m elements of a block flagged in outside[0 .. n) (each 0 or 1):
/// they are gathered into contiguous arrays, deposited there and scattered back, so that a
/// block with few elements outside their tops pays for those alone. Afterwards outside[i] is
/// deposit_packed_f32's slow flag for each gathered element (others keep 0).
[[gnu::always_inline]] inline void deposit_gathered_packed_f32(std::uint8_t* tops, std::int64_t* packed,
                                                               std::uint8_t* outside, const float* b, std::uint64_t n,
                                                               bool flushed) noexcept {
  alignas(64) std::uint16_t index[reproducible_block];
  std::uint64_t m = 0;
  std::uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {  // flags 8 at a time: most groups hold none
    std::uint64_t flags = 0;
    std::memcpy(&flags, outside + i, 8);
    while (flags != 0) {
      index[m++] = static_cast<std::uint16_t>(i + static_cast<std::uint64_t>(std::countr_zero(flags)) / 8);
      flags &= flags - 1;  // each flag is one bit, the lowest of its byte
    }
  }
  for (; i < n; ++i)
    if (outside[i] != 0) index[m++] = static_cast<std::uint16_t>(i);
  alignas(64) float value[reproducible_block];
  alignas(64) std::uint8_t top[reproducible_block];
  alignas(64) std::int64_t word[reproducible_block];
  alignas(64) std::uint8_t rare[reproducible_block];
  for (std::uint64_t k = 0; k < m; ++k) {
    value[k] = b[index[k]];
    top[k] = tops[index[k]];
    word[k] = packed[index[k]];
  }
  deposit_packed_f32(top, word, rare, value, m, flushed);
  for (std::uint64_t k = 0; k < m; ++k) {
    tops[index[k]] = top[k];
    packed[index[k]] = word[k];
    outside[index[k]] = rare[k];
  }
}

/// deposit_packed_f32 (same contract, bit for bit), taking deposit_within_tops_f32 first and
/// deposit_gathered_packed_f32 for the elements outside their tops. Blocks where two of three
/// sampled values lie outside (as in an empty accumulator), and every block when `within` is
/// false, go through deposit_packed_f32 at once. `empty`: the block holds no contribution yet;
/// tops[] and packed[] are overwritten, never read (deposit_packed_f32<true>).
[[gnu::always_inline]] inline void accumulate_packed_f32_body(std::uint8_t* tops, std::int64_t* packed,
                                                              std::uint8_t* slow, const float* b, std::uint64_t n,
                                                              bool flushed, bool within, bool empty) noexcept {
  if (n == 0) return;
  if (!empty && within &&
      !within_top_f32(b[0], tops[0]) + !within_top_f32(b[n / 2], tops[n / 2]) + !within_top_f32(b[n - 1], tops[n - 1]) <
          2) {
    if (deposit_within_tops_f32(tops, packed, slow, b, n) != 0)
      deposit_gathered_packed_f32(tops, packed, slow, b, n, flushed);
    return;
  }
  std::memset(slow, 1, n);
  // Always from a masked copy (the mask keeps every value here): with one input pointer GCC 12
  // vectorises every loop of deposit_packed_f32; a plain copy loop measured 1.5-2x slower.
  alignas(64) float rest[reproducible_block];
  for (std::uint64_t i = 0; i < n; ++i)
    rest[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(b[i]) & (0u - static_cast<std::uint32_t>(slow[i])));
  if (empty)
    deposit_packed_f32<true>(tops, packed, slow, rest, n, flushed);
  else
    deposit_packed_f32(tops, packed, slow, rest, n, flushed);
}

/// words[i] += the word of accumulator element i (local top local[i], limbs limbs[3i..]) at
/// global top bin tops[i] >= local[i] (K = 3), bit for bit primitive::add_limb_words.
[[gnu::always_inline]] inline void add_limb_words3_body(std::int64_t* words, const std::uint8_t* local,
                                                        const std::int64_t* limbs, const std::uint8_t* tops,
                                                        std::uint64_t n) noexcept {
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t top = tops[i], mine = local[i], d = top - mine;
    const std::int64_t l0 = limbs[3 * i], l1 = limbs[3 * i + 1], l2 = limbs[3 * i + 2];
    const std::int64_t finite = d == 0   ? l0 * (std::int64_t{1} << 24) + l1 * (std::int64_t{1} << 12) + l2
                                : d == 1 ? l0 * (std::int64_t{1} << 12) + l1
                                : d == 2 ? l0
                                         : 0;
    const std::int64_t nonfinite = mine == reproducible_nonfinite_bin ? l0 : 0;
    words[i] += top == reproducible_nonfinite_bin ? nonfinite : finite;
  }
}

/// Elements per block of reproducible_sum_f32 (its inputs, bins, words and result stay in L1).
inline constexpr std::uint64_t reproducible_fused_block = 512;

/// result[i] = float32 bits of word `w` at top bin `bin` divided by 2^shift (convert_f32_body's
/// fast form); returns 1 where that form does not apply (the result is not normal).
[[gnu::always_inline]] inline std::uint32_t convert_word_f32(float& result, std::int64_t w, std::uint32_t bin,
                                                             int shift) noexcept {
  const std::uint32_t r = std::bit_cast<std::uint32_t>(static_cast<float>(w));
  const std::int32_t e = static_cast<std::int32_t>(12 * bin) - 1104 - shift;
  const std::int32_t biased = static_cast<std::int32_t>((r >> 23) & 0xFF) + e;
  result = std::bit_cast<float>(w == 0 ? 0u : r + static_cast<std::uint32_t>(e) * (1u << 23));
  return static_cast<std::uint32_t>((w != 0) & ((biased < 2) | (biased > 254)));
}

/// The fused float32 sum of one block (n <= reproducible_fused_block) of N inputs in one loop:
/// the global top bin of element i is the bin of max_q |ins[q][i]| (bins grow with magnitude,
/// so it is the max of the inputs' bins; for normal values and zeros it comes from the exponent
/// field), the words are add_words_f32_body's, the result convert_word_f32's. Returns non-zero
/// when the block holds a subnormal or non-finite value or a result that is not normal: the
/// caller then redoes the block (`result` is partly written). Values of such elements are
/// masked to zero before any floating-point step.
template <int N>
[[gnu::always_inline]] inline std::uint32_t sum_f32_fused(float* result, const float* const* ins, std::uint64_t first,
                                                          std::uint64_t n, int shift) noexcept {
  const float* x[N];
  for (int q = 0; q < N; ++q) x[q] = ins[q] + first;
  std::uint32_t rare = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint32_t m = 0;
    for (int q = 0; q < N; ++q) m = std::max(m, std::bit_cast<std::uint32_t>(x[q][i]) & 0x7FFFFFFF);
    const std::uint32_t e = m >> 23;
    const std::uint32_t odd = static_cast<std::uint32_t>((e == 255) | ((e == 0) & (m != 0)));
    const std::uint32_t keep = odd - 1u;  // all ones for ordinary elements
    const std::uint32_t bin = m == 0 ? 0u : ((e + 953) * 43691u) >> 19;
    const double s = word_scale_f32(bin);
    std::int64_t w = 0;
    for (int q = 0; q < N; ++q)
      w += static_cast<std::int64_t>(
          static_cast<double>(std::bit_cast<float>(std::bit_cast<std::uint32_t>(x[q][i]) & keep)) * s);
    rare |= odd | convert_word_f32(result[i], w, bin, shift);
  }
  return rare;
}

/// magnitude[i] = max(magnitude[i], |bits of ins[q][first + i]|) for the N inputs, i < n (one
/// loop over i with the inputs unrolled, so that it vectorises).
template <int N>
[[gnu::always_inline]] inline void fold_magnitudes_f32(std::uint32_t* magnitude, const float* const* ins,
                                                       std::uint64_t first, std::uint64_t n) noexcept {
  const float* x[N];
  for (int q = 0; q < N; ++q) x[q] = ins[q] + first;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint32_t m = magnitude[i];
    for (int q = 0; q < N; ++q) m = std::max(m, std::bit_cast<std::uint32_t>(x[q][i]) & 0x7FFFFFFF);
    magnitude[i] = m;
  }
}

/// words[i] += trunc(ins[q][first + i] * scale[i]) for the N inputs, i < n (as fold_magnitudes_f32).
template <int N>
[[gnu::always_inline]] inline void add_scaled_words_f32(std::int64_t* words, const double* scale,
                                                        const float* const* ins, std::uint64_t first,
                                                        std::uint64_t n) noexcept {
  const float* x[N];
  for (int q = 0; q < N; ++q) x[q] = ins[q] + first;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::int64_t w = words[i];
    for (int q = 0; q < N; ++q) w += static_cast<std::int64_t>(static_cast<double>(x[q][i]) * scale[i]);
    words[i] = w;
  }
}

/// sum_f32_fused for any number of inputs, in passes over the block (magnitudes, then words),
/// each pass taking the inputs four at a time.
[[gnu::always_inline]] inline std::uint32_t sum_f32_staged(float* result, const float* const* ins, int n_in,
                                                           std::uint64_t first, std::uint64_t n, int shift) noexcept {
  alignas(64) std::uint32_t magnitude[reproducible_fused_block];
  alignas(64) std::int64_t words[reproducible_fused_block];
  alignas(64) double scale[reproducible_fused_block];
  for (std::uint64_t i = 0; i < n; ++i) magnitude[i] = 0;
  int q = 0;
  for (; q + 4 <= n_in; q += 4) fold_magnitudes_f32<4>(magnitude, ins + q, first, n);
  switch (n_in - q) {
    case 3: fold_magnitudes_f32<3>(magnitude, ins + q, first, n); break;
    case 2: fold_magnitudes_f32<2>(magnitude, ins + q, first, n); break;
    case 1: fold_magnitudes_f32<1>(magnitude, ins + q, first, n); break;
    default: break;  // 0: none left
  }
  std::uint32_t rare = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t m = magnitude[i], e = m >> 23;
    rare |= static_cast<std::uint32_t>((e == 255) | ((e == 0) & (m != 0)));
    magnitude[i] = m == 0 ? 0u : ((e + 953) * 43691u) >> 19;  // now the bin
    scale[i] = word_scale_f32(magnitude[i]);
    words[i] = 0;
  }
  if (rare != 0) return rare;
  for (q = 0; q + 4 <= n_in; q += 4) add_scaled_words_f32<4>(words, scale, ins + q, first, n);
  switch (n_in - q) {
    case 3: add_scaled_words_f32<3>(words, scale, ins + q, first, n); break;
    case 2: add_scaled_words_f32<2>(words, scale, ins + q, first, n); break;
    case 1: add_scaled_words_f32<1>(words, scale, ins + q, first, n); break;
    default: break;  // 0: none left
  }
  for (std::uint64_t i = 0; i < n; ++i) rare |= convert_word_f32(result[i], words[i], magnitude[i], shift);
  return rare;
}

/// sum_f32_fused for 2, 3 or 4 inputs, else sum_f32_staged.
[[gnu::always_inline]] inline std::uint32_t sum_f32_body(float* result, const float* const* ins, int n_in,
                                                         std::uint64_t first, std::uint64_t n, int shift) noexcept {
  switch (n_in) {
    case 2: return sum_f32_fused<2>(result, ins, first, n, shift);
    case 3: return sum_f32_fused<3>(result, ins, first, n, shift);
    case 4: return sum_f32_fused<4>(result, ins, first, n, shift);
    default: return sum_f32_staged(result, ins, n_in, first, n, shift);  // any other count
  }
}

/// add_limb_words3_body for packed elements (local top local[i], packed limbs packed[i]; a
/// non-finite element's word is packed[i] itself), bit for bit.
[[gnu::always_inline]] inline void add_packed_words3_body(std::int64_t* words, const std::uint8_t* local,
                                                          const std::int64_t* packed, const std::uint8_t* tops,
                                                          std::uint64_t n) noexcept {
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t top = tops[i], mine = local[i], d = top - mine;
    const std::int64_t p = packed[i];
    const std::int64_t l2 = static_cast<std::int64_t>(static_cast<std::uint64_t>(p) << 43) >> 43, rest = (p - l2) >> 21;
    const std::int64_t l1 = static_cast<std::int64_t>(static_cast<std::uint64_t>(rest) << 43) >> 43,
                       l0 = (rest - l1) >> 21;
    const std::int64_t finite = d == 0   ? l0 * (std::int64_t{1} << 24) + l1 * (std::int64_t{1} << 12) + l2
                                : d == 1 ? l0 * (std::int64_t{1} << 12) + l1
                                : d == 2 ? l0
                                         : 0;
    const std::int64_t nonfinite = mine == reproducible_nonfinite_bin ? p : 0;
    words[i] += top == reproducible_nonfinite_bin ? nonfinite : finite;
  }
}

// ---- float64 ---------------------------------------------------------------------------------

/// tops[i] = max(tops[i], top bin of float64 bits b[i]) (x / 12 as for float32, x < 2^17);
/// slow[i] = 1 for subnormals (their
/// leading bit is not in the exponent field), which the caller redoes.
[[gnu::always_inline]] inline void fold_tops_f64_body(std::uint8_t* tops, std::uint8_t* slow, const std::uint64_t* b,
                                                      std::uint64_t n) noexcept {
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t bits = b[i];
    const std::uint32_t e = static_cast<std::uint32_t>(bits >> 52) & 0x7FF;
    std::uint32_t bin = (e + (reproducible_bin_offset - 1023)) * 43691u >> 19;
    bin = e == 0x7FF ? reproducible_nonfinite_bin : bin;
    bin = e == 0 ? 0 : bin;
    tops[i] = std::max(tops[i], static_cast<std::uint8_t>(bin));
    slow[i] = e == 0 && (bits << 1) != 0 ? 1 : 0;
  }
}

/// words[2i..2i+1] += the words of float64 bits b[i] at top bin tops[i] (K = 6: unit
/// u = 2^(12 T - 1140), hi = trunc(x / 2^(u+36)), lo = trunc(rest / 2^u), all exact) for top
/// bins 10..175 and zeros; slow[i] = 1 for the others (tiny bins, non-finite), which the caller
/// adds. n <= reproducible_block.
[[gnu::always_inline]] inline void add_words_f64_body(std::int64_t* words, std::uint8_t* slow, const std::uint64_t* b,
                                                      const std::uint8_t* tops, std::uint64_t n) noexcept {
  alignas(64) std::int64_t hi_word[reproducible_block];
  alignas(64) std::int64_t lo_word[reproducible_block];
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t top = tops[i];
    const std::uint64_t keep = 0u - static_cast<std::uint64_t>(top - 10u < 166u);
    const double x = std::bit_cast<double>(b[i] & keep);    // zero outside bins 10..175
    const std::uint64_t t = (top & keep) | (100u & ~keep);  // any in-range bin for the unused scales
    const double hi = std::trunc(x * std::bit_cast<double>((2127u - 12u * t) << 52));
    const double rest = x - hi * std::bit_cast<double>((12u * t - 81u) << 52);  // exact: x's bits below 2^(u+36)
    hi_word[i] = static_cast<std::int64_t>(hi);
    lo_word[i] = static_cast<std::int64_t>(rest * std::bit_cast<double>((2163u - 12u * t) << 52));
  }
  for (std::uint64_t i = 0; i < n; ++i) {
    words[2 * i] += hi_word[i];
    words[2 * i + 1] += lo_word[i];
    slow[i] = tops[i] - 10u < 166u || tops[i] == 0 ? 0 : 1;
  }
}

}  // namespace ringzero::primitive::detail
