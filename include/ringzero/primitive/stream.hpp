#pragma once
/// @file
/// `primitive::stream`: the type-erased stream with events of the memory-and-stream layer, the
/// one interface that code serving host and device memory alike is written against (the ZeRO
/// runtime's device path, zero/execution_stream.hpp, derives from it): events (record, wait on
/// another stream, wait_host, query), synchronize, the memory operations (copy, fill, cast,
/// scale, reduce) and host work, with CUDA's stream semantics. Implementations:
/// `host_backed_stream` here, over the asynchronous `host_stream` (the simulated device of CI:
/// every operation runs later on the stream's thread, with the host primitives), and
/// `cuda_backed_stream` (primitive/cuda_backed_stream.hpp, needs cudart).
/// Counts are in elements, sizes in bytes; buffers must stay alive until the work has run.
/// Errors: the wrapped stream's (docs/streams.md); `host_work` on a stream whose memory host
/// code cannot touch throws errc::unsupported. An event must come from `make_event` of a stream
/// of the same kind. Thread safety: as the wrapped stream. The manual is docs/streams.md.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "ringzero/core/dtype.hpp"
#include "ringzero/primitive/host_stream.hpp"
#include "ringzero/primitive/memory_ops.hpp"
#include "ringzero/primitive/memory_space.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::primitive {

/// An in-order stream of work on memory of one space, ordered against other streams of the
/// same kind by events only (see the file comment).
class stream {
 public:
  /// A point in a stream of this kind (made by `make_event`; a never-recorded event is complete).
  class event {
   public:
    virtual ~event() = default;
  };

  virtual ~stream() = default;
  /// "host_stream" or "cuda_stream".
  virtual const char* kind() const noexcept = 0;
  /// Where the memory this stream works on lives: memory_space::host for the host stream (host
  /// memory touched only by stream work), memory_space::device on CUDA.
  virtual memory_space space() const noexcept = 0;
  /// The CUDA device of the stream; -1 for the host stream.
  virtual int device() const noexcept = 0;
  /// A new event of this kind.
  virtual std::unique_ptr<event> make_event() const = 0;

  /// A new event of this kind that also notes when its point is reached, for `elapsed_seconds`
  /// (host events always do; a CUDA one is made without cudaEventDisableTiming, whose records
  /// cost a little more). Throws errc::unsupported for a kind that cannot time (the default).
  virtual std::unique_ptr<event> make_timing_event() const {
    throw error(errc::unsupported, std::string(kind()) + " does not time its events");
  }
  /// Seconds from the point of `start`'s last record to that of `end`'s: events of this kind
  /// made by `make_timing_event`, both reached. Throws errc::invalid_argument when one is not
  /// reached (or not a timing event); errc::unsupported for a kind that cannot time.
  virtual double elapsed_seconds(const event& start, const event& end) const {
    (void)start;
    (void)end;
    throw error(errc::unsupported, std::string(kind()) + " does not time its events");
  }

  /// Records `e` at the current end of this stream.
  virtual void record(event& e) = 0;
  /// Work enqueued later runs after the point of the last record of `e` (never blocks).
  virtual void wait(const event& e) = 0;
  /// Blocks the calling thread until the point of the last record of `e` is reached.
  virtual void wait_host(const event& e) = 0;
  /// True when the point of the last record of `e` has been reached; never blocks.
  virtual bool query(const event& e) const = 0;
  /// True when everything enqueued so far has run; never blocks. Rethrows the stream's error.
  virtual bool query() = 0;
  /// Blocks until everything enqueued so far has run; rethrows the stream's error.
  virtual void synchronize() = 0;
  /// As `synchronize`, dropping any error (for destructors).
  void synchronize_quietly() noexcept {
    try {
      synchronize();
    } catch (...) {}
  }

