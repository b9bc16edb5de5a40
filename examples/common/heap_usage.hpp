#pragma once
/// @file
/// `heap_bytes_in_use`, `resident_set`: how many bytes the process holds through malloc, read from the C
/// library's allocator statistics, so an example can measure what a step of its own really
/// allocated (the growth between two readings) independently of any library's bookkeeping.
///
/// On glibc 2.33 and later this is mallinfo2(): the bytes of the chunks in use in every arena
/// (`uordblks`, chunk headers included) plus the blocks served by mmap (`hblkhd`, whole pages).
/// The figure covers the whole process, every thread of it: with ranks as threads (ringzero's
/// local backend), a reading taken between two barriers, while the other ranks wait, includes
/// what all of them allocated since the last reading. Elsewhere the function returns
/// std::nullopt. Cost: it locks each arena briefly; call it outside timed loops.

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

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

/// The process's resident memory in bytes: now (VmRSS) and the most it has held (VmHWM).
struct resident_memory {
  std::uint64_t now = 0;
  std::uint64_t peak = 0;
};

/// The process's resident memory, read from /proc/self/status (Linux), or std::nullopt where
/// that file does not say. Covers every thread; memory counts once touched.
inline std::optional<resident_memory> resident_set() {
  std::ifstream in("/proc/self/status");
  resident_memory r;
  int found = 0;
  for (std::string line; std::getline(in, line);) {
    std::uint64_t kib = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %" SCNu64 " kB", &kib) == 1) {
      r.now = kib * 1024;
      ++found;
    } else if (std::sscanf(line.c_str(), "VmHWM: %" SCNu64 " kB", &kib) == 1) {
      r.peak = kib * 1024;
      ++found;
    }
  }
  if (found != 2) return std::nullopt;
  return r;
}

}  // namespace ringzero::examples
