#pragma once
/// @file
/// `zero::execution_stream`: the stream the ZeRO runtime's device path is written against, a
/// `primitive::stream` (events, memory operations, host work; primitive/stream.hpp) that adds
/// only the optimizer step's operations and the collectives; the host implementation
/// `host_execution_stream` over a `primitive::host_stream` (the simulated device of CI); and
/// `device_context`, what a trainer hands `sharded_model` to run its device path.
/// The step's operations: the decision and the shard update run zero/step_kernels.hpp's kernels
/// on both, by `host_launcher` on the host stream (the very source a GPU runs, bitwise the host
/// runtime's update: tests/cuda_on_host) and by `cuda_launcher` on CUDA; the sum of squares
/// runs zero/shard_update.hpp's index-order loop on the host stream, so that the simulated
/// device's gradient norm is the host runtime's bit for bit (the GPU's kernel adds in a block
/// tree, float64 rounding apart).
/// The CUDA implementation is zero/cuda_execution_stream.hpp (needs cudart).
/// Errors: the host stream's (docs/streams.md); `host_work` on a stream that cannot run host
/// code on its memory throws errc::unsupported. Thread safety: as the wrapped stream.
/// The manual: docs/zero.md, "One path: streams", and docs/streams.md.

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/primitive/host_stream.hpp"
#include "ringzero/primitive/kernels/grid.hpp"
#include "ringzero/primitive/memory_ops.hpp"
#include "ringzero/primitive/memory_space.hpp"
#include "ringzero/primitive/reduce.hpp"
#include "ringzero/primitive/stream.hpp"
#include "ringzero/zero/quantization.hpp"
#include "ringzero/zero/quantize_kernels.hpp"
#include "ringzero/zero/shard_update.hpp"
#include "ringzero/zero/step_kernels.hpp"

namespace ringzero::zero {

/// The stream the ZeRO runtime's device path runs on: a `primitive::stream` (events, memory
/// operations, host work) plus the optimizer step's operations and the runtime's collectives.
class execution_stream : public virtual primitive::stream {
 public:
  /// Where offloaded state lives (zero/offload.hpp): host memory the CPU updates and this
  /// stream's copies reach; pinned host memory beside device memory, host memory on the host stream.
  virtual primitive::memory_space offload_space() const noexcept {
    return space() == primitive::memory_space::host ? primitive::memory_space::host
                                                    : primitive::memory_space::pinned_host;
  }
  /// The communicator memory this stream's memory is (host for the host stream).
  virtual ringzero::memory_space communicator_space() const noexcept = 0;
  /// The stream on which a runtime driven by this compute stream runs the collectives of `comm`:
  /// a new host stream with `options` on the communicator's progress thread (host kind), the
  /// communicator's own stream (CUDA).
  virtual std::unique_ptr<execution_stream> make_communication_stream(communicator& comm,
                                                                      primitive::host_stream_options options) const = 0;

  /// Work enqueued later runs after the point, as of this call, of the last record of `e`, an
  /// event of a host stream (`host_execution_stream::make_event`; the offload stream's), whatever
  /// this stream's kind: the host kind waits as `wait` does; CUDA enqueues a host function that
  /// blocks until that point (zero/cuda_execution_stream.hpp). Never blocks the caller.
  virtual void wait_host_stream(const event& e) = 0;

