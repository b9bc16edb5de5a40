#pragma once
/// @file
/// `heap_bytes_in_use`: how many bytes the process holds through malloc, read from the C
/// library's allocator statistics, so an example can measure what a step of its own really
/// allocated (the growth between two readings) independently of any library's bookkeeping.
///
/// On glibc 2.33 and later this is mallinfo2(): the bytes of the chunks in use in every arena
/// (`uordblks`, chunk headers included) plus the blocks served by mmap (`hblkhd`, whole pages).
/// The figure covers the whole process, every thread of it: with ranks as threads (ringzero's
/// local backend), a reading taken between two barriers, while the other ranks wait, includes
/// what all of them allocated since the last reading. Elsewhere the function returns
/// std::nullopt. Cost: it locks each arena briefly; call it outside timed loops.

#include <cstdint>
#include <optional>

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h>
#define RINGZERO_EXAMPLES_HAVE_MALLINFO2 1
#endif

namespace ringzero::examples {

/// Bytes allocated through malloc and not yet freed, over the whole process (see the file
/// comment), or std::nullopt when the C library does not say.
inline std::optional<std::uint64_t> heap_bytes_in_use() noexcept {
#if defined(RINGZERO_EXAMPLES_HAVE_MALLINFO2)
  const struct mallinfo2 m = ::mallinfo2();
  return static_cast<std::uint64_t>(m.uordblks) + static_cast<std::uint64_t>(m.hblkhd);
#else
  return std::nullopt;
#endif
}

}  // namespace ringzero::examples
