#pragma once
/// @file
/// Example 02's compute on the simulated device (--device sim): host_compute.hpp's MLP on the
/// runtime's device path over the asynchronous host stream, as CI runs it without a GPU
/// (docs/zero.md, "The device path"; docs/streams.md). The runtime gets a compute stream (a
/// `primitive::host_stream`, a thread of its own) and makes its own communication stream (and,
/// with --offload optimizer, its offload stream): its gathers, reductions, optimizer step and
/// copies run on those threads, ordered against the compute stream by events only. The MLP runs
/// on the trainer's thread; before each layer it waits for the compute stream
/// (`layer_stream`, the host twin of a CUDA trainer's kernels enqueued behind the runtime's
/// event waits), so a layer reads its parameters only after the gather the runtime ordered
/// before it. Threads: one object per rank.
#include <vector>

#include "host_compute.hpp"
#include "idx_dataset.hpp"
#include "ringzero/primitive/host_stream.hpp"
#include "ringzero/zero/execution_stream.hpp"

namespace ringzero::examples::zero_example {

/// See the file comment.
class sim_compute : public host_compute {
 public:
  /// As host_compute, with a compute stream of its own for the runtime's device path (which
  /// also converts the float32 copies of a bfloat16 runtime, in order with the runtime's work).
  sim_compute(const std::vector<int>& widths, const fashion_mnist& data, int max_rows, int eval_rows, copies_of copies)
      : host_compute(widths, data, max_rows, eval_rows, copies), execution_(stream_), context_{&execution_, {}} {
    convert_on(&execution_);
  }

  /// The compute stream the runtime keeps its state and orders its work against.
  zero::device_context* device_context() noexcept { return &context_; }
  /// The process heap also holds the streams' and the device path's bookkeeping: not measured.
  static constexpr bool heap_holds_state = false;
  /// The stream the trainer waits for before a layer computes on its thread: then everything
  /// the runtime enqueued on it so far (waits for its gathers, the zeroing of a bucket) has run.
  zero::execution_stream* layer_stream() noexcept { return &execution_; }

 private:
  primitive::host_stream stream_;
  zero::host_execution_stream execution_;
  zero::device_context context_;
};

}  // namespace ringzero::examples::zero_example
