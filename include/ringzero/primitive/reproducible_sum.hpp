#pragma once
/// @file
/// The number format of reproducible sums (docs/numerics.md): fixed exponent bins of W = 12 bits
/// on absolute bit positions; each contribution is truncated toward zero below the K bins that
/// end at the global top bin T, summed exactly as int64 words, and converted once, correctly
/// rounded (to nearest, ties to even), to the output dtype. float16/bfloat16/float32 keep K = 3
/// bins (one word per element), float64 K = 6 (two words). A reserved top bin marks elements
/// with a non-finite contribution; their word counts +inf and -inf contributions.
/// Element functions here; whole arrays in primitive/reproducible_arrays.hpp. Host functions,
/// pure and thread-safe. Follows Demmel & Nguyen, "Parallel Reproducible
/// Summation" (IEEE TC 2015) and ReproBLAS's binned (pre-rounded) summation.

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "ringzero/core/dtype.hpp"

namespace ringzero::primitive {

/// 128-bit integers (GCC/Clang extension) for exact sums and quotients.
__extension__ typedef unsigned __int128 uint128;
__extension__ typedef __int128 int128;

/// Bits per exponent bin (W).
inline constexpr int reproducible_bin_width = 12;
/// Bin b holds the bit positions [W*b - reproducible_bin_offset, W*(b+1) - reproducible_bin_offset):
/// bin 0 starts below float64's smallest subnormal (2^-1074); finite values use bins 0..175.
inline constexpr int reproducible_bin_offset = 1080;
/// The top bin that marks a non-finite contribution (above every finite bin).
inline constexpr std::uint8_t reproducible_nonfinite_bin = 255;
/// The most contributions one sum may combine (int64 headroom: 2^26 * 2^36 < 2^63).
inline constexpr std::uint64_t reproducible_max_contributions = std::uint64_t{1} << 26;
/// Non-finite word: +inf contributions count in the low 27 bits, -inf in the next 27; NaN adds both.
inline constexpr int reproducible_negative_inf_shift = 27;

/// Kept bins K of `t`: 6 for float64, 3 for the other floating types.
constexpr int reproducible_kept_bins(dtype t) noexcept { return t == dtype::float64 ? 6 : 3; }
/// int64 words per element on the wire: 2 for float64, 1 otherwise.
constexpr int reproducible_words(dtype t) noexcept { return t == dtype::float64 ? 2 : 1; }
/// True for the dtypes the reproducible sum handles (float16, bfloat16, float32, float64).
constexpr bool reproducible_supports(dtype t) noexcept { return is_floating_point(t); }

/// The binary layout of an IEEE-754 style format: precision p (with the hidden bit), bias,
/// exponent bits.
struct float_format {
  int precision = 24;
  int bias = 127;
  int exponent_bits = 8;
};

/// The layout of floating dtype `t` (float32's for any other value).
constexpr float_format format_of(dtype t) noexcept {
  switch (t) {
    case dtype::float64: return {53, 1023, 11};
    case dtype::float16: return {11, 15, 5};
    case dtype::bfloat16: return {8, 127, 8};
    case dtype::float32: return {24, 127, 8};
    case dtype::int8:
    case dtype::uint8:
    case dtype::int32:
    case dtype::uint32:
    case dtype::int64:
    case dtype::uint64: break;
  }
  return {24, 127, 8};
}

/// A floating value as |x| = significand * 2^exponent with its sign, or a non-finite marker.
struct decoded_value {
  bool negative = false;
  bool finite = true;
  bool nan = false;
  std::uint64_t significand = 0;
  int exponent = 0;
};

/// Element i of `values` (of floating dtype `t`) as raw bits.
inline std::uint64_t load_bits(const void* values, std::uint64_t i, dtype t) noexcept {
  const auto* p = static_cast<const unsigned char*>(values);
  switch (dtype_size(t)) {
    case 2: {
      std::uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      return b;
    }
    case 4: {
      std::uint32_t b;
      std::memcpy(&b, p + 4 * i, 4);
      return b;
    }
    default: {
      std::uint64_t b;
      std::memcpy(&b, p + 8 * i, 8);
      return b;
    }
  }
}

/// Stores raw `bits` as element i of `out` (of floating dtype `t`).
inline void store_bits(void* out, std::uint64_t i, dtype t, std::uint64_t bits) noexcept {
  auto* p = static_cast<unsigned char*>(out);
  switch (dtype_size(t)) {
    case 2: {
      const auto b = static_cast<std::uint16_t>(bits);
      std::memcpy(p + 2 * i, &b, 2);
      return;
    }
    case 4: {
      const auto b = static_cast<std::uint32_t>(bits);
      std::memcpy(p + 4 * i, &b, 4);
      return;
    }
    default: std::memcpy(p + 8 * i, &bits, 8); return;
  }
}

/// Decodes the bits of one value of format `f`.
constexpr decoded_value decode_bits(std::uint64_t bits, const float_format& f) noexcept {
  decoded_value v;
  const int mant_bits = f.precision - 1;
  const std::uint64_t all_ones = (std::uint64_t{1} << f.exponent_bits) - 1;
  v.negative = ((bits >> (f.exponent_bits + mant_bits)) & 1) != 0;
  const std::uint64_t biased = (bits >> mant_bits) & all_ones;
  const std::uint64_t frac = bits & ((std::uint64_t{1} << mant_bits) - 1);
  if (biased == all_ones) {
    v.finite = false;
    v.nan = frac != 0;
    return v;
  }
  v.significand = biased == 0 ? frac : frac | (std::uint64_t{1} << mant_bits);
  v.exponent = (biased == 0 ? 1 : static_cast<int>(biased)) - f.bias - mant_bits;
  return v;
}

/// The top bin of a decoded value: the bin of its leading bit; 0 for zero; the non-finite bin
/// for inf and NaN.
constexpr std::uint8_t top_bin(const decoded_value& v) noexcept {
  if (!v.finite) return reproducible_nonfinite_bin;
  if (v.significand == 0) return 0;
  const int lead = v.exponent + static_cast<int>(std::bit_width(v.significand)) - 1;
  return static_cast<std::uint8_t>((lead + reproducible_bin_offset) / reproducible_bin_width);
}

/// The exponent of the lowest kept bit: 2^(W*(top-K+1) - offset) for global top bin `top`.
constexpr int reproducible_unit_exponent(std::uint8_t top, int kept_bins) noexcept {
  return reproducible_bin_width * (static_cast<int>(top) - kept_bins + 1) - reproducible_bin_offset;
}

/// |v| truncated toward zero to a multiple of 2^unit_exponent, in units of it. Precondition: the
/// value's top bin is at most the top the unit was computed for (the result is < 2^(W*K)).
constexpr uint128 truncated_magnitude(const decoded_value& v, int unit_exponent) noexcept {
  if (v.significand == 0) return 0;  // zeros sit in bin 0, far below any unit: no shift
  const int shift = v.exponent - unit_exponent;
  const uint128 m = v.significand;
  if (shift >= 0) return m << shift;  // < 2^(W*K) by the precondition: shift < 128
  if (shift <= -64) return 0;
  return m >> (-shift);
}

/// The non-finite word of one contribution: +inf 1, -inf 2^27, NaN both; 0 for finite values.
constexpr std::int64_t nonfinite_word(const decoded_value& v) noexcept {
  if (v.finite) return 0;
  const std::int64_t pos = 1, neg = std::int64_t{1} << reproducible_negative_inf_shift;
  if (v.nan) return pos + neg;
  return v.negative ? neg : pos;
}

/// Adds contribution `v`'s words at global top bin `top` (of a dtype with `kept_bins` bins) to
/// `words` (reproducible_words of them: the word of bins top..top-2, then of top-3..top-5).
constexpr void add_words(std::int64_t* words, const decoded_value& v, std::uint8_t top, int kept_bins) noexcept {
  if (top == reproducible_nonfinite_bin) {
    words[0] += nonfinite_word(v);
    return;
  }
  const uint128 t = truncated_magnitude(v, reproducible_unit_exponent(top, kept_bins));
  constexpr int word_bits = 3 * reproducible_bin_width;
  if (kept_bins == 3) {
    const auto w = static_cast<std::int64_t>(t);
    words[0] += v.negative ? -w : w;
    return;
  }
  const auto hi = static_cast<std::int64_t>(t >> word_bits);
  const auto lo = static_cast<std::int64_t>(t & ((uint128{1} << word_bits) - 1));
  words[0] += v.negative ? -hi : hi;
  words[1] += v.negative ? -lo : lo;
}

/// Number of significant bits of `x` (0 for 0).
constexpr int bit_width(uint128 x) noexcept {
  const auto hi = static_cast<std::uint64_t>(x >> 64);
  return hi != 0 ? 64 + static_cast<int>(std::bit_width(hi))
                 : static_cast<int>(std::bit_width(static_cast<std::uint64_t>(x)));
}

/// Rounds (-1)^negative * magnitude * 2^exponent / divisor once to format `f` (to nearest, ties
/// to even; subnormal results rounded at their own precision; overflow to infinity; a zero sum
/// is +0). Integer arithmetic only: the quotient's low bits and the remainder form the round
/// and sticky bits. Preconditions: magnitude < 2^127, 1 <= divisor <= 2^32. Returns the bits.
constexpr std::uint64_t round_to_format(bool negative, uint128 magnitude, int exponent, std::uint64_t divisor,
                                        const float_format& f) noexcept {
  const int p = f.precision, mant_bits = p - 1;
  const std::uint64_t sign = negative ? std::uint64_t{1} << (f.exponent_bits + mant_bits) : 0;
  if (magnitude == 0) return 0;
  uint128 q = magnitude;
  bool inexact = false;
  if (std::has_single_bit(divisor)) {
    exponent -= std::countr_zero(divisor);
  } else if (p <= 29 && magnitude >> 64 == 0) {
    // Leading bit to bit 63: the quotient keeps >= 31 bits, more than p + 2.
    const auto m = static_cast<std::uint64_t>(magnitude);
    const int shift = std::countl_zero(m);
    const std::uint64_t n = m << shift;
    exponent -= shift;
    q = n / divisor;
    inexact = n % divisor != 0;
  } else {
    const int shift = 127 - bit_width(magnitude);  // leading bit to bit 126: >= 94 quotient bits
    const uint128 n = magnitude << shift;
    exponent -= shift;
    q = n / divisor;
    inexact = n % divisor != 0;
  }
  const int lead = bit_width(q) - 1 + exponent;  // position of the value's leading bit
  const int emin = 1 - f.bias;
  int ulp = std::max(lead, emin) - mant_bits;  // exponent of the result's last place
  const int drop = ulp - exponent;             // quotient bits below the last place
  uint128 kept = 0;
  if (drop <= 0) {
    kept = q << (-drop);  // exact: a division that left a remainder always has drop > 0
  } else if (drop <= 127) {
    kept = q >> drop;
    const bool round = ((q >> (drop - 1)) & 1) != 0;
    const bool sticky = inexact || (q & ((uint128{1} << (drop - 1)) - 1)) != 0;
    if (round && (sticky || (kept & 1) != 0)) ++kept;
  }
  if (kept == 0) return sign;
  if (kept >> p != 0) {  // rounding carried into a new leading bit
    kept >>= 1;
    ++ulp;
  }
  const std::uint64_t hidden = std::uint64_t{1} << mant_bits;
  const auto k = static_cast<std::uint64_t>(kept);
  const std::uint64_t all_ones = (std::uint64_t{1} << f.exponent_bits) - 1;
  if (k < hidden) return sign | k;  // subnormal
  const std::int64_t biased = static_cast<std::int64_t>(ulp) + mant_bits + f.bias;
  if (biased >= static_cast<std::int64_t>(all_ones)) return sign | (all_ones << mant_bits);  // overflow: infinity
  return sign | (static_cast<std::uint64_t>(biased) << mant_bits) | (k - hidden);
}

/// The bits of the canonical quiet NaN of format `f`.
constexpr std::uint64_t quiet_nan_bits(const float_format& f) noexcept {
  const int mant_bits = f.precision - 1;
  const std::uint64_t all_ones = (std::uint64_t{1} << f.exponent_bits) - 1;
  return (all_ones << mant_bits) | (std::uint64_t{1} << (mant_bits - 1));
}

/// The bits of the value of one element: `words` (reproducible_words of them) summed over every
/// contribution at global top bin `top`, divided by `divisor` (1 for a sum; the number of
/// contributions for avg; 0 gives NaN), rounded once to format `f` with `kept_bins` bins.
constexpr std::uint64_t convert_words(const std::int64_t* words, std::uint8_t top, std::uint64_t divisor, int kept_bins,
                                      const float_format& f) noexcept {
  if (divisor == 0) return quiet_nan_bits(f);
  if (top == reproducible_nonfinite_bin) {
    const std::uint64_t w = static_cast<std::uint64_t>(words[0]);
    const std::uint64_t field = (std::uint64_t{1} << reproducible_negative_inf_shift) - 1;
    const bool pos = (w & field) != 0, neg = ((w >> reproducible_negative_inf_shift) & field) != 0;
    if (pos && neg) return quiet_nan_bits(f);
    const std::uint64_t inf = ((std::uint64_t{1} << f.exponent_bits) - 1) << (f.precision - 1);
    return neg ? inf | (std::uint64_t{1} << (f.exponent_bits + f.precision - 1)) : inf;
  }
  int128 total = words[0];
  if (kept_bins == 6) total = total * (int128{1} << (3 * reproducible_bin_width)) + words[1];
  const bool negative = total < 0;
  const auto magnitude = static_cast<uint128>(negative ? -total : total);
  return round_to_format(negative, magnitude, reproducible_unit_exponent(top, kept_bins), divisor, f);
}

// ---- the binned accumulator's element operations ---------------------------------------------

/// Raises an accumulator element's local top bin `top` to `b` when `b` is higher: its limbs move
/// down by the difference, and those that fall below the kept window are dropped (all of them
/// when `b` is the non-finite bin).
constexpr void raise_top(std::uint8_t& top, std::int64_t* limbs, int kept_bins, std::uint8_t b) noexcept {
  if (b <= top) return;
  const int shift = static_cast<int>(b) - static_cast<int>(top);
  if (b == reproducible_nonfinite_bin || shift >= kept_bins) {
    std::fill(limbs, limbs + kept_bins, std::int64_t{0});
  } else {
    for (int j = kept_bins - 1; j >= shift; --j) limbs[j] = limbs[j - shift];
    std::fill(limbs, limbs + shift, std::int64_t{0});
  }
  top = b;
}

/// Deposits contribution `v` into one element of a binned accumulator: `top` is the element's
/// local top bin, `limbs[j]` the sum of the contributions' signed 12-bit digits of bin top - j
/// (j < kept_bins; no carries between limbs). A higher top bin first drops the limbs that fall
/// below the kept window: exactly the parts that the final truncation drops.
constexpr void accumulate(std::uint8_t& top, std::int64_t* limbs, int kept_bins, const decoded_value& v) noexcept {
  raise_top(top, limbs, kept_bins, top_bin(v));
  if (top == reproducible_nonfinite_bin) {
    limbs[0] += nonfinite_word(v);
    return;
  }
  const uint128 t = truncated_magnitude(v, reproducible_unit_exponent(top, kept_bins));
  constexpr std::uint64_t digit_mask = (std::uint64_t{1} << reproducible_bin_width) - 1;
  for (int j = 0; j < kept_bins; ++j) {
    const auto digit = static_cast<std::int64_t>(
        static_cast<std::uint64_t>(t >> (reproducible_bin_width * (kept_bins - 1 - j))) & digit_mask);
    limbs[j] += v.negative ? -digit : digit;
  }
}

/// Adds one accumulator element's words at global top bin `top` (>= its local top `local`) to
/// `words`: each limb at its weight inside the kept window, limbs below the window dropped.
constexpr void add_limb_words(std::int64_t* words, std::uint8_t local, const std::int64_t* limbs, int kept_bins,
                              std::uint8_t top) noexcept {
  if (top == reproducible_nonfinite_bin) {
    if (local == reproducible_nonfinite_bin) words[0] += limbs[0];
    return;
  }
  const int low = static_cast<int>(top) - kept_bins + 1;  // lowest kept bin
  for (int j = 0; j < kept_bins; ++j) {
    const int bin = static_cast<int>(local) - j;
    if (bin < low) break;
    const int position = bin - low;  // 0 .. kept_bins-1
    const int word = kept_bins == 6 && position < 3 ? 1 : 0;
    words[word] += limbs[j] * (std::int64_t{1} << (reproducible_bin_width * (position % 3)));
  }
}

/// Bits per field of a packed K = 3 accumulator element: its three limbs in one int64.
inline constexpr int reproducible_packed_field_bits = 21;
/// Contributions a packed element holds exactly: each limb's magnitude stays below
/// 256 * (2^12 - 1) < 2^20, inside its signed 21-bit field.
inline constexpr std::uint64_t reproducible_packed_contributions = 256;

/// limbs[0] * 2^42 + limbs[1] * 2^21 + limbs[2]. Precondition: |limbs[j]| < 2^20.
constexpr std::int64_t pack_limbs(const std::int64_t* limbs) noexcept {
  return limbs[0] * (std::int64_t{1} << 42) + limbs[1] * (std::int64_t{1} << 21) + limbs[2];
}

/// The three limbs of a packed word (pack_limbs's inverse: each field sign-extended in turn).
constexpr void unpack_limbs(std::int64_t packed, std::int64_t* limbs) noexcept {
  const auto field = [](std::int64_t x) {
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(x) << 43) >> 43;
  };
  const std::int64_t low = field(packed), rest = (packed - low) >> 21, middle = field(rest);
  limbs[0] = (rest - middle) >> 21;
  limbs[1] = middle;
  limbs[2] = low;
}

