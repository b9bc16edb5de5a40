#pragma once
/// @file
/// The reproducible sum's array operations (format: primitive/reproducible_sum.hpp): fold the
/// top bins of an array, add its truncated words, convert summed words to the output dtype,
/// the fused float32 sum of several inputs (reproducible_sum_f32), and the binned accumulator's
/// deposits (int64 limbs; packed limbs for the 16/32-bit dtypes) and words.
/// Bit for bit the element functions, computed with exact shortcuts where they apply:
/// float16/bfloat16/float32 values go through float32 (every such value is a float32), bins
/// come from exponent fields, truncation is a scaling by a power of two and a truncating
/// conversion (both exact where the scale stays normal), and float32 results with a
/// power-of-two divisor come from the hardware's correctly rounded int64 -> float32 conversion
/// when they are normal. Elements outside those cases take the element functions. The loops
/// are branch-free so that compilers vectorise them; on x86-64 with AVX-512 (checked at run
/// time) a copy compiled for it runs. Host functions, pure and thread-safe.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ringzero/core/half.hpp"
#include "ringzero/primitive/reproducible_loops.hpp"
#include "ringzero/primitive/reproducible_sum.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define RINGZERO_REPRODUCIBLE_AVX512 1
#else
#define RINGZERO_REPRODUCIBLE_AVX512 0
#endif

