#pragma once
/// @file
/// `cuda_backed_stream`: the CUDA implementation of `primitive::stream` (primitive/stream.hpp)
/// over a `cuda_stream` (borrowed or owned). Events are `cuda_event`s on the stream's device;
/// the memory operations run the registered CUDA kernels (cuda_stream.hpp's `enqueue_*`);
/// `host_work` throws errc::unsupported (host code cannot touch device memory).
/// Errors: CUDA's as errc::backend_failure; errc::unsupported without registered kernels.
/// Needs cudart (RINGZERO_HAS_CUDA=1), not nvcc. Thread safety: as CUDA's streams and events.
/// The manual is docs/streams.md.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "ringzero/core/error.hpp"
#include "ringzero/primitive/cuda_stream.hpp"
#include "ringzero/primitive/stream.hpp"

namespace ringzero::primitive {

/// See the file comment. Derived classes add operations.
class cuda_backed_stream : public native_backed_stream<cuda_stream, cuda_event> {
 public:
  /// Borrows `s` (which must outlive this object).
  explicit cuda_backed_stream(cuda_stream& s) : native_backed_stream(s) {}
  /// Owns `s`.
  explicit cuda_backed_stream(std::unique_ptr<cuda_stream> s) : native_backed_stream(std::move(s)) {}

  const char* kind() const noexcept override { return "cuda_stream"; }
  memory_space space() const noexcept override { return memory_space::device; }
  int device() const noexcept override { return native().device(); }
  std::unique_ptr<event> make_event() const override { return std::make_unique<event_box>(native().device()); }
  std::unique_ptr<event> make_timing_event() const override {
    return std::make_unique<event_box>(native().device(), true);
  }
  bool runs_host_work() const noexcept override { return false; }
  void host_work(std::function<void()>, const std::string& what) override {
    throw error(errc::unsupported, "on a CUDA stream: " + what +
                                       " is host code, which cannot run on device memory (it has no CUDA kernel)");
  }
};

}  // namespace ringzero::primitive
