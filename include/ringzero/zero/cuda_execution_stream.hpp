#pragma once
/// @file
/// `zero::cuda_execution_stream`: the CUDA implementation of `zero::execution_stream`, a
/// `primitive::cuda_backed_stream` (events, memory operations; host work refused) plus the step's
/// operations. Memory operations run the registered CUDA kernels;
/// collectives are issued on the caller's thread and enqueued by the communicator on its own
/// stream, which is the runtime's communication stream; the step's operations run the kernels
/// of zero/optimizer_kernels.cuh (registered by <ringzero/cuda.cuh>; errc::unsupported without
/// them), the sum of squares through 256 float64 partials of device memory this stream owns
/// (allocated at its first use). `wait_host_stream` (CPU offload's copy back after the CPU
/// update) enqueues a host function (cudaLaunchHostFunc) that blocks until the host event's point;
/// an error there is kept and rethrown by `synchronize`. CUDA errors: errc::backend_failure.
/// Needs cudart (RINGZERO_HAS_CUDA=1). Thread safety: as CUDA's streams and events.

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "ringzero/primitive/cuda_backed_stream.hpp"
#include "ringzero/primitive/cuda_stream.hpp"
#include "ringzero/primitive/cudart/stream.hpp"
#include "ringzero/primitive/host_stream.hpp"
#include "ringzero/primitive/memory_space.hpp"
#include "ringzero/zero/execution_stream.hpp"
#include "ringzero/zero/optimizer_kernels.hpp"

namespace ringzero::zero {

/// See the file comment.
class cuda_execution_stream final : public execution_stream, public primitive::cuda_backed_stream {
 public:
  /// Borrows `s` (which must outlive this object).
  explicit cuda_execution_stream(primitive::cuda_stream& s) : primitive::cuda_backed_stream(s), stream_(&s) {}
  /// Owns `s` (the communication stream: the communicator's stream, borrowed from it).
  explicit cuda_execution_stream(std::unique_ptr<primitive::cuda_stream> s)
      : primitive::cuda_backed_stream(std::move(s)), stream_(&native()) {}

  ringzero::memory_space communicator_space() const noexcept override { return ringzero::memory_space::cuda; }
  std::unique_ptr<execution_stream> make_communication_stream(communicator& comm,
                                                              primitive::host_stream_options) const override {
    auto borrowed = std::make_unique<primitive::cuda_stream>(
        primitive::cuda_stream::borrow(static_cast<cudaStream_t>(comm.cuda_stream()), comm.cuda_device()));
    return std::make_unique<cuda_execution_stream>(std::move(borrowed));
  }
  /// The host function holds this stream (and, as CUDA may run the host functions of all streams
  /// on one thread, possibly other streams' host functions) until the host stream's point: the
  /// alternative, cuStreamWaitValue32 on a pinned flag, needs the driver API and a device
  /// attribute (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS) that is not always enabled.
  void wait_host_stream(const event& e) override {
    primitive::host_event::point at = host_execution_stream::native_event(e).current_point();
    primitive::cudart::launch_host_function(stream_->get(), [at, failed = failed_] {
      try {
        at.synchronize();
      } catch (...) {
        std::lock_guard<std::mutex> lock(failed->mutex);
        if (!failed->error) failed->error = std::current_exception();
      }
    });
  }
  void synchronize() override {
    primitive::cuda_backed_stream::synchronize();
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(failed_->mutex);
      error = std::exchange(failed_->error, nullptr);
    }
    if (error) std::rethrow_exception(error);
  }
  void add_sum_of_squares(double* sum, const void* values, std::uint64_t count, dtype type) override {
    const optimizer_kernels& k = kernels_on_device();
    if (partials_.size_bytes() == 0)
      partials_ = primitive::memory_buffer::allocate(primitive::memory_space::device,
                                                     sum_of_squares_partials * sizeof(double), stream_->device());
    launched(k.add_sum_of_squares(sum, values, count, type, static_cast<double*>(partials_.data()), stream_->get()),
             "the gradient's sum of squares");
  }
  void decide_step(step_scalars* s, double max_grad_norm, bool skip_nonfinite) override {
    const optimizer_kernels& k = kernels_on_device();
    launched(k.decide_step(s, max_grad_norm, skip_nonfinite, stream_->get()), "the step's decision");
  }
  void update_shard(const shard_update& u, const step_scalars* s) override {
    const optimizer_kernels& k = kernels_on_device();
    launched(k.update_shard(u, s, stream_->get()), "the optimizer update of a shard");
  }
  void quantize_segments(const quantized_layout& l, const void* values, dtype type, void* out) override {
    const optimizer_kernels& k = kernels_on_device();
    launched(k.quantize_segments(l, values, type, out, stream_->get()), "the quantization of a collective's input");
  }
  void dequantize_segments(const quantized_layout& l, const void* in, void* values, dtype type, bool average,
                           std::uint32_t own, const void* own_values) override {
    const optimizer_kernels& k = kernels_on_device();
    launched(k.dequantize_segments(l, in, values, type, average, own, own_values, stream_->get()),
             "the dequantization of a collective's result");
  }
  void collective(std::function<void()> issue) override { issue(); }

 private:
  /// The registered kernels, the stream's device made current on the calling thread.
  const optimizer_kernels& kernels_on_device() const {
    const optimizer_kernels& k = require_optimizer_kernels();
    launched(primitive::require_device_primitives().set_device(stream_->device()), "cudaSetDevice");
    return k;
  }
  /// Throws errc::backend_failure for a failed launch (`code`, a cudaError_t).
  void launched(int code, const char* what) const {
    if (code == 0) return;
    const primitive::device_primitives& p = primitive::require_device_primitives();
    throw error(errc::backend_failure, std::string("zero::sharded_model on a CUDA stream: launching ") + what +
                                           " failed: " + p.error_name(code) + ": " + p.error_string(code));
  }
  /// The first error a host function of `wait_host_stream` met (shared with the functions in flight).
  struct failure {
    std::mutex mutex;
    std::exception_ptr error;
  };
  std::shared_ptr<failure> failed_ = std::make_shared<failure>();
  primitive::memory_buffer partials_;  ///< the sum of squares' scratch (device memory)
  primitive::cuda_stream* stream_;     ///< the wrapped stream (`native()`)
};

}  // namespace ringzero::zero