/// The limbs of a packed element with local top `top`: unpacked, or for the non-finite bin the
/// word itself as limb 0 (its counts need more than 21 bits; the other limbs are 0 there).
constexpr void packed_element_limbs(std::uint8_t top, std::int64_t packed, std::int64_t* limbs) noexcept {
  if (top == reproducible_nonfinite_bin) {
    limbs[0] = packed;
    limbs[1] = limbs[2] = 0;
    return;
  }
  unpack_limbs(packed, limbs);
}

/// primitive::accumulate for a packed K = 3 element: local top `top`, the packed limbs of the
/// contributions since the last flush `packed`, and the flushed limbs `flushed` (3, or nullptr
/// when there are none), which move with a rising top as the packed ones do. Precondition:
/// fewer than reproducible_packed_contributions contributions in `packed`.
constexpr void accumulate_packed(std::uint8_t& top, std::int64_t& packed, std::int64_t* flushed,
                                 const decoded_value& v) noexcept {
  std::int64_t limbs[3] = {0, 0, 0};
  packed_element_limbs(top, packed, limbs);
  const std::uint8_t before = top;
  accumulate(top, limbs, 3, v);
  if (flushed != nullptr && top != before) {
    std::uint8_t moved = before;
    raise_top(moved, flushed, 3, top);
  }
  packed = top == reproducible_nonfinite_bin ? limbs[0] : pack_limbs(limbs);
}