namespace ringzero::primitive {

namespace detail {

/// True when the CPU runs AVX-512 F/DQ/VL/BW (x86-64; false elsewhere). Read once.
inline bool reproducible_avx512() noexcept {
#if RINGZERO_REPRODUCIBLE_AVX512
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  return yes;
#else
  return false;
#endif
}

// ---- the same loops compiled for AVX-512 -----------------------------------------------------

#if RINGZERO_REPRODUCIBLE_AVX512
#define RINGZERO_AVX512_TARGET [[gnu::target("avx512f,avx512dq,avx512vl,avx512bw")]]
RINGZERO_AVX512_TARGET inline void fold_tops_f32_avx512(std::uint8_t* t, const float* b, std::uint64_t n) noexcept {
  fold_tops_f32_body(t, b, n);
}
RINGZERO_AVX512_TARGET inline void add_words_f32_avx512(std::int64_t* w, const float* b, const std::uint8_t* t,
                                                        std::uint64_t n) noexcept {
  add_words_f32_body(w, b, t, n);
}
RINGZERO_AVX512_TARGET inline void convert_f32_avx512(float* o, std::uint8_t* s, const std::int64_t* w,
                                                      const std::uint8_t* t, std::uint64_t n, int shift) noexcept {
  convert_f32_body(o, s, w, t, n, shift);
}
RINGZERO_AVX512_TARGET inline void fold_tops_f64_avx512(std::uint8_t* t, std::uint8_t* s, const std::uint64_t* b,
                                                        std::uint64_t n) noexcept {
  fold_tops_f64_body(t, s, b, n);
}
RINGZERO_AVX512_TARGET inline void add_words_f64_avx512(std::int64_t* w, std::uint8_t* s, const std::uint64_t* b,
                                                        const std::uint8_t* t, std::uint64_t n) noexcept {
  add_words_f64_body(w, s, b, t, n);
}
RINGZERO_AVX512_TARGET inline void accumulate_f32_avx512(std::uint8_t* t, std::int64_t* l, std::uint8_t* s,
                                                         const float* b, std::uint64_t n) noexcept {
  accumulate_f32_body(t, l, s, b, n);
}
RINGZERO_AVX512_TARGET inline void add_limb_words3_avx512(std::int64_t* w, const std::uint8_t* m, const std::int64_t* l,
                                                          const std::uint8_t* t, std::uint64_t n) noexcept {
  add_limb_words3_body(w, m, l, t, n);
}
RINGZERO_AVX512_TARGET inline std::uint32_t sum_f32_avx512(float* r, const float* const* x, int m, std::uint64_t f,
                                                           std::uint64_t n, int k) noexcept {
  return sum_f32_body(r, x, m, f, n, k);
}
RINGZERO_AVX512_TARGET inline void accumulate_packed_f32_avx512(std::uint8_t* t, std::int64_t* p, std::uint8_t* s,
                                                                const float* b, std::uint64_t n, bool f, bool w,
                                                                bool e) noexcept {
  accumulate_packed_f32_body(t, p, s, b, n, f, w, e);
}
RINGZERO_AVX512_TARGET inline void add_packed_words3_avx512(std::int64_t* w, const std::uint8_t* m,
                                                            const std::int64_t* p, const std::uint8_t* t,
                                                            std::uint64_t n) noexcept {
  add_packed_words3_body(w, m, p, t, n);
}
#undef RINGZERO_AVX512_TARGET
#endif

inline void fold_tops_f32(std::uint8_t* t, const float* b, std::uint64_t n) noexcept {
#if RINGZERO_REPRODUCIBLE_AVX512
  if (reproducible_avx512()) return fold_tops_f32_avx512(t, b, n);
#endif
  fold_tops_f32_body(t, b, n);
}
inline void add_words_f32(std::int64_t* w, const float* b, const std::uint8_t* t, std::uint64_t n) noexcept {
#if RINGZERO_REPRODUCIBLE_AVX512
  if (reproducible_avx512()) return add_words_f32_avx512(w, b, t, n);
#endif
  add_words_f32_body(w, b, t, n);
}
inline void convert_f32(float* o, std::uint8_t* s, const std::int64_t* w, const std::uint8_t* t, std::uint64_t n,
                        int shift) noexcept {
#if RINGZERO_REPRODUCIBLE_AVX512
  if (reproducible_avx512()) return convert_f32_avx512(o, s, w, t, n, shift);
#endif
  convert_f32_body(o, s, w, t, n, shift);
}
inline void fold_tops_f64(std::uint8_t* t, std::uint8_t* s, const std::uint64_t* b, std::uint64_t n) noexcept {
#if RINGZERO_REPRODUCIBLE_AVX512
  if (reproducible_avx512()) return fold_tops_f64_avx512(t, s, b, n);
#endif
  fold_tops_f64_body(t, s, b, n);
}
inline void add_words_f64(std::int64_t* w, std::uint8_t* s, const std::uint64_t* b, const std::uint8_t* t,
                          std::uint64_t n) noexcept {
#if RINGZERO_REPRODUCIBLE_AVX512
  if (reproducible_avx512()) return add_words_f64_avx512(w, s, b, t, n);
#endif
  add_words_f64_body(w, s, b, t, n);
}

inline void accumulate_f32(std::uint8_t* t, std::int64_t* l, std::uint8_t* s, const float* b,
                           std::uint64_t n) noexcept {
#if RINGZERO_REPRODUCIBLE_AVX512
  if (reproducible_avx512()) return accumulate_f32_avx512(t, l, s, b, n);
#endif
  accumulate_f32_body(t, l, s, b, n);
}
inline std::uint32_t sum_f32(float* r, const float* const* x, int m, std::uint64_t f, std::uint64_t n, int k) noexcept {
#if RINGZERO_REPRODUCIBLE_AVX512
  if (reproducible_avx512()) return sum_f32_avx512(r, x, m, f, n, k);
#endif
  return sum_f32_body(r, x, m, f, n, k);
}
inline void accumulate_packed_f32(std::uint8_t* t, std::int64_t* p, std::uint8_t* s, const float* b, std::uint64_t n,
                                  bool f, bool w, bool e) noexcept {
#if RINGZERO_REPRODUCIBLE_AVX512
  if (reproducible_avx512()) return accumulate_packed_f32_avx512(t, p, s, b, n, f, w, e);
#endif
  accumulate_packed_f32_body(t, p, s, b, n, f, w, e);
}
inline void add_packed_words3(std::int64_t* w, const std::uint8_t* m, const std::int64_t* p, const std::uint8_t* t,
                              std::uint64_t n) noexcept {
#if RINGZERO_REPRODUCIBLE_AVX512
  if (reproducible_avx512()) return add_packed_words3_avx512(w, m, p, t, n);
#endif
  add_packed_words3_body(w, m, p, t, n);
}
inline void add_limb_words3(std::int64_t* w, const std::uint8_t* m, const std::int64_t* l, const std::uint8_t* t,
                            std::uint64_t n) noexcept {
#if RINGZERO_REPRODUCIBLE_AVX512
  if (reproducible_avx512()) return add_limb_words3_avx512(w, m, l, t, n);
#endif
  add_limb_words3_body(w, m, l, t, n);
}

}  // namespace detail

/// tops[i] = max(tops[i], top bin of values[i]) for `count` elements of floating dtype `t`.
inline void fold_top_bins(std::uint8_t* tops, const void* values, std::uint64_t count, dtype t) noexcept {
  const auto* bytes = static_cast<const unsigned char*>(values);
  const std::size_t es = dtype_size(t);
  const float_format f = format_of(t);
  alignas(64) float staged[detail::reproducible_block];
  alignas(64) std::uint8_t slow[detail::reproducible_block];
  for (std::uint64_t first = 0; first < count; first += detail::reproducible_block) {
    const std::uint64_t n = std::min(detail::reproducible_block, count - first);
    const void* block = bytes + first * es;
    if (t == dtype::float64) {
      std::uint64_t b[detail::reproducible_block];
      std::memcpy(b, block, n * 8);
      detail::fold_tops_f64(tops + first, slow, b, n);
      for (std::uint64_t i = 0; i < n; ++i)
        if (slow[i] != 0) tops[first + i] = std::max(tops[first + i], top_bin(decode_bits(b[i], f)));
    } else {
      detail::fold_tops_f32(tops + first, detail::as_float32(staged, block, n, t), n);
    }
  }
}

/// words[i*w .. i*w+w) += the words of values[i] at global top bin tops[i] (w =
/// reproducible_words(t)). Precondition: tops[i] >= the top bin of values[i].
inline void add_truncated_words(std::int64_t* words, const void* values, const std::uint8_t* tops, std::uint64_t count,
                                dtype t) noexcept {
  const auto* bytes = static_cast<const unsigned char*>(values);
  const std::size_t es = dtype_size(t);
  alignas(64) float staged[detail::reproducible_block];
  alignas(64) std::uint8_t slow[detail::reproducible_block];
  for (std::uint64_t first = 0; first < count; first += detail::reproducible_block) {
    const std::uint64_t n = std::min(detail::reproducible_block, count - first);
    const void* block = bytes + first * es;
    if (t == dtype::float64) {
      std::uint64_t b[detail::reproducible_block];
      std::memcpy(b, block, n * 8);
      detail::add_words_f64(words + 2 * first, slow, b, tops + first, n);
      for (std::uint64_t i = 0; i < n; ++i)
        if (slow[i] != 0) add_words(words + 2 * (first + i), decode_bits(b[i], format_of(t)), tops[first + i], 6);
    } else {
      detail::add_words_f32(words + first, detail::as_float32(staged, block, n, t), tops + first, n);
    }
  }
}

/// out[i] = the value of words[i*w..] at top bin tops[i] divided by `divisor`, rounded once
/// (convert_words per element, bit for bit).
inline void convert_to(void* out, const std::int64_t* words, const std::uint8_t* tops, std::uint64_t count, dtype t,
                       std::uint64_t divisor) noexcept {
  const float_format f = format_of(t);
  const int kept = reproducible_kept_bins(t);
  const std::uint64_t w = static_cast<std::uint64_t>(reproducible_words(t));
  if (t != dtype::float32 || !std::has_single_bit(divisor)) {
    for (std::uint64_t i = 0; i < count; ++i)
      store_bits(out, i, t, convert_words(words + i * w, tops[i], divisor, kept, f));
    return;
  }
  const int shift = std::countr_zero(divisor);
  auto* result = static_cast<float*>(out);
  alignas(64) std::uint8_t slow[detail::reproducible_block];
  for (std::uint64_t first = 0; first < count; first += detail::reproducible_block) {
    const std::uint64_t n = std::min(detail::reproducible_block, count - first);
    detail::convert_f32(result + first, slow, words + first, tops + first, n, shift);
    std::uint8_t any = 0;
    for (std::uint64_t i = 0; i < n; ++i) any |= slow[i];
    if (any != 0)
      for (std::uint64_t i = 0; i < n; ++i)
        if (slow[i] != 0)
          result[first + i] = std::bit_cast<float>(
              static_cast<std::uint32_t>(convert_words(words + first + i, tops[first + i], divisor, kept, f)));
  }
}

/// Deposits one contribution `values` (`count` elements of floating dtype `t`) into a binned
/// accumulator: tops[i] and limbs[i*K .. i*K+K) (K = reproducible_kept_bins(t)) as
/// primitive::accumulate per element, bit for bit. 16/32-bit dtypes take the float32 loop,
/// float64 and elements whose top becomes the non-finite bin the element function.
inline void accumulate_array(std::uint8_t* tops, std::int64_t* limbs, const void* values, std::uint64_t count,
                             dtype t) noexcept {
  const float_format f = format_of(t);
  if (t == dtype::float64) {
    for (std::uint64_t i = 0; i < count; ++i)
      accumulate(tops[i], limbs + 6 * i, 6, decode_bits(load_bits(values, i, t), f));
    return;
  }
  const auto* bytes = static_cast<const unsigned char*>(values);
  const std::size_t es = dtype_size(t);
  alignas(64) float staged[detail::reproducible_block];
  alignas(64) std::uint8_t slow[detail::reproducible_block];
  for (std::uint64_t first = 0; first < count; first += detail::reproducible_block) {
    const std::uint64_t n = std::min(detail::reproducible_block, count - first);
    const void* block = bytes + first * es;
    detail::accumulate_f32(tops + first, limbs + 3 * first, slow, detail::as_float32(staged, block, n, t), n);
    std::uint8_t any = 0;
    for (std::uint64_t i = 0; i < n; ++i) any |= slow[i];
    if (any != 0)
      for (std::uint64_t i = 0; i < n; ++i)
        if (slow[i] != 0)
          accumulate(tops[first + i], limbs + 3 * (first + i), 3, decode_bits(load_bits(block, i, t), f));
  }
}

/// accumulate_array for packed K = 3 elements (float16, bfloat16, float32; see binned_view):
/// tops[i], packed[i] and, where `flushed` is not null, flushed[3i .. 3i+3) as
/// primitive::accumulate_packed per element, bit for bit. Precondition: fewer than
/// reproducible_packed_contributions contributions in `packed`. `within` = false skips the
/// within-top pass (a speed hint, same bits): for deposits where many values rise over their
/// tops, such as an accumulator's first and second contributions. `empty` = true deposits the
/// first contribution of a cleared accumulator: tops and packed are overwritten, never read, so
/// they need no clearing pass (flushed must then be null or all zero); same bits as a deposit
/// into zeroed storage.
inline void accumulate_packed_array(std::uint8_t* tops, std::int64_t* packed, std::int64_t* flushed, const void* values,
                                    std::uint64_t count, dtype t, bool within = true, bool empty = false) noexcept {
  const float_format f = format_of(t);
  const auto* bytes = static_cast<const unsigned char*>(values);
  const std::size_t es = dtype_size(t);
  alignas(64) float staged[detail::reproducible_block];
  alignas(64) std::uint8_t slow[detail::reproducible_block];
  for (std::uint64_t first = 0; first < count; first += detail::reproducible_block) {
    const std::uint64_t n = std::min(detail::reproducible_block, count - first);
    const void* block = bytes + first * es;
    detail::accumulate_packed_f32(tops + first, packed + first, slow, detail::as_float32(staged, block, n, t), n,
                                  flushed != nullptr, within, empty);
    std::uint8_t any = 0;
    for (std::uint64_t i = 0; i < n; ++i) any |= slow[i];
    if (any == 0) continue;
    for (std::uint64_t i = 0; i < n; i += 8) {  // slow[] is mostly zero: 8 flags at a time
      const std::uint64_t end = std::min(i + 8, n);
      std::uint64_t flags = 0;
      std::memcpy(&flags, slow + i, end - i);
      if (flags != 0)
        for (std::uint64_t j = i; j < end; ++j)
          if (slow[j] != 0)
            accumulate_packed(tops[first + j], packed[first + j],
                              flushed != nullptr ? flushed + 3 * (first + j) : nullptr,
                              decode_bits(load_bits(block, j, t), f));
    }
  }
}

/// Moves packed K = 3 elements' limbs into their flushed limbs (flushed[3i..] +=
/// packed_element_limbs, packed[i] = 0), so that they can take reproducible_packed_contributions more.
inline void flush_packed(const std::uint8_t* tops, std::int64_t* packed, std::int64_t* flushed,
                         std::uint64_t count) noexcept {
  for (std::uint64_t i = 0; i < count; ++i) {
    std::int64_t limbs[3];
    packed_element_limbs(tops[i], packed[i], limbs);
    for (int j = 0; j < 3; ++j) flushed[3 * i + static_cast<std::uint64_t>(j)] += limbs[j];
    packed[i] = 0;
  }
}

/// out[i] = max(out[i], top bin of accumulator element first+i), i < len: the binned storage's
/// local tops and the top bins of the staged contributions.
inline void fold_accumulator_tops(const binned_view& view, std::uint8_t* out, std::uint64_t first,
                                  std::uint64_t len) noexcept {
  view.fold_tops(out, first, len);
  const std::size_t es = dtype_size(view.type);
  for (std::uint64_t j = 0; j < view.staged_count; ++j)
    fold_top_bins(out, static_cast<const unsigned char*>(view.staged_array(j)) + first * es, len, view.type);
}

/// words[i*w ..] += accumulator element first+i's words at global top bin global_tops[i]
/// (binned_view::add_words plus add_truncated_words of each staged contribution, bit for bit;
/// K = 3 takes branch-free loops: the words are linear in the limbs, so the packed and the
/// flushed parts are added one after the other).
inline void add_accumulator_words(const binned_view& view, std::int64_t* words, const std::uint8_t* global_tops,
                                  std::uint64_t first, std::uint64_t len) noexcept {
  const std::size_t es = dtype_size(view.type);
  for (std::uint64_t j = 0; j < view.staged_count; ++j)
    add_truncated_words(words, static_cast<const unsigned char*>(view.staged_array(j)) + first * es, global_tops, len,
                        view.type);
  if (view.deposited() == 0) return;  // all zero, whatever the storage holds (binned_view)
  if (reproducible_kept_bins(view.type) != 3) return view.add_words(words, global_tops, first, len);
  detail::add_packed_words3(words, view.tops + first, view.packed + first, global_tops, len);
  if (view.limbs != nullptr)
    detail::add_limb_words3(words, view.tops + first, view.limbs + 3 * first, global_tops, len);
}

/// result[i] = the reproducible sum of ins[0][first + i], ..., ins[n_in - 1][first + i] divided
/// by `divisor`, rounded once to float32, for i < n <= detail::reproducible_fused_block:
/// bit for bit fold_top_bins, add_truncated_words and convert_to over the same inputs, but in
/// one loop (2-4 inputs; passes over the block otherwise) that reads each input from memory
/// once. Blocks with a subnormal or non-finite value, or a result that is not a normal float32,
/// and divisors that are not powers of two take those three functions. Preconditions:
/// n_in >= 1, divisor >= 1; `result` does not overlap the inputs' block.
inline void reproducible_sum_f32(float* result, const float* const* ins, int n_in, std::uint64_t first, std::uint64_t n,
                                 std::uint64_t divisor) noexcept {
  if (std::has_single_bit(divisor) && detail::sum_f32(result, ins, n_in, first, n, std::countr_zero(divisor)) == 0)
    return;
  alignas(64) std::uint8_t tops[detail::reproducible_fused_block];
  alignas(64) std::int64_t words[detail::reproducible_fused_block];
  std::memset(tops, 0, n);
  std::memset(words, 0, n * 8);
  for (int q = 0; q < n_in; ++q) fold_top_bins(tops, ins[q] + first, n, dtype::float32);
  for (int q = 0; q < n_in; ++q) add_truncated_words(words, ins[q] + first, tops, n, dtype::float32);
  convert_to(result, words, tops, n, dtype::float32, divisor);
}

}  // namespace ringzero::primitive
