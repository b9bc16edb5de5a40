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
class cuda_backed_stream : public virtual stream {
 public:
  /// Borrows `s` (which must outlive this object).
  explicit cuda_backed_stream(cuda_stream& s) : stream_(&s) {}
  /// Owns `s`.
  explicit cuda_backed_stream(std::unique_ptr<cuda_stream> s) : owned_(std::move(s)), stream_(owned_.get()) {}

  /// The wrapped stream.
  cuda_stream& native() noexcept { return *stream_; }
  const cuda_stream& native() const noexcept { return *stream_; }

  const char* kind() const noexcept override { return "cuda_stream"; }
  memory_space space() const noexcept override { return memory_space::device; }
  int device() const noexcept override { return stream_->device(); }
  std::unique_ptr<event> make_event() const override { return std::make_unique<cuda_event_box>(stream_->device()); }
  std::unique_ptr<event> make_timing_event() const override {
    return std::make_unique<cuda_event_box>(stream_->device(), true);
  }
  double elapsed_seconds(const event& start, const event& end) const override {
    return primitive::elapsed_seconds(box(start).native, box(end).native);
  }
  void record(event& e) override { stream_->record(box(e).native); }
  void wait(const event& e) override { stream_->wait_event(box(e).native); }
  void wait_host(const event& e) override { box(e).native.synchronize(); }
  bool query(const event& e) const override { return box(e).native.query(); }
  bool query() override { return stream_->query(); }
  void synchronize() override { stream_->synchronize(); }
  void copy(void* dst, const void* src, std::uint64_t bytes) override { enqueue_copy(*stream_, dst, src, bytes); }
  void fill(void* dst, std::uint64_t count, dtype type, double value) override {
    enqueue_fill(*stream_, dst, count, type, value);
  }
  void cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::uint64_t count) override {
    enqueue_cast(*stream_, dst, dst_type, src, src_type, count);
  }
  void scale(void* dst, const void* src, std::uint64_t count, dtype type, double scalar) override {
    enqueue_scale(*stream_, dst, src, count, type, scalar);
  }
  void reduce(void* dst, const void* a, const void* b, std::uint64_t count, const reduce_spec& spec) override {
    enqueue_reduce(*stream_, dst, a, b, count, spec);
  }
  bool runs_host_work() const noexcept override { return false; }
  void host_work(std::function<void()>, const std::string& what) override {
    throw error(errc::unsupported, "on a CUDA stream: " + what +
                                       " is host code, which cannot run on device memory (it has no CUDA kernel)");
  }

 private:
  struct cuda_event_box final : event {
    explicit cuda_event_box(int device, bool timing = false) : native(device, timing) {}
    cuda_event native;
  };
  static cuda_event_box& box(event& e) { return dynamic_cast<cuda_event_box&>(e); }
  static const cuda_event_box& box(const event& e) { return dynamic_cast<const cuda_event_box&>(e); }

  std::unique_ptr<cuda_stream> owned_;
  cuda_stream* stream_;
};

}  // namespace ringzero::primitive
