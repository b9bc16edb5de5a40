#pragma once
/// @file
/// `sum_broadcast_streaming`: the fused inner loop of the direct all_reduce on host memory.
/// For every element i of a slice, `outs[k][i] = ((ins[0][i] + ins[1][i]) + ins[2][i]) + ...`
/// (inputs combined in the order given, each partial sum rounded in T, exactly as a chain of
/// `reduce_into` sums) for every output k, written with non-temporal stores. Each input byte is
/// read once and each output byte written once, straight from registers: no cache-resident tile
/// in between. On a 2-core Xeon VM this moved the 2-rank float32 all_reduce's minimum traffic
/// 1.5-1.8x faster than reducing 8 KiB tiles and then stream-copying them (see
/// docs/performance.md); software prefetch of every input a few lines ahead added ~10%.
/// The manual: docs/algorithms.md, "Header notes", `ringzero/primitive/sum_broadcast.hpp`.

#include <algorithm>
#include <cstdint>

#include "ringzero/core/config.hpp"
#include "ringzero/core/dtype.hpp"

#if RINGZERO_X86_64
#include <emmintrin.h>
#endif

namespace ringzero::primitive {

namespace detail {

#if RINGZERO_X86_64
/// SSE2 vector of T (float: 4 lanes, double: 2).
template <class T>
struct sse;

template <>
struct sse<float> {
  using v = __m128;
  static v load(const float* p) noexcept { return _mm_loadu_ps(p); }
  static v add(v a, v b) noexcept { return _mm_add_ps(a, b); }
  static void stream(float* p, v x) noexcept { _mm_stream_ps(p, x); }
  static void store(float* p, v x) noexcept { _mm_store_ps(p, x); }
};

template <>
struct sse<double> {
  using v = __m128d;
  static v load(const double* p) noexcept { return _mm_loadu_pd(p); }
  static v add(v a, v b) noexcept { return _mm_add_pd(a, b); }
  static void stream(double* p, v x) noexcept { _mm_stream_pd(p, x); }
  static void store(double* p, v x) noexcept { _mm_store_pd(p, x); }
};

template <class T>
inline T chained_sum(const T* const* ins, int n_in, std::uint64_t i) noexcept {
  T acc = ins[0][i] + ins[1][i];
  for (int q = 2; q < n_in; ++q) acc = acc + ins[q][i];
  return acc;
}

template <class T, bool Stream>
void sum_broadcast_body(T* const* outs, int n_out, const T* const* ins, int n_in, std::uint64_t& i,
                        std::uint64_t count) noexcept {
  constexpr std::uint64_t lanes = 16 / sizeof(T);
  constexpr std::uint64_t step = 4 * lanes;                  // one 64-byte line per output per iteration
  constexpr std::uint64_t prefetch_ahead = 512 / sizeof(T);  // elements: 8 lines ahead of the loads
  using S = sse<T>;
  for (; i + step <= count; i += step) {
    for (int q = 0; q < n_in; ++q)
      _mm_prefetch(reinterpret_cast<const char*>(ins[q] + i + prefetch_ahead), _MM_HINT_T0);
    typename S::v x0 = S::add(S::load(ins[0] + i), S::load(ins[1] + i));
    typename S::v x1 = S::add(S::load(ins[0] + i + lanes), S::load(ins[1] + i + lanes));
    typename S::v x2 = S::add(S::load(ins[0] + i + 2 * lanes), S::load(ins[1] + i + 2 * lanes));
    typename S::v x3 = S::add(S::load(ins[0] + i + 3 * lanes), S::load(ins[1] + i + 3 * lanes));
    for (int q = 2; q < n_in; ++q) {
      x0 = S::add(x0, S::load(ins[q] + i));
      x1 = S::add(x1, S::load(ins[q] + i + lanes));
      x2 = S::add(x2, S::load(ins[q] + i + 2 * lanes));
      x3 = S::add(x3, S::load(ins[q] + i + 3 * lanes));
    }
    for (int k = 0; k < n_out; ++k) {
      if constexpr (Stream) {
        S::stream(outs[k] + i, x0);
        S::stream(outs[k] + i + lanes, x1);
        S::stream(outs[k] + i + 2 * lanes, x2);
        S::stream(outs[k] + i + 3 * lanes, x3);
      } else {
        S::store(outs[k] + i, x0);
        S::store(outs[k] + i + lanes, x1);
        S::store(outs[k] + i + 2 * lanes, x2);
        S::store(outs[k] + i + 3 * lanes, x3);
      }
    }
  }
}

template <class T>
bool sum_broadcast_streaming_typed(T* const* outs, int n_out, const T* const* ins, int n_in,
                                   std::uint64_t count) noexcept {
  const auto misalign = reinterpret_cast<std::uintptr_t>(outs[0]) % 16;
  if (misalign % sizeof(T) != 0) return false;
  for (int k = 1; k < n_out; ++k)
    if (reinterpret_cast<std::uintptr_t>(outs[k]) % 16 != misalign) return false;
  const std::uint64_t head = std::min<std::uint64_t>(count, misalign == 0 ? 0 : (16 - misalign) / sizeof(T));
  for (std::uint64_t i = 0; i < head; ++i) {
    const T x = chained_sum(ins, n_in, i);
    for (int k = 0; k < n_out; ++k) outs[k][i] = x;
  }
  // In place (an output is also an input) the lines were just loaded into this core's cache:
  // ordinary stores complete them there, where non-temporal stores would first evict them.
  bool in_place = false;
  for (int k = 0; k < n_out && !in_place; ++k)
    for (int q = 0; q < n_in && !in_place; ++q) in_place = outs[k] == ins[q];
  std::uint64_t i = head;
  if (in_place)
    sum_broadcast_body<T, false>(outs, n_out, ins, n_in, i, count);
  else
    sum_broadcast_body<T, true>(outs, n_out, ins, n_in, i, count);
  for (; i < count; ++i) {
    const T x = chained_sum(ins, n_in, i);
    for (int k = 0; k < n_out; ++k) outs[k][i] = x;
  }
  return true;
}
#endif

}  // namespace detail

/// See the file comment. `outs` and `ins` hold `n_out` and `n_in` pointers to `type` elements.
/// Returns false (having written nothing) when there is no fused form for this call.
inline bool sum_broadcast_streaming([[maybe_unused]] void* const* outs, [[maybe_unused]] int n_out,
                                    [[maybe_unused]] const void* const* ins, [[maybe_unused]] int n_in,
                                    [[maybe_unused]] std::uint64_t count, [[maybe_unused]] dtype type) noexcept {
#if RINGZERO_X86_64
  if (n_in < 2 || n_out < 1) return false;
  if (type == dtype::float32)
    return detail::sum_broadcast_streaming_typed(reinterpret_cast<float* const*>(outs), n_out,
                                                 reinterpret_cast<const float* const*>(ins), n_in, count);
  if (type == dtype::float64)
    return detail::sum_broadcast_streaming_typed(reinterpret_cast<double* const*>(outs), n_out,
                                                 reinterpret_cast<const double* const*>(ins), n_in, count);
#endif
  return false;
}

}  // namespace ringzero::primitive
