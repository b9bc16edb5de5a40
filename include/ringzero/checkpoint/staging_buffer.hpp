#pragma once
/// @file
/// `checkpoint::detail::staging_buffer`: zero-filled host memory for a save's or a load's
/// staging copy. Blocks of 2 MiB and more are 2 MiB-aligned and advised to use transparent huge
/// pages (madvise MADV_HUGEPAGE): on virtual machines a first touch of each 4 KiB page costs
/// microseconds, which made staging half a GiB cost more than reading it from disk. Every page
/// is touched here, at allocation. Throws errc::internal when memory is exhausted. Move-only.

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "ringzero/core/error.hpp"

namespace ringzero::checkpoint::detail {

/// See the file comment.
class staging_buffer {
 public:
  staging_buffer() = default;
  explicit staging_buffer(std::uint64_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    constexpr std::uint64_t huge = std::uint64_t{2} << 20;
    const std::uint64_t align = bytes >= huge ? huge : 64;
    const std::uint64_t rounded = (bytes + align - 1) / align * align;
    void* p = rounded >= bytes ? std::aligned_alloc(static_cast<std::size_t>(align), static_cast<std::size_t>(rounded)) : nullptr;
    if (p == nullptr) throw error(errc::internal, "checkpoint: cannot allocate " + std::to_string(bytes) + " bytes of staging memory");
#if defined(MADV_HUGEPAGE)
    if (align == huge) (void)::madvise(p, static_cast<std::size_t>(rounded), MADV_HUGEPAGE);
#endif
    std::memset(p, 0, static_cast<std::size_t>(rounded));
    data_.reset(static_cast<unsigned char*>(p));
  }
  unsigned char* data() noexcept { return data_.get(); }
  const unsigned char* data() const noexcept { return data_.get(); }
  std::uint64_t bytes() const noexcept { return bytes_; }
  bool empty() const noexcept { return bytes_ == 0; }

 private:
  struct free_deleter {
    void operator()(unsigned char* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<unsigned char, free_deleter> data_;
  std::uint64_t bytes_ = 0;
};

}  // namespace ringzero::checkpoint::detail
