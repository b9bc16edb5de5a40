#pragma once
/// @file
/// `zero::execution_stream`: the small type-erased stream the ZeRO runtime's device path is
/// written against (events, memory operations, host work, collectives), with the host
/// implementation `host_execution_stream` over a `primitive::host_stream` (the simulated device
/// of CI) and `device_context`, what a trainer hands `sharded_model` to run its device path.
/// The step's operations (sum of squares, decision, shard update) run zero/shard_update.hpp's
/// host code on the host stream and zero/optimizer_kernels.cuh's kernels on CUDA.
/// The CUDA implementation is zero/cuda_execution_stream.hpp (needs cudart).
/// Errors: the host stream's (docs/streams.md); `host_work` on a stream that cannot run host
/// code on its memory throws errc::unsupported. Thread safety: as the wrapped stream.
/// The manual: docs/zero.md, "The device path", and docs/streams.md.

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/primitive/host_stream.hpp"
#include "ringzero/primitive/memory_ops.hpp"
#include "ringzero/primitive/memory_space.hpp"
#include "ringzero/primitive/reduce.hpp"
#include "ringzero/zero/shard_update.hpp"

namespace ringzero::zero {

/// An in-order stream of work on memory of one space, ordered against other streams of the
/// same kind by events only (CUDA's stream semantics; docs/streams.md).
class execution_stream {
 public:
  /// A point in a stream of this kind (made by `make_event`; a never-recorded event is complete).
  class event {
   public:
    virtual ~event() = default;
  };

  virtual ~execution_stream() = default;
  /// "host_stream" or "cuda_stream".
  virtual const char* kind() const noexcept = 0;
  /// Where the model state of a runtime driven by this stream lives: memory_space::host for the
  /// simulated device (host memory touched only by stream work), memory_space::device on CUDA.
  virtual primitive::memory_space space() const noexcept = 0;
  /// Where offloaded state lives (zero/offload.hpp): host memory the CPU updates and this
  /// stream's copies reach; pinned host memory beside device memory, host memory on the host stream.
  virtual primitive::memory_space offload_space() const noexcept {
    return space() == primitive::memory_space::host ? primitive::memory_space::host
                                                    : primitive::memory_space::pinned_host;
  }
  /// The CUDA device of the stream; -1 for the host stream.
  virtual int device() const noexcept = 0;
  /// The communicator memory this stream's memory is (host for the host stream).
  virtual ringzero::memory_space communicator_space() const noexcept = 0;
  /// A new event of this kind.
  virtual std::unique_ptr<event> make_event() const = 0;
  /// The stream on which a runtime driven by this compute stream runs the collectives of `comm`:
  /// a new host stream with `options` (host kind), the communicator's own stream (CUDA).
  virtual std::unique_ptr<execution_stream> make_communication_stream(communicator& comm,
                                                                      primitive::host_stream_options options) const = 0;

  /// Records `e` at the current end of this stream.
  virtual void record(event& e) = 0;
  /// Work enqueued later runs after the point of the last record of `e` (never blocks).
  virtual void wait(const event& e) = 0;
  /// Work enqueued later runs after the point, as of this call, of the last record of `e`, an
  /// event of a host stream (`host_execution_stream::make_event`; the offload stream's), whatever
  /// this stream's kind: the host kind waits as `wait` does; CUDA enqueues a host function that
  /// blocks until that point (zero/cuda_execution_stream.hpp). Never blocks the caller.
  virtual void wait_host_stream(const event& e) = 0;
  /// Blocks the calling thread until the point of the last record of `e` is reached.
  virtual void wait_host(const event& e) = 0;
  /// Blocks until everything enqueued so far has run; rethrows the stream's error.
  virtual void synchronize() = 0;
  /// As `synchronize`, dropping any error (for destructors).
  void synchronize_quietly() noexcept {
    try {
      synchronize();
    } catch (...) {}
  }

