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
/// `page_populator` maps fresh memory on a helper thread ahead of the reads that fill it.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

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

/// Maps the pages of fresh memory (a load's second copy of the state, never touched) on a helper
/// thread, range by range in the order given, while the loading thread reads into the ranges
/// from their start: the kernel clears each page on its first mapping (microseconds per 4 KiB
/// page on virtual machines), and without the helper that work runs inside each direct read,
/// before the disk gets the request (the pages are pinned first), so the disk idles meanwhile.
/// Uses madvise(MADV_POPULATE_WRITE) (Linux 5.14), which maps a missing page and leaves a
/// present one as it is: the reads may reach a page first. Where the kernel refuses it the
/// helper stops (the reads then map the pages themselves; never a write here, which could land
/// after the data). The destructor stops the helper and waits for it. Thread semantics: owned by
/// one thread; the ranges must stay mapped until it is destroyed.
class page_populator {
 public:
  /// No helper.
  page_populator() = default;
  /// Starts the helper over `ranges` ((start, bytes) pairs, mapped in this order; they must stay
  /// mapped until this object is destroyed). Where no thread can be started there is no helper
  /// (the reads map the pages themselves).
  explicit page_populator(std::vector<std::pair<unsigned char*, std::uint64_t>> ranges) {
    if (ranges.empty()) return;
    try {
      thread_ = std::thread([this, ranges = std::move(ranges)] { run(ranges); });
    } catch (const std::system_error&) {}
  }
  page_populator(const page_populator&) = delete;
  page_populator& operator=(const page_populator&) = delete;
  /// Waits until the helper has gone through every range (no stop request).
  void finish() noexcept {
    if (thread_.joinable()) thread_.join();
  }
  /// Stops the helper and waits for it (at most one 8 MiB madvise).
  ~page_populator() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run(const std::vector<std::pair<unsigned char*, std::uint64_t>>& ranges) noexcept {
    constexpr std::uint64_t step = std::uint64_t{8} << 20;  // how often the stop request is read
    const long page_size = ::sysconf(_SC_PAGESIZE);
    const auto page = static_cast<std::uintptr_t>(page_size > 0 ? page_size : 4096);
    for (const auto& [data, bytes] : ranges) {
      // Whole pages inside the range: madvise needs a page-aligned start.
      const auto begin = (reinterpret_cast<std::uintptr_t>(data) + page - 1) / page * page;
      const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(data) + bytes;
      for (std::uintptr_t at = begin; at < end; at += step) {
        if (stop_.load(std::memory_order_relaxed)) return;
        if (!populate(reinterpret_cast<void*>(at), static_cast<std::size_t>(std::min<std::uint64_t>(step, end - at))))
          return;
      }
    }
  }
  /// False when the kernel refuses to populate (too old, or memory it cannot map this way).
  static bool populate(void* at, std::size_t bytes) noexcept {
#if defined(MADV_POPULATE_WRITE)
    return ::madvise(at, bytes, MADV_POPULATE_WRITE) == 0;
#else
    (void)at;
    (void)bytes;
    return false;
#endif
  }
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ringzero::checkpoint::detail
