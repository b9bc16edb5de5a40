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
/// then not host-addressable on CUDA.

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
