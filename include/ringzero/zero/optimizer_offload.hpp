#pragma once
/// @file
/// `zero::detail::optimizer_offload`: what `sharded_model` holds for offload::optimizer and
/// offload::parameters on the device path (zero/offload.hpp): per trainable flat buffer, two
/// zeroed transfer buffers in host memory (the rank's gradient shard, copied in from the device,
/// and its parameter shard, which the CPU update writes and which is copied back; none with
/// offload::parameters, whose shards are host memory already), two events per buffer that pipeline the
/// copies with the CPU update, the step's decision copied to host memory, and the offload stream
/// on which the CPU update runs (a host stream: a thread of its own, whatever the compute
/// stream's kind). Host memory is the compute stream's `offload_space()`: pinned host memory
/// beside a CUDA stream, plain host memory on the host stream. Errors: as
/// `primitive::memory_buffer::allocate`. Thread semantics: used by the rank's thread; the buffers
/// are touched only by stream work. The manual: docs/zero.md, "CPU offload".

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/zero/execution_stream.hpp"
#include "ringzero/zero/host_buffer.hpp"
#include "ringzero/zero/shard_plan.hpp"

namespace ringzero::zero::detail {

/// See the file comment.
struct optimizer_offload {
  /// A zeroed host buffer of `bytes` in `space` (host or pinned_host: both host-addressable),
  /// counted in `counter` when given.
  static host_buffer allocate(primitive::memory_space space, std::uint64_t bytes,
                              primitive::memory_counter* counter = nullptr) {
    host_buffer b(primitive::memory_buffer::allocate(space, static_cast<std::size_t>(bytes), -1,
                                                     primitive::host_alignment, counter));
    if (bytes != 0) std::memset(b.data(), 0, static_cast<std::size_t>(bytes));
    return b;
  }

  /// The offload stream (a host stream with `options`, as the communication stream's) and the
  /// events of `plan`: those the communication stream records of `compute`'s kind, those the
  /// offload stream records of the host kind. Host memory is `compute.offload_space()`.
  /// Allocates no buffers yet.
  optimizer_offload(const shard_plan& plan, const execution_stream& compute, primitive::host_stream_options options)
      : space(compute.offload_space()), stream(std::make_unique<host_execution_stream>(options)) {
    for (std::size_t b = 0; b < plan.buffers().size(); ++b) {
      copied_in.push_back(compute.make_event());
      updated.push_back(stream->make_event());
    }
    started = compute.make_event();
    finished = stream->make_event();
  }

  /// The transfer buffers of every trainable buffer of `plan` (none with offload::parameters):
  /// the range the rank's optimizer updates (its shard; the whole buffer at stage 0), zeroed,
  /// counted in `counter` when given; the step's decision in `scratch` when given.
  void allocate_buffers(const shard_plan& plan, primitive::memory_counter* counter = nullptr,
                        primitive::memory_counter* scratch = nullptr) {
    const auto& buffers = plan.buffers();
    gradients.resize(buffers.size());
    parameters.resize(buffers.size());
    for (std::size_t b = 0; b < buffers.size(); ++b) {
      const flat_buffer& f = buffers[b];
      if (!f.trainable || plan.request().offload == offload::parameters) continue;
      const std::uint64_t own = plan.stage() == 0 ? f.numel : f.shard_numel;
      gradients[b] = allocate(space, own * dtype_size(f.gradient_type), counter);
      parameters[b] = allocate(space, own * dtype_size(f.type), counter);
    }
    decided = allocate(space, sizeof(step_scalars), scratch);
  }

  /// Bytes of the transfer buffers (in `space`; `decided`, not model state, is not counted).
  std::uint64_t bytes() const noexcept {
    std::uint64_t n = 0;
    for (const host_buffer& b : gradients) n += b.bytes();
    for (const host_buffer& b : parameters) n += b.bytes();
    return n;
  }

  primitive::memory_space space;  ///< where the offloaded state and the transfer buffers live
  /// Per buffer: the rank's gradient shard (gradient dtype); empty with offload::parameters.
  std::vector<host_buffer> gradients;
  /// Per buffer: the rank's parameter shard (parameter dtype); empty with offload::parameters.
  std::vector<host_buffer> parameters;
  host_buffer decided;                                              ///< the step's step_scalars, copied in for the CPU
  std::vector<std::unique_ptr<execution_stream::event>> copied_in;  ///< per buffer, on the communication stream
  std::vector<std::unique_ptr<execution_stream::event>> updated;    ///< per buffer, on the offload stream
  std::unique_ptr<execution_stream::event> started;   ///< the decision is in `decided` (communication stream)
  std::unique_ptr<execution_stream::event> finished;  ///< the CPU's step is done (offload stream)
  /// Declared last: drained and destroyed before the buffers its work uses.
  std::unique_ptr<execution_stream> stream;
};

/// What offload `o` moves to host memory, for messages: "the optimizer (offload::optimizer)".
inline std::string offload_what(offload o) {
  return std::string(o == offload::parameters ? "the parameters, gradients and optimizer" : "the optimizer") +
         " (offload::" + std::string(offload_name(o)) + ")";
}

/// Why the device path cannot offload `o` beside compute stream `s` ("" when it can): pinned
/// host memory needs the registered CUDA table with its pinned allocation.
inline std::string offload_problem(const execution_stream& s, offload o) {
  if (s.offload_space() == primitive::memory_space::pinned_host) {
    const primitive::device_primitives* p = primitive::registered_device_primitives();
    if (p == nullptr || p->allocate_pinned == nullptr)
      return "the plan offloads " + offload_what(o) + " beside a " + s.kind() +
             ", which needs pinned host memory, but this program has no CUDA table with pinned allocation "
             "registered: expected a program that includes ringzero/cuda.cuh, or offload::none";
  }
  return {};
}

}  // namespace ringzero::zero::detail
