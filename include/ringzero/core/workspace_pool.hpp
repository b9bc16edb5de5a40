#pragma once
/// @file
/// `workspace_pool`: scratch memory owned by a communicator, allocated once and reused.
///
/// On virtual machines the first touch of a fresh 4 KiB page costs ~12-16 us, so allocating
/// scratch per call ruins large collectives. The pool keeps a few numbered slots; a slot grows
/// (to the requested size rounded up to 2 MiB, pages touched once, transparent huge pages
/// requested on Linux) only when a request exceeds it, and is otherwise returned as is.
/// After a warm-up call at the largest size, no collective allocates.

#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "ringzero/core/error.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ringzero {

/// A small set of host scratch buffers, each grown on demand and kept for reuse.
/// Thread safety: not thread-safe; a communicator uses its pool from one thread at a time
/// (the calling thread or its progress thread, never both at once).
class workspace_pool {
 public:
  /// Number of independent slots; a collective may hold all of them at once.
  static constexpr int slot_count = 6;
  /// Alignment of every buffer in bytes.
  static constexpr std::size_t alignment = 4096;

  workspace_pool() = default;
  workspace_pool(const workspace_pool&) = delete;
  workspace_pool& operator=(const workspace_pool&) = delete;

  /// A buffer of at least `bytes` bytes in slot `slot` (0 <= slot < slot_count), aligned to
  /// `alignment`. Its contents are unspecified. The pointer stays valid until the next call that
  /// grows the same slot. Throws errc::invalid_argument for a bad slot and errc::internal
  /// (wrapping std::bad_alloc) when memory is exhausted.
  void* get(int slot, std::size_t bytes) {
    if (slot < 0 || slot >= slot_count)
      throw error(errc::invalid_argument, "workspace_pool slot " + std::to_string(slot) + " out of range");
    auto& s = slots_[static_cast<std::size_t>(slot)];
    if (bytes <= s.bytes && s.data) return s.data.get();
    grow(s, bytes);
    return s.data.get();
  }

  /// Total bytes currently held by all slots.
  std::size_t capacity_bytes() const noexcept {
    std::size_t total = 0;
    for (const auto& s : slots_) total += s.bytes;
    return total;
  }

  /// Number of times a slot had to grow (a steady-state loop should keep this constant).
  std::size_t growth_count() const noexcept { return growths_; }

 private:
  struct free_deleter {
    void operator()(void* p) const noexcept { std::free(p); }
  };
  struct slot_storage {
    std::unique_ptr<void, free_deleter> data;
    std::size_t bytes = 0;
  };

  void grow(slot_storage& s, std::size_t bytes) {
    constexpr std::size_t granule = std::size_t{2} << 20;
    std::size_t rounded = bytes <= alignment ? alignment : (bytes + granule - 1) / granule * granule;
    if (rounded < bytes)
      throw error(errc::invalid_argument, "scratch request of " + std::to_string(bytes) + " bytes overflows");
    s.data.reset();
    s.bytes = 0;
    void* p = std::aligned_alloc(alignment, rounded);
    if (p == nullptr)
      throw error(errc::internal, "cannot allocate " + std::to_string(rounded) + " bytes of scratch memory");
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (rounded >= granule) (void)::madvise(p, rounded, MADV_HUGEPAGE);
#endif
    std::memset(p, 0, rounded);  // touch every page once, here, not on the hot path
    s.data.reset(p);
    s.bytes = rounded;
    ++growths_;
  }

  std::array<slot_storage, slot_count> slots_{};
  std::size_t growths_ = 0;
};

}  // namespace ringzero
