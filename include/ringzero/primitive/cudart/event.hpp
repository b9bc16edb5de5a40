#pragma once
/// @file
/// `primitive::cudart::event`: an owned CUDA event without timing (the cheapest kind), used to order one
/// stream's work after another's (`cudaEventRecord` on the producer, `cudaStreamWaitEvent` on
/// the consumer) across the ranks of one process, also across devices.
///
/// Thread safety: an event is recorded by one thread; other threads may wait on it once they
/// have observed (with acquire ordering) that the record happened.

#include <utility>

#include "ringzero/primitive/cudart/runtime.hpp"

namespace ringzero::primitive::cudart {

/// An owned `cudaEvent_t` on a given device, created with `cudaEventDisableTiming` unless it
/// is made for timing.
class event {
 public:
  event() = default;
  /// Creates the event on `device`. Throws errc::backend_failure on failure.
  explicit event(int device, bool timing = false) {
    device_guard guard(device);
    check(cudaEventCreateWithFlags(&handle_, timing ? cudaEventDefault : cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
  }
  event(event&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  event& operator=(event&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { reset(); }

  /// The handle (nullptr for a default-constructed event).
  cudaEvent_t get() const noexcept { return handle_; }

  /// Records the event on `stream` (captures the work enqueued so far). Throws on failure.
  void record(cudaStream_t stream) const { check(cudaEventRecord(handle_, stream), "cudaEventRecord"); }

  /// True when the work captured by the last record has completed (or nothing was recorded).
  /// Throws errc::backend_failure when that work failed.
  bool ready() const {
    const cudaError_t e = cudaEventQuery(handle_);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    check(e, "cudaEventQuery");
    return true;
  }

 private:
  void reset() noexcept {
    if (handle_) (void)cudaEventDestroy(handle_);
    handle_ = nullptr;
  }

  cudaEvent_t handle_ = nullptr;
};

/// Makes `stream` wait (on the device, not the host) for the work captured by the last record
/// of `e` (a `cudaEvent_t`, possibly from another device). Throws errc::backend_failure.
inline void stream_wait(cudaStream_t stream, cudaEvent_t e) {
  check(cudaStreamWaitEvent(stream, e, 0), "cudaStreamWaitEvent");
}

}  // namespace ringzero::primitive::cudart
