#pragma once
/// @file
/// `primitive::cudart::stream`: the CUDA stream a communicator orders its work on, either created (and
/// destroyed) by ringzero or borrowed from the caller (never destroyed).
///
/// Created streams are non-blocking (`cudaStreamNonBlocking`): they do not synchronise with the
/// legacy default stream, as NCCL's documentation recommends for communication streams.
/// `launch_host_function` enqueues host code on a stream (cudaLaunchHostFunc).

#include <functional>
#include <memory>
#include <utility>

#include "ringzero/primitive/cudart/runtime.hpp"

namespace ringzero::primitive::cudart {

/// An owned or borrowed `cudaStream_t`.
class stream {
 public:
  stream() = default;
  /// Borrows `s` (may be nullptr, the legacy default stream); the caller keeps ownership.
  static stream borrow(cudaStream_t s) noexcept {
    stream r;
    r.handle_ = s;
    return r;
  }
  /// Creates a non-blocking stream on `device`. Throws errc::backend_failure on failure.
  static stream create(int device) {
    device_guard guard(device);
    stream r;
    check(cudaStreamCreateWithFlags(&r.handle_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    r.owned_ = true;
    return r;
  }
  stream(stream&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)), owned_(std::exchange(other.owned_, false)) {}
  stream& operator=(stream&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
      owned_ = std::exchange(other.owned_, false);
    }
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() { reset(); }

  /// The handle.
  cudaStream_t get() const noexcept { return handle_; }
  /// True when ringzero created the stream (and destroys it).
  bool owned() const noexcept { return owned_; }

  /// Blocks the calling thread until every operation enqueued so far has completed.
  /// Throws errc::backend_failure when one of them failed.
  void synchronize() const { check(cudaStreamSynchronize(handle_), "cudaStreamSynchronize"); }

 private:
  void reset() noexcept {
    if (owned_ && handle_) {
      (void)cudaStreamSynchronize(handle_);
      (void)cudaStreamDestroy(handle_);
    }
    handle_ = nullptr;
    owned_ = false;
  }

  cudaStream_t handle_ = nullptr;
  bool owned_ = false;
};

/// Enqueues `f` on `s` (cudaLaunchHostFunc; CUDA Runtime API, "Stream Management"): CUDA calls
/// it on a thread of its own once the work enqueued before it has completed, and the stream's
/// later work starts only after it returns, so `f` may block to hold the stream back. `f` must
/// not call the CUDA API and must not throw (an exception ends the program); CUDA does not call
/// host functions after an error in the context (then `f` is never called and never freed).
/// Throws errc::backend_failure when the launch fails (then `f` is destroyed here).
inline void launch_host_function(cudaStream_t s, std::function<void()> f) {
  struct trampoline {
    static void CUDART_CB run(void* data) noexcept {
      const std::unique_ptr<std::function<void()>> owned(static_cast<std::function<void()>*>(data));
      (*owned)();
    }
  };
  auto owned = std::make_unique<std::function<void()>>(std::move(f));
  check(cudaLaunchHostFunc(s, &trampoline::run, owned.get()), "cudaLaunchHostFunc");
  (void)owned.release();  // trampoline::run deletes it
}

}  // namespace ringzero::primitive::cudart
