#pragma once
/// @file
/// Host byte copies: `copy_bytes` (memcpy) and `copy_bytes_streaming`, which writes with
/// non-temporal stores so a large result does not evict the caches and does not pay the
/// read-for-ownership of ordinary stores (x86-64 SSE2; plain memcpy elsewhere).
///
/// Counts are in bytes. Thread safety: pure. After streaming stores a caller that hands the
/// memory to another thread must order them with `store_fence()` before its release store.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ringzero/core/config.hpp"

#if RINGZERO_X86_64
#include <emmintrin.h>
#endif

namespace ringzero::primitive {

/// Bytes above which a collective writes its results with streaming stores: larger than the
/// per-core caches, so the data would be evicted before anyone reads it anyway.
inline constexpr std::size_t streaming_threshold_bytes = std::size_t{4} << 20;

/// memcpy; `dst` and `src` must not overlap unless equal (equal pointers copy nothing).
inline void copy_bytes(void* dst, const void* src, std::size_t bytes) noexcept {
  if (bytes == 0 || dst == src) return;
  std::memcpy(dst, src, bytes);
}

/// Copies like `copy_bytes` with non-temporal stores for the 16-byte-aligned body of `dst`.
inline void copy_bytes_streaming(void* dst, const void* src, std::size_t bytes) noexcept {
  if (bytes == 0 || dst == src) return;
#if RINGZERO_X86_64
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15;
  if (bytes < head + 64) {
    std::memcpy(d, s, bytes);
    return;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  std::size_t body = bytes & ~std::size_t{63};
  for (std::size_t i = 0; i < body; i += 64) {
    const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i v2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i v3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), v0);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), v1);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), v2);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), v3);
  }
  if (bytes > body) std::memcpy(d + body, s + body, bytes - body);
#else
  std::memcpy(dst, src, bytes);
#endif
}

/// Orders earlier streaming stores before later stores (x86 `sfence`; nothing elsewhere).
inline void store_fence() noexcept {
#if RINGZERO_X86_64
  _mm_sfence();
#endif
}

}  // namespace ringzero::primitive