  /// The optimizer step's operations on the stream's memory (zero/shard_update.hpp): `*sum +=`
  /// the float64 sum of squares of `count` gradients of `type` (float32, bfloat16, float16);
  /// `detail::decide_step(*s, ...)`; and `u` applied with the gradients multiplied by
  /// `float(s->gradient_multiplier)`, nothing when `s->skipped` (both read when the work runs).
  virtual void add_sum_of_squares(double* sum, const void* values, std::uint64_t count, dtype type) = 0;
  virtual void decide_step(step_scalars* s, double max_grad_norm, bool skip_nonfinite) = 0;
  virtual void update_shard(const shard_update& u, const step_scalars* s) = 0;
  /// Quantized communication's operations on the stream's memory (zero/quantize_kernels.hpp):
  /// `kernels::quantize_segments` and `kernels::dequantize_segments` with the same arguments, the
  /// kernels on CUDA, their plain-loop twins (the same bytes) on the host stream.
  virtual void quantize_segments(const quantized_layout& l, const void* values, dtype type, void* out) = 0;
  virtual void dequantize_segments(const quantized_layout& l, const void* in, void* values, dtype type, bool average,
                                   std::uint32_t own, const void* own_values) = 0;
  /// A collective of a communicator of this stream's memory, issued in order: the host kind runs
  /// `issue` (which calls the blocking collective) as a task, on the thread that drives the
  /// stream (the communicator's progress thread for a communication stream); the CUDA kind calls
  /// it at once on the caller's thread, the communicator enqueueing its work on this stream.
  virtual void collective(std::function<void()> issue) = 0;
};

/// `execution_stream` over a `primitive::host_stream` (borrowed or owned): the primitive host
/// implementation plus the step's operations as host work.
class host_execution_stream final : public execution_stream, public primitive::host_backed_stream {
 public:
  /// Borrows `s` (which must outlive this object).
  explicit host_execution_stream(primitive::host_stream& s) : primitive::host_backed_stream(s) {}
  /// Owns a new host stream with `options` (a thread of its own).
  explicit host_execution_stream(primitive::host_stream_options options) : primitive::host_backed_stream(options) {}
  /// Owns a new host stream run by the thread that enqueues (primitive::on_caller_thread): the
  /// host path's compute stream, whose work is the trainer's own code.
  explicit host_execution_stream(primitive::on_caller_thread_t)
      : primitive::host_backed_stream(std::make_unique<primitive::host_stream>(primitive::on_caller_thread)) {}
  /// Owns `s` (not null).
  explicit host_execution_stream(std::unique_ptr<primitive::host_stream> s)
      : primitive::host_backed_stream(std::move(s)) {}

  ringzero::memory_space communicator_space() const noexcept override { return ringzero::memory_space::host; }
  /// A host stream that runs on `comm`'s progress thread: its collectives and the communicator's
  /// asynchronous operations (and the trainer's own calls on `comm`, queued behind) keep one
  /// issue order on one thread, as NCCL's work on one CUDA stream does.
  std::unique_ptr<execution_stream> make_communication_stream(communicator& comm,
                                                              primitive::host_stream_options options) const override {
    ringzero::detail::progress_engine* engine = &ringzero::detail::transport_of(comm).progress();
    return std::make_unique<host_execution_stream>(std::make_unique<primitive::host_stream>(
        [engine](std::function<void()> turn) { (void)engine->submit(std::move(turn)); }, options));
  }
  void wait_host_stream(const event& e) override { native().wait_event(native_event(e)); }
  void add_sum_of_squares(double* sum, const void* values, std::uint64_t count, dtype type) override {
    native().enqueue([=] { *sum += detail::sum_of_squares(values, count, type); });
  }
  void decide_step(step_scalars* s, double max_grad_norm, bool skip_nonfinite) override {
    native().enqueue([=] {
      launched(kernels::decide_step(primitive::kernels::host_launcher{}, s, max_grad_norm, skip_nonfinite),
               "the step's decision");
    });
  }
  void update_shard(const shard_update& u, const step_scalars* s) override {
    native().enqueue([u, s] {
      primitive::kernels::host_launcher sequential;
      sequential.sequential = true;  // one thread walks the shard in order (same result, CPU-friendly)
      launched(kernels::update_shard(sequential, u, s), "the optimizer update of a shard");
    });
  }
  void quantize_segments(const quantized_layout& l, const void* values, dtype type, void* out) override {
    native().enqueue([=] {
      launched(kernels::host_quantize_segments(l, values, type, out), "the quantization of a collective's input");
    });
  }
  void dequantize_segments(const quantized_layout& l, const void* in, void* values, dtype type, bool average,
                           std::uint32_t own, const void* own_values) override {
    native().enqueue([=] {
      launched(kernels::host_dequantize_segments(l, in, values, type, average, own, own_values),
               "the dequantization of a collective's result");
    });
  }
  void collective(std::function<void()> issue) override { native().enqueue(std::move(issue)); }

 private:
  static void launched(int code, const char* what) {
    if (code != primitive::kernels::launch_success)
      throw error(errc::invalid_argument, std::string("zero: ") + what +
                                              " on the host stream: the kernel refused its arguments (code " +
                                              std::to_string(code) + ")");
  }
};

/// What a trainer hands `sharded_model` to run its device path: the compute stream on which it
/// enqueues forward and backward (borrowed; it must outlive the model), and the options of the
/// communication stream the runtime creates for the host kind (test knobs: pause, delay).
struct device_context {
  execution_stream* compute = nullptr;
  primitive::host_stream_options communication{};
};

}  // namespace ringzero::zero
