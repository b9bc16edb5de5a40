#pragma once
/// @file
/// `zero::detail::host_buffer`: one block of memory that the ZeRO runtime allocates once (at
/// construction or when a pool grows) and reuses, a `primitive::memory_buffer` (the
/// memory-and-stream layer, primitive/memory_space.hpp) plus the size asked for. Host blocks
/// are zero-filled and page-aligned (4096 bytes) from 4 KiB up, 64-byte-aligned below; every
/// page is touched when it is allocated, never on the training path (first touches are slow on
/// virtual machines). Page alignment lets a checkpoint load read a file straight into the
/// memory (O_DIRECT, docs/checkpoint.md). `bytes()` is the size asked for, which is what the
/// runtime's memory report counts. The device path (docs/zero.md) instead adopts a
/// `memory_buffer` of its context's memory space, which it zeroes by stream work; `data()` is
/// then not host-addressable on CUDA. `untouched` gives blocks whose pages are mapped by their
/// first writer instead (a checkpoint load's second copy of the state, written once by reads).

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "ringzero/core/error.hpp"
#include "ringzero/primitive/fill.hpp"
#include "ringzero/primitive/memory_space.hpp"

namespace ringzero::zero::detail {

/// See the file comment. Move-only.
class host_buffer {
 public:
  /// The alignment of blocks of at least this many bytes.
  static constexpr std::uint64_t page_bytes = 4096;
  /// `untouched` blocks of at least this many bytes are 2 MiB-aligned mappings (transparent huge pages).
  static constexpr std::uint64_t huge_bytes = std::uint64_t{2} << 20;
  /// `bytes` rounded up to whole pages.
  static constexpr std::size_t whole_pages(std::uint64_t bytes) noexcept {
    return static_cast<std::size_t>((bytes + page_bytes - 1) / page_bytes * page_bytes);
  }
  /// The host alignment of a block of `bytes`: a page from a page up, else primitive::host_alignment.
  static constexpr std::size_t host_alignment_for(std::uint64_t bytes) noexcept {
    return bytes >= page_bytes ? page_bytes : primitive::host_alignment;
  }
  host_buffer() = default;
  /// `bytes` zeroed bytes of host memory (none for 0), counted in `counter` when given. Throws
  /// errc::internal when memory is exhausted.
  explicit host_buffer(std::uint64_t bytes, primitive::memory_counter* counter = nullptr) : bytes_(bytes) {
    if (bytes == 0) return;
    if (bytes > static_cast<std::uint64_t>(static_cast<std::size_t>(-1)))
      throw error(errc::internal, "zero: cannot allocate " + std::to_string(bytes) + " bytes");
    try {
      memory_ = primitive::memory_buffer::allocate(primitive::memory_space::host, static_cast<std::size_t>(bytes), -1,
                                                   host_alignment_for(bytes), counter);
    } catch (const error&) { throw error(errc::internal, "zero: cannot allocate " + std::to_string(bytes) + " bytes"); }
    primitive::zero_bytes(memory_.data(), static_cast<std::size_t>(bytes));
  }

  /// `bytes` of host memory that reads as zero but whose pages are not touched here, for memory
  /// that is written whole before it is read (a checkpoint load's second copy of the state,
  /// filled by direct reads, docs/checkpoint.md): from 2 MiB up an anonymous mapping (2 MiB-
  /// aligned, zero pages of the kernel) advised to use transparent huge pages (madvise
  /// MADV_HUGEPAGE), so that a writer maps it 2 MiB at a time where the kernel has huge pages
  /// (a 4 KiB first touch costs microseconds on virtual machines, a 2 MiB one about the time of
  /// clearing it); below 2 MiB the constructor's zeroed block. Counted in `counter` when given.
  /// Throws errc::internal when memory is exhausted.
  static host_buffer untouched(std::uint64_t bytes, primitive::memory_counter* counter = nullptr) {
    constexpr std::uint64_t huge = huge_bytes;
    if (bytes < huge) return host_buffer(bytes, counter);
    if (bytes > static_cast<std::uint64_t>(static_cast<std::size_t>(-1)) - 2 * huge)
      throw error(errc::internal, "zero: cannot allocate " + std::to_string(bytes) + " bytes");
    // One huge page more than needed, the ends given back at once: the block is the mapping
    // [aligned, aligned + kept), 2 MiB-aligned and `bytes` rounded up to a page, which the free
    // function unmaps. Its tail after the last whole huge page cannot take a huge page (the
    // mapping does not cover it), so a block never holds more than a page it does not use.
    const auto rounded = static_cast<std::size_t>((bytes + huge - 1) / huge * huge);
    const std::size_t mapped = rounded + static_cast<std::size_t>(huge);
    const std::size_t kept = whole_pages(bytes);
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw error(errc::internal, "zero: cannot allocate " + std::to_string(bytes) + " bytes");
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t aligned = (base + huge - 1) / huge * huge;
    if (aligned > base) (void)::munmap(p, aligned - base);
    if (base + mapped > aligned + kept)
      (void)::munmap(reinterpret_cast<void*>(aligned + kept), base + mapped - (aligned + kept));
    auto* data = reinterpret_cast<void*>(aligned);
#if defined(MADV_HUGEPAGE)
    (void)::madvise(data, kept, MADV_HUGEPAGE);
#endif
    return host_buffer(primitive::memory_buffer::adopt(
        data, static_cast<std::size_t>(bytes), primitive::memory_space::host, -1,
        [](void*, void* d, std::size_t n, primitive::memory_space) noexcept {
          (void)::munmap(d, whole_pages(n));  // the kept block
        },
        nullptr, counter));
  }
  /// Adopts `b` (device path): its contents are left as they are, for stream work to set.
  explicit host_buffer(primitive::memory_buffer b) : bytes_(b.size_bytes()), memory_(std::move(b)) {}

  /// A view of someone else's memory (`zero::adopt_parameters`: the trainer's): `bytes` at `data`
  /// in `space` (CUDA device `device` for device memory), used in place, never freed or counted
  /// here; its contents are left as they are. Precondition: `data` is not null when `bytes` > 0.
  static host_buffer borrow(void* data, std::uint64_t bytes, primitive::memory_space space, int device) {
    host_buffer b(primitive::memory_buffer::adopt(
        data, static_cast<std::size_t>(bytes), space, device,
        [](void*, void*, std::size_t, primitive::memory_space) noexcept {}, nullptr));
    b.borrowed_ = bytes > 0;
    return b;
  }
  /// True for a `borrow`ed view of at least one byte: the memory is not this buffer's (nor the
  /// runtime's) to replace. False for an empty one.
  bool borrowed() const noexcept { return borrowed_; }

  /// The memory (nullptr when empty).
  unsigned char* data() noexcept { return static_cast<unsigned char*>(memory_.data()); }
  const unsigned char* data() const noexcept { return static_cast<const unsigned char*>(memory_.data()); }
  /// Where the memory lives (memory_space::host unless adopted).
  primitive::memory_space space() const noexcept { return memory_.space(); }
  /// Bytes asked for.
  std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  std::uint64_t bytes_ = 0;
  primitive::memory_buffer memory_;
  bool borrowed_ = false;
};

}  // namespace ringzero::zero::detail
