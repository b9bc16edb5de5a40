#pragma once
/// @file
/// `device_stream_ref`: one CUDA stream (a cudaStream_t held as `void*`) on one device, with the
/// registered CUDA kernels (primitive/device_primitives.hpp) that enqueue the memory operations
/// on it: copy, fill, cast, scale, reduce, divide, and a host wait. It is the one place where
/// code compiled without nvcc and without CUDA headers (the algorithms' device data ops, the DDP
/// reducer's bucket memory, `cuda_stream`'s memory operations) runs work on device memory.
/// Operations return the launch's cudaError_t (0 on success; [[nodiscard]]) and never block,
/// except `synchronize`; `check` turns a code into errc::backend_failure naming the operation
/// and the device. Counts are in elements, sizes in bytes; arguments and results follow the host
/// primitive of the same name, bit for bit. Non-owning: the stream must outlive the reference.
/// Thread safety: as CUDA's streams. The manual is docs/streams.md.

#include <cstdint>
#include <string>
#include <string_view>

#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::primitive {

/// See the file comment.
class device_stream_ref {
 public:
  /// `stream` (a cudaStream_t; nullptr is the legacy default stream) on `device`, run by `kernels`.
  device_stream_ref(const device_primitives& kernels, void* stream, int device) noexcept
      : kernels_(&kernels), stream_(stream), device_(device) {}

  /// `stream` on `device` with the program's registered kernels; errc::unsupported without them.
  static device_stream_ref registered(void* stream, int device) {
    return device_stream_ref(require_device_primitives(), stream, device);
  }

  const device_primitives& kernels() const noexcept { return *kernels_; }
  /// The cudaStream_t.
  void* stream() const noexcept { return stream_; }
  int device() const noexcept { return device_; }

  /// Makes the device current on the calling thread (cudaSetDevice).
  [[nodiscard]] int make_current() const noexcept { return kernels_->set_device(device_); }
  /// Copies `bytes` bytes, any direction (cudaMemcpyAsync); nothing for 0 bytes or dst == src.
  [[nodiscard]] int copy(void* dst, const void* src, std::uint64_t bytes) const noexcept {
    return bytes == 0 || dst == src ? 0 : kernels_->copy(dst, src, bytes, stream_);
  }
  /// Sets `count` elements of `type` to `value` (primitive::fill).
  [[nodiscard]] int fill(void* dst, std::uint64_t count, dtype type, double value) const noexcept {
    return count == 0 ? 0 : kernels_->fill(dst, count, type, value, stream_);
  }
  /// Converts `count` elements (primitive::cast_into).
  [[nodiscard]] int cast(void* dst, dtype dst_type, const void* src, dtype src_type,
                         std::uint64_t count) const noexcept {
    return count == 0 ? 0 : kernels_->cast(dst, dst_type, src, src_type, count, stream_);
  }
  /// `dst = scalar * src` (primitive::scale_into).
  [[nodiscard]] int scale(void* dst, const void* src, std::uint64_t count, dtype type, double scalar) const noexcept {
    return count == 0 ? 0 : kernels_->scale(dst, src, count, type, scalar, stream_);
  }
  /// `dst = a (op) b` (primitive::reduce_into).
  [[nodiscard]] int reduce(void* dst, const void* a, const void* b, std::uint64_t count,
                           const reduce_spec& spec) const noexcept {
    return count == 0 ? 0 : kernels_->reduce_into(dst, a, b, count, spec, stream_);
  }
  /// `dst = src / divisor` with avg's arithmetic (primitive::divide_into); divisor >= 1.
  [[nodiscard]] int divide(void* dst, const void* src, std::uint64_t count, dtype type,
                           std::int64_t divisor) const noexcept {
    return count == 0 ? 0 : kernels_->divide(dst, src, count, type, divisor, stream_);
  }
  /// Blocks the calling thread until the work enqueued so far has run (cudaStreamSynchronize).
  [[nodiscard]] int synchronize() const noexcept { return kernels_->synchronize(stream_); }

  /// "<what> failed on CUDA device <d>: <name>: <description>" for a nonzero `code`.
  std::string describe(int code, std::string_view what) const {
    return std::string(what) + " failed on CUDA device " + std::to_string(device_) + ": " + kernels_->error_name(code) +
           ": " + kernels_->error_string(code);
  }
  /// Throws errc::backend_failure (`describe`) for a nonzero `code`.
  void check(int code, std::string_view what) const {
    if (code != 0) throw error(errc::backend_failure, describe(code, what));
  }

 private:
  const device_primitives* kernels_;
  void* stream_;
  int device_;
};

}  // namespace ringzero::primitive
