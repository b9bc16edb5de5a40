#pragma once
/// @file
/// `checkpoint::detail::staging_buffer`: zero-filled host memory for a save's or a load's
/// staging copy. Blocks of 2 MiB and more are anonymous mappings (zero pages from the kernel,
/// no memset) advised to use transparent huge pages (madvise MADV_HUGEPAGE); smaller ones are
/// page-aligned from 4 KiB up (direct reads need it). On virtual machines a first touch of each
/// 4 KiB page costs microseconds. `pre_touch` (the asynchronous save's
/// buffer, allocated once and copied into on the training thread) touches every page here;
/// without it (a load's, filled once by pread) pages are touched as they are first written.
/// Throws errc::internal when memory is exhausted. Move-only.

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "ringzero/core/error.hpp"

namespace ringzero::checkpoint::detail {

/// Frees a staging block: an anonymous mapping of `mapped` bytes, or (0) one from aligned_alloc.
struct staging_release {
  std::size_t mapped = 0;
  void operator()(unsigned char* p) const noexcept {
    if (mapped != 0)
      ::munmap(p, mapped);
    else
      std::free(p);
  }
};

/// See the file comment.
class staging_buffer {
 public:
  staging_buffer() = default;
  explicit staging_buffer(std::uint64_t bytes, bool pre_touch = true) : bytes_(bytes) {
    if (bytes == 0) return;
    constexpr std::uint64_t huge = std::uint64_t{2} << 20;
    auto fail = [&] {
      return error(errc::internal, "checkpoint: cannot allocate " + std::to_string(bytes) + " bytes of staging memory");
    };
    if (bytes < huge) {
      const std::uint64_t align = bytes >= 4096 ? 4096 : 64;
      void* p = std::aligned_alloc(static_cast<std::size_t>(align),
                                   static_cast<std::size_t>((bytes + align - 1) / align * align));
      if (p == nullptr) throw fail();
      std::memset(p, 0, static_cast<std::size_t>(bytes));
      data_.reset(static_cast<unsigned char*>(p));
      return;
    }
    const std::uint64_t rounded = (bytes + huge - 1) / huge * huge;
    void* p =
        ::mmap(nullptr, static_cast<std::size_t>(rounded), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw fail();
    data_ = std::unique_ptr<unsigned char, staging_release>(static_cast<unsigned char*>(p),
                                                            staging_release{static_cast<std::size_t>(rounded)});
#if defined(MADV_HUGEPAGE)
    (void)::madvise(p, static_cast<std::size_t>(rounded), MADV_HUGEPAGE);
#endif
    if (pre_touch)  // one write per 4 KiB page maps it (a zero page of the kernel would be read-only)
      for (std::uint64_t at = 0; at < rounded; at += 4096) static_cast<volatile unsigned char*>(p)[at] = 0;
  }
  unsigned char* data() noexcept { return data_.get(); }
  const unsigned char* data() const noexcept { return data_.get(); }
  std::uint64_t bytes() const noexcept { return bytes_; }
  bool empty() const noexcept { return bytes_ == 0; }

 private:
  std::unique_ptr<unsigned char, staging_release> data_;
  std::uint64_t bytes_ = 0;
};

}  // namespace ringzero::checkpoint::detail