/// A read-only view of a binned accumulator's storage (what reproducible_accumulator lends to
/// its collectives): per element a local top bin and reproducible_kept_bins(type) limbs. For
/// float64 `limbs` holds the 6 limbs of each element; for the K = 3 dtypes an element's limbs
/// are packed_element_limbs of `packed` (the contributions since the last flush) plus, where
/// `limbs` is not null, the 3 flushed limbs there. Besides, `staged_count` contributions may be
/// kept as copies, not deposited (`staged`: that many arrays of `count` elements of `type`, one
/// after another).
/// With no deposited contribution the binned storage is zero and never read (a cleared
/// accumulator leaves its memory as it was until the next deposit overwrites it). The methods
/// below read the binned storage only; primitive::fold_accumulator_tops and
/// add_accumulator_words (reproducible_arrays.hpp) add the staged copies.
struct binned_view {
  const std::uint8_t* tops = nullptr;
  const std::int64_t* limbs = nullptr;
  std::uint64_t count = 0;  ///< elements
  dtype type = dtype::float32;
  std::uint64_t contributions = 0;       ///< add() calls: deposited and staged
  const std::int64_t* packed = nullptr;  ///< K = 3 dtypes: one packed word per element
  const void* staged = nullptr;          ///< staged_count arrays of `count` elements, contiguous (not deposited)
  std::uint64_t staged_count = 0;        ///< contributions kept in `staged` (counted in `contributions` too)

