#pragma once
/// @file
/// `primitive::cudart::device_workspace`: scratch memory on one CUDA device, owned by a communicator,
/// allocated once and reused (the device counterpart of core/workspace_pool.hpp).
///
/// A slot grows (to the request rounded up to 2 MiB) only when a request exceeds it. Growing
/// first waits for the owner's stream, so no enqueued kernel or copy still uses the old buffer,
/// then frees it; a steady-state loop allocates nothing. Contents are unspecified.
/// Thread safety: not thread-safe; used by the communicator's owning thread or its progress
/// thread, never both at once (like workspace_pool).

#include <array>
#include <cstddef>
#include <string>

#include "ringzero/primitive/cudart/runtime.hpp"

namespace ringzero::primitive::cudart {

/// A few numbered device buffers on one device, each grown on demand and kept.
class device_workspace {
 public:
  /// Number of slots (the algorithms use slots 0..5 of algorithms/call.hpp through
  /// `transport::scratch`; backends use the last one for staging received data).
  static constexpr int slot_count = 7;
  /// The slot backends use for staging.
  static constexpr int staging_slot = slot_count - 1;

  /// Scratch on `device`, ordered with `stream` (used to wait before a buffer is replaced).
  device_workspace(int device, cudaStream_t stream) noexcept : device_(device), stream_(stream) {}
  device_workspace(const device_workspace&) = delete;
  device_workspace& operator=(const device_workspace&) = delete;
  ~device_workspace() { release(); }

  /// A device buffer of at least `bytes` bytes in `slot`, 256-byte aligned (cudaMalloc's
  /// guarantee), valid until the same slot grows. Throws errc::invalid_argument for a bad slot
  /// and errc::backend_failure when the device is out of memory.
  void* get(int slot, std::size_t bytes) {
    if (slot < 0 || slot >= slot_count)
      throw error(errc::invalid_argument, "device_workspace slot " + std::to_string(slot) + " out of range");
    auto& s = slots_[static_cast<std::size_t>(slot)];
    if (bytes <= s.bytes && s.data) return s.data;
    constexpr std::size_t granule = std::size_t{2} << 20;
    const std::size_t rounded = (bytes + granule - 1) / granule * granule;
    if (rounded < bytes)
      throw error(errc::invalid_argument, "scratch request of " + std::to_string(bytes) + " bytes overflows");
    device_guard guard(device_);
    if (s.data) {
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (before growing device scratch)");
      (void)cudaFree(s.data);
      s.data = nullptr;
      s.bytes = 0;
    }
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, rounded == 0 ? granule : rounded);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw error(errc::backend_failure, "cannot allocate " + std::to_string(rounded) +
                                             " bytes of device scratch on device " + std::to_string(device_) + ": " +
                                             error_text(e));
    }
    s.data = p;
    s.bytes = rounded == 0 ? granule : rounded;
    return p;
  }

  /// Bytes held by all slots.
  std::size_t capacity_bytes() const noexcept {
    std::size_t total = 0;
    for (const auto& s : slots_) total += s.bytes;
    return total;
  }

  /// Waits for the stream and frees every slot (also done by the destructor).
  void release() noexcept {
    bool any = false;
    for (const auto& s : slots_) any = any || s.data != nullptr;
    if (!any) return;
    int previous = 0;
    const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(stream_);
    for (auto& s : slots_) {
      if (s.data) (void)cudaFree(s.data);
      s.data = nullptr;
      s.bytes = 0;
    }
    if (have_previous) (void)cudaSetDevice(previous);
    (void)cudaGetLastError();
  }

 private:
  struct slot_storage {
    void* data = nullptr;
    std::size_t bytes = 0;
  };

  int device_;
  cudaStream_t stream_;
  std::array<slot_storage, slot_count> slots_{};
};

}  // namespace ringzero::primitive::cudart