  /// The memory operations of primitive/memory_ops.hpp, enqueued; results are bitwise the host
  /// primitives' (copy_bytes, fill, cast_into, scale_into, reduce_into).
  virtual void copy(void* dst, const void* src, std::uint64_t bytes) = 0;
  virtual void fill(void* dst, std::uint64_t count, dtype type, double value) = 0;
  virtual void cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::uint64_t count) = 0;
  virtual void scale(void* dst, const void* src, std::uint64_t count, dtype type, double scalar) = 0;
  virtual void reduce(void* dst, const void* a, const void* b, std::uint64_t count, const reduce_spec& spec) = 0;
  /// Whether `host_work` runs (true for the host kind).
  virtual bool runs_host_work() const noexcept = 0;
  /// Host code reading and writing the stream's memory, run in order (host kind); errc::unsupported
  /// naming `what` where the memory is not host-addressable (CUDA: a kernel is needed).
  virtual void host_work(std::function<void()> work, const std::string& what) = 0;
};

namespace detail {
/// The elapsed time between two native events, found by argument-dependent lookup (host_event
/// here, cuda_event where cuda_stream.hpp is included).
template <class NativeEvent>
double native_elapsed_seconds(const NativeEvent& start, const NativeEvent& end) {
  return elapsed_seconds(start, end);
}
}  // namespace detail

/// The operations that every `stream` over a native stream forwards the same way: events of type
/// `NativeEvent` recorded and awaited on a `Native` stream (borrowed or owned), and the memory
/// operations as that stream's `enqueue_*` (primitive/memory_ops.hpp for `host_stream`,
/// primitive/cuda_stream.hpp for `cuda_stream`). `host_backed_stream` and `cuda_backed_stream`
/// add what differs: their kind, space and device, how events are made, and host work.
template <class Native, class NativeEvent>
class native_backed_stream : public virtual stream {
 public:
  /// Borrows `s` (which must outlive this object).
  explicit native_backed_stream(Native& s) : stream_(&s) {}
  /// Owns `s` (not null).
  explicit native_backed_stream(std::unique_ptr<Native> s) : owned_(std::move(s)), stream_(owned_.get()) {}

  /// The wrapped stream (tests pause and resume a host one).
  Native& native() noexcept { return *stream_; }
  const Native& native() const noexcept { return *stream_; }

  double elapsed_seconds(const event& start, const event& end) const override {
    return detail::native_elapsed_seconds(box(start).native, box(end).native);
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

  /// The native event inside `e`, an event of this kind (for another kind's wait on this one).
  static const NativeEvent& native_event(const event& e) { return box(e).native; }

 protected:
  /// A `stream::event` holding a native event built from `args`.
  struct event_box final : event {
    template <class... Args>
    explicit event_box(Args&&... args) : native(std::forward<Args>(args)...) {}
    NativeEvent native;
  };
  static event_box& box(event& e) { return dynamic_cast<event_box&>(e); }
  static const event_box& box(const event& e) { return dynamic_cast<const event_box&>(e); }

 private:
  std::unique_ptr<Native> owned_;
  Native* stream_;
};

/// `stream` over a `host_stream` (borrowed or owned). Derived classes add operations.
class host_backed_stream : public native_backed_stream<host_stream, host_event> {
 public:
  /// Borrows `s` (which must outlive this object).
  explicit host_backed_stream(host_stream& s) : native_backed_stream(s) {}
  /// Owns a new host stream with `options`.
  explicit host_backed_stream(host_stream_options options)
      : native_backed_stream(std::make_unique<host_stream>(options)) {}
  /// Owns `s` (not null): a host stream driven by an executor or by the calling thread.
  explicit host_backed_stream(std::unique_ptr<host_stream> s) : native_backed_stream(std::move(s)) {}

  const char* kind() const noexcept override { return "host_stream"; }
  memory_space space() const noexcept override { return memory_space::host; }
  int device() const noexcept override { return -1; }
  std::unique_ptr<event> make_event() const override { return std::make_unique<event_box>(); }
  std::unique_ptr<event> make_timing_event() const override { return make_event(); }
  bool runs_host_work() const noexcept override { return true; }
  void host_work(std::function<void()> work, const std::string&) override { native().enqueue(std::move(work)); }
};

}  // namespace ringzero::primitive
