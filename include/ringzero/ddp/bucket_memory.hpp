#pragma once
/// @file
/// `bucket_memory`: the memory a gradient reducer keeps its buckets in, and the operations that
/// move gradients into and out of them, for host memory and for CUDA device memory alike. The
/// reducer (ddp/gradient_reducer.hpp) and the built-in communication hooks go through it, so
/// one code path serves both:
/// - host memory: 64-byte-aligned allocations, `memcpy`, `memset` and the host primitives,
///   executed on the calling thread before the call returns;
/// - CUDA device memory (a communicator whose `space()` is `memory_space::cuda`): allocations
///   with cudaMalloc, and every copy (cudaMemcpyAsync), fill, division and cast (the CUDA
///   primitives) enqueued on the communicator's stream, returning before the device has run
///   them (stream order, as NCCL's collectives).
/// The manual: docs/ddp.md, "Header notes", `ringzero/ddp/bucket_memory.hpp`.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/ddp/gradient_bucket.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/fill.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::ddp {

namespace detail {

/// Frees memory allocated by a `bucket_memory`: `std::free` for host memory; for device memory
/// the registered `deallocate` (cudaFree, which waits for the device) on the owning device.
/// Callers that may still have work in flight on the memory synchronise the stream first.
struct bucket_memory_deleter {
  const primitive::device_primitives* kernels = nullptr;  ///< null: host memory
  int device = -1;

  void operator()(void* p) const noexcept {
    if (p == nullptr) return;
    if (kernels == nullptr) {
      std::free(p);
      return;
    }
    (void)kernels->set_device(device);
    (void)kernels->deallocate(p);
  }
};

/// Memory owned through a `bucket_memory` (host or device).
using bucket_storage = std::unique_ptr<void, bucket_memory_deleter>;

}  // namespace detail

/// Host or CUDA device memory for gradient buckets (see the file comment).
class bucket_memory {
 public:
  /// Host memory.
  bucket_memory() = default;

  /// CUDA device memory on `device`, ordered on `stream` (a cudaStream_t), through `kernels`.
  static bucket_memory on_device(const primitive::device_primitives& kernels, void* stream, int device) noexcept {
    bucket_memory m;
    m.kernels_ = &kernels;
    m.stream_ = stream;
    m.device_ = device;
    return m;
  }

  /// The memory of `comm`'s buffers: host memory, or its device and stream. Throws
  /// errc::unsupported (naming the rank) when they are device memory and no CUDA kernels are
  /// registered in the program.
  static bucket_memory of(const communicator& comm) {
    if (comm.space() == memory_space::host) return {};
    const primitive::device_primitives* k = primitive::registered_device_primitives();
    if (k == nullptr || k->allocate == nullptr || k->divide == nullptr)
      ringzero::detail::raise(
          comm, errc::unsupported,
          "the communicator's buffers are CUDA device memory, but " + primitive::device_primitives_missing_message());
    return on_device(*k, comm.cuda_stream(), comm.cuda_device());
  }

  /// The memory of a bucket handed to a communication hook (its `space`, `cuda_stream` and
  /// `cuda_device`). Throws errc::unsupported as `of(comm)`.
  static bucket_memory of(const gradient_bucket& bucket) {
    if (bucket.space == memory_space::host) return {};
    const primitive::device_primitives* k = primitive::registered_device_primitives();
    if (k == nullptr || k->allocate == nullptr || k->divide == nullptr)
      throw error(errc::unsupported, "a gradient bucket in CUDA device memory needs the CUDA kernels: " +
                                         primitive::device_primitives_missing_message());
    return on_device(*k, bucket.cuda_stream, bucket.cuda_device);
  }

  /// Host or CUDA device memory.
  memory_space space() const noexcept { return kernels_ ? memory_space::cuda : memory_space::host; }
  /// True for CUDA device memory.
  bool is_device() const noexcept { return kernels_ != nullptr; }
  /// The stream (cudaStream_t) device work is ordered on; nullptr for host memory.
  void* stream() const noexcept { return stream_; }
  /// The CUDA device; -1 for host memory.
  int device() const noexcept { return device_; }

