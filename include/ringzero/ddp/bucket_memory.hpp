#pragma once
/// @file
/// `bucket_memory`: the memory a gradient reducer keeps its buckets in, and the operations that
/// move gradients into and out of them, for host memory and for CUDA device memory alike. The
/// reducer (ddp/gradient_reducer.hpp) and the built-in communication hooks go through it, so
/// one code path serves both. It is a view of the memory-and-stream layer (primitive/):
/// - allocations are `primitive::memory_buffer`s (host: 64-byte aligned; device: cudaMalloc);
/// - host memory: the synchronous host primitives (copy_bytes, zero_bytes, fill, divide_into,
///   cast_into), executed on the calling thread before the call returns;
/// - CUDA device memory (a communicator whose `space()` is `memory_space::cuda`): every copy,
///   fill, division and cast enqueued on the communicator's stream through a
///   `primitive::device_stream_ref`, returning before the device has run them (stream order,
///   as NCCL's collectives).
/// The manual: docs/ddp.md, "Header notes", `ringzero/ddp/bucket_memory.hpp`.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/ddp/gradient_bucket.hpp"
#include "ringzero/primitive/cast.hpp"
#include "ringzero/primitive/copy.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/device_stream_ref.hpp"
#include "ringzero/primitive/fill.hpp"
#include "ringzero/primitive/memory_space.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::ddp {

namespace detail {

/// Memory owned through a `bucket_memory` (host or device). Freeing device memory waits for the
/// device (cudaFree); callers that may still have work in flight on it synchronise the stream first.
using bucket_storage = primitive::memory_buffer;

}  // namespace detail

/// Host or CUDA device memory for gradient buckets (see the file comment).
class bucket_memory {
 public:
  /// Host memory.
  bucket_memory() = default;

  /// CUDA device memory on `device`, ordered on `stream` (a cudaStream_t), through `kernels`.
  static bucket_memory on_device(const primitive::device_primitives& kernels, void* stream, int device) noexcept {
    bucket_memory m;
    m.device_.emplace(kernels, stream, device);
    return m;
  }

  /// The memory of `comm`'s buffers: host memory, or its device and stream. Throws
  /// errc::unsupported (naming the rank) when they are device memory and no CUDA kernels are
  /// registered in the program.
  static bucket_memory of(const communicator& comm) {
    if (comm.space() == memory_space::host) return {};
    const primitive::device_primitives* k = primitive::registered_device_primitives();
    if (!usable(k))
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
    if (!usable(k))
      throw error(errc::unsupported, "a gradient bucket in CUDA device memory needs the CUDA kernels: " +
                                         primitive::device_primitives_missing_message());
    return on_device(*k, bucket.cuda_stream, bucket.cuda_device);
  }

  /// Host or CUDA device memory.
  memory_space space() const noexcept { return device_ ? memory_space::cuda : memory_space::host; }
  /// True for CUDA device memory.
  bool is_device() const noexcept { return device_.has_value(); }
  /// The stream (cudaStream_t) device work is ordered on; nullptr for host memory.
  void* stream() const noexcept { return device_ ? device_->stream() : nullptr; }
  /// The CUDA device; -1 for host memory.
  int device() const noexcept { return device_ ? device_->device() : -1; }

  /// `bytes` bytes (rounded up to a multiple of 64, at least 64), 64-byte aligned (256 on the
  /// device), zeroed: host memory is touched once here; device memory is zeroed on the stream.
  /// Counted in `counter` when given (primitive/memory_counter.hpp; the rounded size).
  detail::bucket_storage allocate(std::size_t bytes, primitive::memory_counter* counter = nullptr) const {
    const std::size_t rounded = (bytes + 63) / 64 * 64 + 64;
    if (rounded < bytes)
      throw error(errc::invalid_argument, "bucket_memory: " + std::to_string(bytes) + " bytes overflow");
    if (!device_) {
      detail::bucket_storage b = primitive::memory_buffer::allocate(primitive::memory_space::host, rounded, -1,
                                                                    primitive::host_alignment, counter);
      primitive::zero_bytes(b.data(), rounded);
      return b;
    }
    use_device();
    detail::bucket_storage b = primitive::memory_buffer::allocate(primitive::memory_space::device, rounded, device(),
                                                                  primitive::host_alignment, counter);
    device_->check(device_->fill(b.data(), rounded, dtype::uint8, 0.0), "zeroing new device memory");
    return b;
  }

