#pragma once
/// @file
/// `zero::detail::host_buffer`: one zero-filled block of host memory, page-aligned (4096 bytes)
/// from 4 KiB up and 64-byte-aligned below, that the ZeRO runtime allocates once (at
/// construction or when a pool grows) and reuses. Every page is touched when it is allocated,
/// never on the training path (first touches are slow on virtual machines). `bytes()` is the
/// size asked for, which is what the runtime's memory report counts. Page alignment lets a
/// checkpoint load read a file straight into the memory (O_DIRECT, docs/checkpoint.md).
/// The device path (docs/zero.md) instead adopts a `primitive::memory_buffer` of its context's
/// memory space, which it zeroes by stream work; `data()` is then not host-addressable on CUDA.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "ringzero/core/error.hpp"
#include "ringzero/primitive/memory_space.hpp"

namespace ringzero::zero::detail {

/// See the file comment. Move-only.
class host_buffer {
 public:
  /// The alignment of blocks of at least this many bytes.
  static constexpr std::uint64_t page_bytes = 4096;
  host_buffer() = default;
  /// `bytes` zeroed bytes (none for 0). Throws errc::internal when memory is exhausted.
  explicit host_buffer(std::uint64_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    const std::uint64_t align = bytes >= page_bytes ? page_bytes : 64;
    const std::uint64_t rounded = (bytes + align - 1) / align * align;
    void* p = rounded >= bytes ? std::aligned_alloc(static_cast<std::size_t>(align), static_cast<std::size_t>(rounded))
                               : nullptr;
    if (p == nullptr) throw error(errc::internal, "zero: cannot allocate " + std::to_string(bytes) + " bytes");
    std::memset(p, 0, static_cast<std::size_t>(rounded));
    data_.reset(static_cast<unsigned char*>(p));
  }

  /// Adopts `b` (device path): its contents are left as they are, for stream work to set.
  explicit host_buffer(primitive::memory_buffer b) : bytes_(b.size_bytes()), adopted_(std::move(b)) {}

  /// The memory (nullptr when empty).
  unsigned char* data() noexcept { return data_ ? data_.get() : static_cast<unsigned char*>(adopted_.data()); }
  const unsigned char* data() const noexcept {
    return data_ ? data_.get() : static_cast<const unsigned char*>(adopted_.data());
  }
  /// Where the memory lives (memory_space::host unless adopted).
  primitive::memory_space space() const noexcept { return data_ ? primitive::memory_space::host : adopted_.space(); }
  /// Bytes asked for.
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// Sets every byte to zero (host memory only; an adopted buffer is zeroed by stream work).
  void zero() noexcept {
    if (bytes_ != 0 && data_) std::memset(data_.get(), 0, static_cast<std::size_t>(bytes_));
  }

 private:
  struct free_deleter {
    void operator()(unsigned char* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<unsigned char, free_deleter> data_;
  std::uint64_t bytes_ = 0;
  primitive::memory_buffer adopted_;
};

}  // namespace ringzero::zero::detail