  /// Contributions held in the binned storage (not staged).
  std::uint64_t deposited() const noexcept { return contributions - staged_count; }
  /// Staged contribution j (< staged_count): `count` elements of `type`.
  const void* staged_array(std::uint64_t j) const noexcept {
    return static_cast<const unsigned char*>(staged) + j * count * dtype_size(type);
  }

  /// out[0 .. K) = the limbs of element i (the binned storage's).
  void limbs_of(std::uint64_t i, std::int64_t* out) const noexcept {
    const int kept = reproducible_kept_bins(type);
    if (deposited() == 0) {
      std::fill(out, out + kept, std::int64_t{0});
      return;
    }
    if (kept != 3) {
      std::copy(limbs + i * 6, limbs + i * 6 + 6, out);
      return;
    }
    packed_element_limbs(tops[i], packed[i], out);
    if (limbs != nullptr)
      for (int j = 0; j < 3; ++j) out[j] += limbs[i * 3 + static_cast<std::uint64_t>(j)];
  }
  /// out[i] = max(out[i], top bin of element first + i in the binned storage), i < len.
  void fold_tops(std::uint8_t* out, std::uint64_t first, std::uint64_t len) const noexcept {
    if (deposited() == 0) return;
    for (std::uint64_t i = 0; i < len; ++i) out[i] = std::max(out[i], tops[first + i]);
  }
  /// words[i*w..] += element first + i's words (binned storage) at global top bin global_tops[i], i < len.
  void add_words(std::int64_t* words, const std::uint8_t* global_tops, std::uint64_t first,
                 std::uint64_t len) const noexcept {
    if (deposited() == 0) return;
    const int kept = reproducible_kept_bins(type), w = reproducible_words(type);
    std::int64_t element[6] = {0, 0, 0, 0, 0, 0};
    for (std::uint64_t i = 0; i < len; ++i) {
      limbs_of(first + i, element);
      add_limb_words(words + i * static_cast<std::uint64_t>(w), tops[first + i], element, kept, global_tops[i]);
    }
  }
};

}  // namespace ringzero::primitive