  /// Copies `bytes` bytes from `src` to `dst` (disjoint, or the same pointer: a no-op).
  void copy(void* dst, const void* src, std::size_t bytes) const {
    if (bytes == 0 || dst == src) return;
    if (!device_) return primitive::copy_bytes(dst, src, bytes);
    use_device();
    device_->check(device_->copy(dst, src, bytes), "copying gradients (cudaMemcpyAsync)");
  }

  /// Sets `count` elements of `type` at `dst` to `value` (primitive/fill.hpp's conversion).
  void fill(void* dst, std::uint64_t count, dtype type, double value) const {
    if (count == 0) return;
    if (!device_) return primitive::fill(dst, count, type, value);
    use_device();
    device_->check(device_->fill(dst, count, type, value), "fill");
  }

  /// Sets `bytes` bytes at `dst` to zero.
  void zero(void* dst, std::size_t bytes) const {
    if (bytes == 0) return;
    if (!device_) return primitive::zero_bytes(dst, bytes);
    use_device();
    device_->check(device_->fill(dst, bytes, dtype::uint8, 0.0), "zeroing gradients");
  }

  /// `dst[i] = src[i] / divisor` with avg's arithmetic (primitive::divide_into); `dst` may
  /// equal `src`. Precondition: divisor >= 1.
  void divide(void* dst, const void* src, std::uint64_t count, dtype type, std::int64_t divisor) const {
    if (count == 0) return;
    if (!device_) return primitive::divide_into(dst, src, count, type, divisor);
    use_device();
    device_->check(device_->divide(dst, src, count, type, divisor), "dividing gradients");
  }

  /// Converts `count` elements with primitive/cast.hpp's rules (`dst` and `src` disjoint).
  void cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::uint64_t count) const {
    if (count == 0) return;
    if (!device_) return primitive::cast_into(dst, dst_type, src, src_type, count);
    use_device();
    device_->check(device_->cast(dst, dst_type, src, src_type, count), "casting gradients");
  }

  /// Copies `bytes` bytes from this memory at `src` into host memory at `host`; on the device,
  /// waits for the stream first and returns once the bytes have arrived.
  void to_host(void* host, const void* src, std::size_t bytes) const {
    if (!device_) return primitive::copy_bytes(host, src, bytes);
    use_device();
    device_->check(device_->copy(host, src, bytes), "copying to the host (cudaMemcpyAsync)");
    device_->check(device_->synchronize(), "waiting for the stream (cudaStreamSynchronize)");
  }

  /// Copies `bytes` bytes from host memory at `host` into this memory at `dst` (on the device:
  /// enqueued; see the file comment for how long `host` must stay unchanged).
  void from_host(void* dst, const void* host, std::size_t bytes) const {
    if (bytes == 0 || dst == host) return;
    if (!device_) return primitive::copy_bytes(dst, host, bytes);
    use_device();
    device_->check(device_->copy(dst, host, bytes), "copying from the host (cudaMemcpyAsync)");
  }

  /// Blocks until every operation enqueued on the stream so far has run (host: nothing).
  void synchronize() const {
    if (!device_) return;
    use_device();
    device_->check(device_->synchronize(), "waiting for the stream (cudaStreamSynchronize)");
  }

 private:
  static bool usable(const primitive::device_primitives* k) noexcept {
    return k != nullptr && k->allocate != nullptr && k->divide != nullptr;
  }
  void use_device() const { device_->check(device_->make_current(), "cudaSetDevice"); }

  std::optional<primitive::device_stream_ref> device_;  ///< empty: host memory
};

}  // namespace ringzero::ddp
