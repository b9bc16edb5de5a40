#pragma once
/// @file
/// `cuda_stream` and `cuda_event`: the CUDA implementation of the memory-and-stream layer, with
/// the interface of `host_stream` / `host_event` (record, wait_event, query, synchronize) and
/// the memory operations `enqueue_copy`, `enqueue_fill`, `enqueue_cast`, `enqueue_scale`,
/// `enqueue_reduce` of primitive/memory_ops.hpp, run by the registered CUDA kernels
/// (primitive/device_stream_ref.hpp). Wraps primitive/cudart/{stream,event}.hpp.
/// Errors: CUDA's (sticky errors included) as errc::backend_failure; errc::unsupported from the
/// memory operations when no kernels are registered. Needs cudart (RINGZERO_HAS_CUDA=1), not nvcc.
/// Thread safety: as CUDA's streams and events. The manual is docs/streams.md.

#include <cstdint>
#include <string>
#include <utility>

#include "ringzero/core/dtype.hpp"
#include "ringzero/primitive/cudart/event.hpp"
#include "ringzero/primitive/cudart/runtime.hpp"
#include "ringzero/primitive/cudart/stream.hpp"
#include "ringzero/primitive/device_primitives.hpp"
#include "ringzero/primitive/device_stream_ref.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::primitive {

/// An event on one CUDA device (cudaEventDisableTiming unless made for timing). Never recorded
/// counts as complete.
class cuda_event {
 public:
  /// Creates the event on `device` (`timing`: for `elapsed_seconds`). Throws
  /// errc::backend_failure (errc::no_device without one).
  explicit cuda_event(int device, bool timing = false) : event_(device, timing), device_(device), timing_(timing) {}

  /// True when the work before the last record has completed; never blocks.
  bool query() const { return event_.ready(); }
  /// Blocks the calling thread until the work before the last record has completed.
  void synchronize() const { primitive::cudart::check(cudaEventSynchronize(event_.get()), "cudaEventSynchronize"); }
  cudaEvent_t get() const noexcept { return event_.get(); }
  int device() const noexcept { return device_; }

  /// Seconds between the last records of two timing events, both complete
  /// (cudaEventElapsedTime). Throws errc::invalid_argument for an event not made for timing.
  friend double elapsed_seconds(const cuda_event& start, const cuda_event& end) {
    if (!start.timing_ || !end.timing_)
      throw error(errc::invalid_argument, "elapsed_seconds: a CUDA event made without timing");
    float ms = 0;
    primitive::cudart::check(cudaEventElapsedTime(&ms, start.get(), end.get()), "cudaEventElapsedTime");
    return static_cast<double>(ms) / 1e3;
  }

 private:
  primitive::cudart::event event_;
  int device_;
  bool timing_;
};

/// (The friend above, declared here for qualified calls.)
double elapsed_seconds(const cuda_event& start, const cuda_event& end);

/// An owned (non-blocking) or borrowed CUDA stream on one device.
class cuda_stream {
 public:
  /// Creates a non-blocking stream on `device`.
  explicit cuda_stream(int device) : stream_(primitive::cudart::stream::create(device)), device_(device) {}
  /// Borrows `s` (the caller keeps it) on `device`.
  static cuda_stream borrow(cudaStream_t s, int device) {
    return cuda_stream(primitive::cudart::stream::borrow(s), device);
  }

  /// Records `e` at the current end of this stream.
  void record(cuda_event& e) {
    primitive::cudart::device_guard guard(device_);
    primitive::cudart::check(cudaEventRecord(e.get(), stream_.get()), "cudaEventRecord");
  }
  /// Later work on this stream runs after the point of the last record of `e` (no host block).
  void wait_event(const cuda_event& e) { primitive::cudart::stream_wait(stream_.get(), e.get()); }
  /// True when all work enqueued so far has completed; never blocks. Throws on a failed task.
  bool query() {
    const cudaError_t e = cudaStreamQuery(stream_.get());
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    primitive::cudart::check(e, "cudaStreamQuery");
    return true;
  }
  /// Blocks until all work enqueued so far has completed. Throws on a failed task.
  void synchronize() { stream_.synchronize(); }
  cudaStream_t get() const noexcept { return stream_.get(); }
  int device() const noexcept { return device_; }

 private:
  cuda_stream(primitive::cudart::stream s, int device) : stream_(std::move(s)), device_(device) {}
  primitive::cudart::stream stream_;
  int device_;
};

namespace detail {
/// `s` with the registered kernels, its device made current on the calling thread.
inline device_stream_ref current_device_stream(cuda_stream& s, const char* what) {
  const device_stream_ref q = device_stream_ref::registered(s.get(), s.device());
  q.check(q.make_current(), std::string(what) + ": cudaSetDevice");
  return q;
}
}  // namespace detail

/// Copies `bytes` bytes (any direction; cudaMemcpyAsync with cudaMemcpyDefault).
inline void enqueue_copy(cuda_stream& s, void* dst, const void* src, std::uint64_t bytes) {
  const device_stream_ref q = detail::current_device_stream(s, "enqueue_copy");
  q.check(q.copy(dst, src, bytes), "enqueue_copy");
}
/// Sets `count` elements of `type` to `value` (bitwise primitive::fill's result).
inline void enqueue_fill(cuda_stream& s, void* dst, std::uint64_t count, dtype type, double value) {
  const device_stream_ref q = detail::current_device_stream(s, "enqueue_fill");
  q.check(q.fill(dst, count, type, value), "enqueue_fill");
}
/// Converts `count` elements (primitive::cast_into's rules).
inline void enqueue_cast(cuda_stream& s, void* dst, dtype dst_type, const void* src, dtype src_type,
                         std::uint64_t count) {
  const device_stream_ref q = detail::current_device_stream(s, "enqueue_cast");
  q.check(q.cast(dst, dst_type, src, src_type, count), "enqueue_cast");
}
/// `dst = scalar * src` (primitive::scale_into's arithmetic).
inline void enqueue_scale(cuda_stream& s, void* dst, const void* src, std::uint64_t count, dtype type, double scalar) {
  const device_stream_ref q = detail::current_device_stream(s, "enqueue_scale");
  q.check(q.scale(dst, src, count, type, scalar), "enqueue_scale");
}
/// `dst = a (op) b` (primitive::reduce_into's semantics).
inline void enqueue_reduce(cuda_stream& s, void* dst, const void* a, const void* b, std::uint64_t count,
                           const reduce_spec& spec) {
  const device_stream_ref q = detail::current_device_stream(s, "enqueue_reduce");
  q.check(q.reduce(dst, a, b, count, spec), "enqueue_reduce");
}

}  // namespace ringzero::primitive
