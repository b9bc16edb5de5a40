#pragma once
/// @file
/// `zero::collective_hook`: replaces the sharded runtime's parameter all_gathers and gradient
/// reductions, and may choose the memory of its communication buffers (FSDP2's
/// `set_custom_all_gather` / `set_custom_reduce_scatter` with their allocator; the DDP reducer's
/// communication hooks, ddp/comm_hook.hpp, have the same shape). For compression the runtime
/// already has `plan_request::quantization`; a hook is for what the runtime does not know:
/// another transport, instrumentation, a vendor collective.
///
/// What is hooked, given in `sharded_model_options::collective_hook`: every all_gather of a
/// flat buffer's parameters (stage 3's gathers before forward and backward, stages 1-2's gather
/// after the update) and every reduction of a flat buffer's gradients (stage 0's all_reduce,
/// stages 1-3's reduce_scatter), each call one flat buffer, in the runtime's order. Not hooked:
/// the small agreement and norm collectives, hybrid sharding's replica average, and the
/// gathers of `read_parameter`, `read_parameters_async` and checkpoints (the runtime's own
/// all_gather). Refused (on every rank, at construction) with quantized communication or
/// reproducible mode, which replace the same collectives, with a hook that does not support the
/// memory space of the model's state, and when the ranks' hooks have different names.
///
/// Contract: every rank calls the same collectives on the communicator it is given, in the same
/// order (as any collective); each call leaves its result where the call says before it
/// returns (host memory) or in the order of the communicator's stream (CUDA: call the
/// communicator's own collectives, which enqueue there). Thread semantics: `all_gather` and
/// `reduce` are called one at a time, in stream order: on the host path on the shard
/// communicator's progress thread (not the trainer's), on CUDA on the trainer's thread as it
/// enqueues; `allocate` on the trainer's thread (construction, a pool that grows), possibly
/// while a collective call runs on the progress thread. Errors: an exception from
/// `all_gather` or `reduce` aborts the communicator (so the peers fail at once instead of
/// waiting) and is raised by the runtime call that waits for that collective, naming the hook,
/// the call and this rank; one from `allocate` fails the construction on every rank (naming it)
/// or the call that grew a pool.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/collective/all_gather.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/collective/reduce_scatter.hpp"
#include "ringzero/primitive/memory_space.hpp"

namespace ringzero::zero {

/// One all_gather of flat buffer `buffer`'s parameters (gather unit `unit`).
struct gather_call {
  std::size_t unit = 0;    ///< the plan's gather unit the buffer belongs to
  std::size_t buffer = 0;  ///< the plan's flat buffer (shard_plan::buffers()[buffer])
  /// This rank's shard: `shard_numel` elements of `type`; it may be this rank's own slot of
  /// `gathered` (stages 1-2 gather in place, as MPI_IN_PLACE does, and so does stage 3 with
  /// offload::parameters, after copying the shard there from host memory): read it before writing there.
  const void* shard = nullptr;
  void* gathered = nullptr;       ///< every rank's shard in rank order: world size x `shard_numel` elements
  std::uint64_t shard_numel = 0;  ///< elements per shard
  dtype type = dtype::float32;    ///< the parameters' element type
  collective_options options{};   ///< the runtime's tag (pass it on: contract errors then name the call)
};

/// One reduction of flat buffer `buffer`'s gradients (gather unit `unit`): the average over the
/// shard communicator's ranks of `gradients`, each rank's summed micro-batches.
struct reduction_call {
  std::size_t unit = 0;           ///< the plan's gather unit the buffer belongs to
  std::size_t buffer = 0;         ///< the plan's flat buffer
  void* gradients = nullptr;      ///< this rank's full gradients of the buffer: `numel` elements of `type`
  std::uint64_t numel = 0;        ///< elements of the buffer (world size x `shard_numel` at stages 1-3)
  std::uint64_t shard_numel = 0;  ///< elements per shard (stages 1-3)
  dtype type = dtype::float32;    ///< the gradients' element type
  bool all_reduce = false;        ///< stage 0: the average of the whole buffer, in place
  int shard_index = 0;            ///< else: the average of shard `shard_index` only, in place there
  collective_options options{};   ///< the runtime's tag
};

/// See the file comment. The defaults do what the runtime does without a hook.
class collective_hook {
 public:
  virtual ~collective_hook() = default;
  /// A short name; every rank's hook must have the same (checked at construction).
  virtual std::string name() const = 0;
  /// The all_gather of `call` on `comm` (the shard communicator).
  virtual void all_gather(communicator& comm, const gather_call& call) {
    ringzero::all_gather(comm, call.shard, call.gathered, call.shard_numel, call.type, call.options);
  }
  /// The reduction of `call` on `comm` (the shard communicator).
  virtual void reduce(communicator& comm, const reduction_call& call) {
    auto* g = static_cast<unsigned char*>(call.gradients);
    if (call.all_reduce) {
      ringzero::all_reduce(comm, g, g, call.numel, call.type, reduce_kind::avg, call.options);
      return;
    }
    unsigned char* own = g + static_cast<std::uint64_t>(call.shard_index) * call.shard_numel * dtype_size(call.type);
    ringzero::reduce_scatter(comm, g, own, call.shard_numel, call.type, reduce_kind::avg, call.options);
  }
  /// True when the hook handles buffers in `space` (asked at construction). Default: host only.
  virtual bool supports(primitive::memory_space space) const { return space == primitive::memory_space::host; }
  /// The memory of one communication buffer (a stage-3 gather buffer or a gradient bucket) of
  /// `bytes` in `space`, at least 64-byte aligned, or nullptr for the runtime's own allocation
  /// (the default). Called on the trainer's thread (construction, a pool that grows). The
  /// runtime zeroes it and gives it back through `deallocate` when the model is destroyed.
  virtual void* allocate(std::uint64_t bytes, primitive::memory_space space) {
    (void)bytes;
    (void)space;
    return nullptr;
  }
  /// Frees what `allocate` returned (`bytes`, `space` as asked). Must not throw.
  virtual void deallocate(void* data, std::uint64_t bytes, primitive::memory_space space) noexcept {
    (void)data;
    (void)bytes;
    (void)space;
  }
};

/// `hook.name()`, or what it threw ("<name() threw: ...>"): for messages and the ranks' check.
inline std::string hook_name(const collective_hook& hook) noexcept {
  try {
    try {
      return hook.name();
    } catch (const std::exception& e) { return std::string("<name() threw: ") + e.what() + ">"; } catch (...) {
      return "<name() threw>";
    }
  } catch (...) { return {}; }  // no memory for the text
}

}  // namespace ringzero::zero