  /// `bytes` bytes (rounded up to a multiple of 64, at least 64), 64-byte aligned (256 on the
  /// device), zeroed: host memory is touched once here; device memory is zeroed on the stream.
  detail::bucket_storage allocate(std::size_t bytes) const {
    const std::size_t rounded = (bytes + 63) / 64 * 64 + 64;
    if (rounded < bytes)
      throw error(errc::invalid_argument, "bucket_memory: " + std::to_string(bytes) + " bytes overflow");
    if (!kernels_) {
      void* p = std::aligned_alloc(64, rounded);
      if (p == nullptr)
        throw error(errc::internal,
                    "bucket_memory: cannot allocate " + std::to_string(rounded) + " bytes of host memory");
      std::memset(p, 0, rounded);
      return detail::bucket_storage(p, detail::bucket_memory_deleter{});
    }
    use_device();
    void* p = nullptr;
    check(kernels_->allocate(&p, rounded), "cudaMalloc of " + std::to_string(rounded) + " bytes");
    detail::bucket_storage owned(p, detail::bucket_memory_deleter{kernels_, device_});
    check(kernels_->fill(p, rounded, dtype::uint8, 0.0, stream_), "zeroing new device memory");
    return owned;
  }

  /// Copies `bytes` bytes from `src` to `dst` (disjoint, or the same pointer: a no-op).
  void copy(void* dst, const void* src, std::size_t bytes) const {
    if (bytes == 0 || dst == src) return;
    if (!kernels_) {
      std::memcpy(dst, src, bytes);
      return;
    }
    use_device();
    check(kernels_->copy(dst, src, bytes, stream_), "copying gradients (cudaMemcpyAsync)");
  }

  /// Sets `count` elements of `type` at `dst` to `value` (primitive/fill.hpp's conversion).
  void fill(void* dst, std::uint64_t count, dtype type, double value) const {
    if (count == 0) return;
    if (!kernels_) {
      primitive::fill(dst, count, type, value);
      return;
    }
    use_device();
    check(kernels_->fill(dst, count, type, value, stream_), "fill");
  }

  /// Sets `bytes` bytes at `dst` to zero.
  void zero(void* dst, std::size_t bytes) const {
    if (bytes == 0) return;
    if (!kernels_) {
      std::memset(dst, 0, bytes);
      return;
    }
    use_device();
    check(kernels_->fill(dst, bytes, dtype::uint8, 0.0, stream_), "zeroing gradients");
  }

  /// `dst[i] = src[i] / divisor` with avg's arithmetic (primitive::divide_into); `dst` may
  /// equal `src`. Precondition: divisor >= 1.
  void divide(void* dst, const void* src, std::uint64_t count, dtype type, std::int64_t divisor) const {
    if (count == 0) return;
    if (!kernels_) {
      primitive::divide_into(dst, src, count, type, divisor);
      return;
    }
    use_device();
    check(kernels_->divide(dst, src, count, type, divisor, stream_), "dividing gradients");
  }

  /// Converts `count` elements with primitive/cast.hpp's rules (`dst` and `src` disjoint).
  void cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::uint64_t count) const {
    if (count == 0) return;
    if (!kernels_) {
      primitive::cast_into(dst, dst_type, src, src_type, count);
      return;
    }
    use_device();
    check(kernels_->cast(dst, dst_type, src, src_type, count, stream_), "casting gradients");
  }

  /// Copies `bytes` bytes from this memory at `src` into host memory at `host`; on the device,
  /// waits for the stream first and returns once the bytes have arrived.
  void to_host(void* host, const void* src, std::size_t bytes) const {
    if (!kernels_) {
      if (bytes != 0 && host != src) std::memcpy(host, src, bytes);
      return;
    }
    use_device();
    if (bytes != 0) check(kernels_->copy(host, src, bytes, stream_), "copying to the host (cudaMemcpyAsync)");
    check(kernels_->synchronize(stream_), "waiting for the stream (cudaStreamSynchronize)");
  }

  /// Copies `bytes` bytes from host memory at `host` into this memory at `dst` (on the device:
  /// enqueued; see the file comment for how long `host` must stay unchanged).
  void from_host(void* dst, const void* host, std::size_t bytes) const {
    if (bytes == 0 || dst == host) return;
    if (!kernels_) {
      std::memcpy(dst, host, bytes);
      return;
    }
    use_device();
    check(kernels_->copy(dst, host, bytes, stream_), "copying from the host (cudaMemcpyAsync)");
  }

  /// Blocks until every operation enqueued on the stream so far has run (host: nothing).
  void synchronize() const {
    if (!kernels_) return;
    use_device();
    check(kernels_->synchronize(stream_), "waiting for the stream (cudaStreamSynchronize)");
  }

 private:
  void use_device() const { check(kernels_->set_device(device_), "cudaSetDevice"); }

  void check(int code, const std::string& what) const {
    if (code == 0) return;
    throw error(errc::backend_failure, what + " failed on CUDA device " + std::to_string(device_) + ": " +
                                           kernels_->error_name(code) + ": " + kernels_->error_string(code));
  }

  const primitive::device_primitives* kernels_ = nullptr;
  void* stream_ = nullptr;
  int device_ = -1;
};

}  // namespace ringzero::ddp