  /// The memory operations of docs/streams.md, enqueued (counts in elements, `bytes` in bytes).
  virtual void copy(void* dst, const void* src, std::uint64_t bytes) = 0;
  virtual void fill(void* dst, std::uint64_t count, dtype type, double value) = 0;
  virtual void reduce(void* dst, const void* a, const void* b, std::uint64_t count,
                      const primitive::reduce_spec& spec) = 0;
  /// The optimizer step's operations on the stream's memory (zero/shard_update.hpp): `*sum +=`
  /// the float64 sum of squares of `count` gradients of `type` (float32, bfloat16, float16);
  /// `detail::decide_step(*s, ...)`; and `u` applied with the gradients multiplied by
  /// `float(s->gradient_multiplier)`, nothing when `s->skipped` (both read when the work runs).
  virtual void add_sum_of_squares(double* sum, const void* values, std::uint64_t count, dtype type) = 0;
  virtual void decide_step(step_scalars* s, double max_grad_norm, bool skip_nonfinite) = 0;
  virtual void update_shard(const shard_update& u, const step_scalars* s) = 0;
  /// Whether `host_work` runs (true for the host kind).
  virtual bool runs_host_work() const noexcept = 0;
  /// Host code reading and writing the stream's memory, run in order (host kind); errc::unsupported
  /// naming `what` where the memory is not host-addressable (CUDA: a kernel is needed).
  virtual void host_work(std::function<void()> work, const std::string& what) = 0;
  /// A collective of a communicator of this stream's memory, issued in order: the host kind runs
  /// `issue` (which calls the blocking collective) on the stream's thread; the CUDA kind calls it
  /// at once on the caller's thread, the communicator enqueueing its work on this stream.
  virtual void collective(std::function<void()> issue) = 0;
};

/// `execution_stream` over a `primitive::host_stream` (borrowed or owned).
class host_execution_stream final : public execution_stream {
 public:
  /// Borrows `s` (which must outlive this object).
  explicit host_execution_stream(primitive::host_stream& s) : stream_(&s) {}
  /// Owns a new host stream with `options`.
  explicit host_execution_stream(primitive::host_stream_options options)
      : owned_(std::make_unique<primitive::host_stream>(options)), stream_(owned_.get()) {}

  /// The wrapped stream (tests pause and resume it).
  primitive::host_stream& native() noexcept { return *stream_; }

  const char* kind() const noexcept override { return "host_stream"; }
  primitive::memory_space space() const noexcept override { return primitive::memory_space::host; }
  int device() const noexcept override { return -1; }
  ringzero::memory_space communicator_space() const noexcept override { return ringzero::memory_space::host; }
  std::unique_ptr<event> make_event() const override { return std::make_unique<host_event>(); }
  std::unique_ptr<execution_stream> make_communication_stream(communicator&,
                                                              primitive::host_stream_options options) const override {
    return std::make_unique<host_execution_stream>(options);
  }
  void record(event& e) override { stream_->record(cast(e).native); }
  void wait(const event& e) override { stream_->wait_event(cast(e).native); }
  void wait_host_stream(const event& e) override { stream_->wait_event(cast(e).native); }
  void wait_host(const event& e) override { cast(e).native.synchronize(); }
  void synchronize() override { stream_->synchronize(); }
  bool runs_host_work() const noexcept override { return true; }
  void copy(void* dst, const void* src, std::uint64_t bytes) override {
    primitive::enqueue_copy(*stream_, dst, src, bytes);
  }
  void fill(void* dst, std::uint64_t count, dtype type, double value) override {
    primitive::enqueue_fill(*stream_, dst, count, type, value);
  }
  void reduce(void* dst, const void* a, const void* b, std::uint64_t count,
              const primitive::reduce_spec& spec) override {
    primitive::enqueue_reduce(*stream_, dst, a, b, count, spec);
  }
  void add_sum_of_squares(double* sum, const void* values, std::uint64_t count, dtype type) override {
    stream_->enqueue([=] { *sum += detail::sum_of_squares(values, count, type); });
  }
  void decide_step(step_scalars* s, double max_grad_norm, bool skip_nonfinite) override {
    stream_->enqueue([=] { detail::decide_step(*s, max_grad_norm, skip_nonfinite); });
  }
  void update_shard(const shard_update& u, const step_scalars* s) override {
    stream_->enqueue([u, s] {
      if (s->skipped == 0) detail::update_shard(u, static_cast<float>(s->gradient_multiplier));
    });
  }
  void host_work(std::function<void()> work, const std::string&) override { stream_->enqueue(std::move(work)); }
  void collective(std::function<void()> issue) override { stream_->enqueue(std::move(issue)); }

  /// The host event inside `e`, an event of this kind (for other kinds' `wait_host_stream`).
  static const primitive::host_event& native_event(const event& e) { return cast(e).native; }

 private:
  struct host_event final : event {
    primitive::host_event native;
  };
  static host_event& cast(event& e) { return dynamic_cast<host_event&>(e); }
  static const host_event& cast(const event& e) { return dynamic_cast<const host_event&>(e); }

  std::unique_ptr<primitive::host_stream> owned_;
  primitive::host_stream* stream_;
};

/// What a trainer hands `sharded_model` to run its device path: the compute stream on which it
/// enqueues forward and backward (borrowed; it must outlive the model), and the options of the
/// communication stream the runtime creates for the host kind (test knobs: pause, delay).
struct device_context {
  execution_stream* compute = nullptr;
  primitive::host_stream_options communication{};
};

}  // namespace ringzero::zero
