#pragma once
/// @file
/// The trainer's memory as a `zero::sharded_model`'s parameter storage: `adoption_layout` says
/// where every flat buffer and parameter of a plan lies in one block of memory (bytes, alignment,
/// offsets), and `adopt_parameters` makes such a block the model's parameters, in place. A
/// trainer that keeps its parameters in one buffer of its own (llm.c's `params_memory`) computes
/// with them where they are, and the runtime updates them there, as PyTorch DDP's optimizer
/// updates the module's own parameters. Stages 0-2, where every rank holds the whole
/// parameters. At every stage, `set_parameters_async` and `read_parameters_async` copy the whole
/// model from and into such a block (at stage 3 the rank's shards; FSDP2's `fully_shard`
/// takes a module's parameters that way). Included by zero/sharded_model.hpp at its end. The manual: docs/zero.md, "The
/// trainer's memory".

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::zero {

/// Where the parameters of a plan lie in memory handed to `adopt_parameters`: every flat buffer
/// whole (its padding included), in buffer order, each at a multiple of `alignment` bytes;
/// parameter p's `plan.placements()[p].numel` elements of its dtype lie contiguously at
/// `parameter_offset[p]` bytes (a tied alias: at its storage's). Pure values.
struct adoption_layout {
  std::uint64_t alignment = 0;                  ///< bytes: the memory and each buffer start at a multiple of it
  std::uint64_t bytes = 0;                      ///< the memory's size in bytes
  std::vector<std::uint64_t> buffer_offset;     ///< per flat buffer: bytes from the start
  std::vector<std::uint64_t> parameter_offset;  ///< per parameter: bytes from the start
};

/// The layout of `plan`'s parameters for `adopt_parameters`. The alignment is the plan's
/// `alignment_bytes`, at least 64 (a cache line). Defined at every stage (at stage 3 it is the
/// whole model, which a rank holds only for frozen buffers kept whole: `adopt_parameters` refuses
/// stage 3, `set_parameters_async` and `read_parameters_async` take it there). Pure.
inline adoption_layout layout_for_adoption(const shard_plan& plan) {
  adoption_layout l;
  l.alignment = std::max<std::uint64_t>(plan.request().alignment_bytes, 64);
  for (const flat_buffer& f : plan.buffers()) {
    l.bytes = (l.bytes + l.alignment - 1) / l.alignment * l.alignment;
    l.buffer_offset.push_back(l.bytes);
    l.bytes += f.numel * dtype_size(f.type);
  }
  for (const parameter_placement& pl : plan.placements())
    l.parameter_offset.push_back(l.buffer_offset[pl.buffer] + pl.offset * dtype_size(pl.type));
  return l;
}

/// What `adopt_parameters` does with the values.
enum class adopted_values : std::uint8_t {
  /// The memory holds the parameters, laid out by `layout_for_adoption` and the same on every
  /// rank (as `set_parameter`'s values): they become the model's; master weights are set to them
  /// widened to float32, and the padding of each flat buffer (before, between and after its
  /// parameters) is set to zero.
  from_memory = 0,
  /// The model's current parameters (and their padding) are copied into the memory.
  from_model = 1,
};

/// What `adopt_parameters` needs of the model. Not for trainers.
class adoption_access {
 public:
  static void adopt(sharded_model& m, void* memory, std::uint64_t bytes, adopted_values values) {
    const shard_plan& plan = m.plan_;
    if (plan.stage() == 3)
      m.raise(
          "adopt_parameters at stage 3: a rank holds only its shard of the parameters, and the whole ones "
          "only while their unit is gathered (parameter<T>(p) between pre_forward and post_forward), so the "
          "trainer's memory cannot stay their storage; set_parameters_async(model, memory, bytes) takes its "
          "values (FSDP2's fully_shard), read_parameters_async gathers them back into it");
    const adoption_layout l = checked_layout(m, memory, bytes, "adopt_parameters");
    auto* base = static_cast<unsigned char*>(memory);
    std::vector<detail::host_buffer> views;
    m.comm_waits_for_compute();  // after the trainer's work so far, on either side
    for (std::size_t b = 0; b < plan.buffers().size(); ++b) {
      const flat_buffer& f = plan.buffers()[b];
      const std::uint64_t es = dtype_size(f.type);
      views.push_back(detail::host_buffer::borrow(base + l.buffer_offset[b], f.numel * es, m.compute_->space(),
                                                  m.compute_->device()));
      unsigned char* view = views.back().data();
      if (f.numel == 0) continue;
      if (values == adopted_values::from_model) {
        m.comm_stream_->copy(view, m.params_[b].data(), f.numel * es);
        continue;
      }
      zero_padding(*m.comm_stream_, plan, f, view);
      const algorithms::range own = m.owned_range(b);
      if (float* master = f.trainable ? m.optimizer_->master(b) : nullptr; master != nullptr && own.end > own.begin)
        m.comm_stream_->cast(master, dtype::float32, view + own.begin * es, f.type, own.end - own.begin);
    }
    m.comm_stream_->synchronize();  // the copies from the model's own memory are done; rethrows their error
    m.params_.swap(views);          // the model's own parameter memory goes with `views`
    m.compute_waits_for_comm();
  }

  static void set_all(sharded_model& m, const void* memory, std::uint64_t bytes) {
    const shard_plan& plan = m.plan_;
    const adoption_layout l = checked_layout(m, memory, bytes, "set_parameters_async");
    const auto* base = static_cast<const unsigned char*>(memory);
    if (plan.stage() == 3) {
      // Units gathered now (kept after an evaluation pass, prefetched) would show the old
      // values, or under quantized gathers values the next gather would not compute: released,
      // as a step releases them, so the next pre_forward gathers the new shards.
      sharded_model::gather_hooks h{m};
      m.gathers_.release_all(h);
    }
    // Each storage once (an alias lies at its storage's offset); write_parameter keeps what the
    // rank holds (its shard at stage 3, else all), the masters and any gathered copy.
    for (std::size_t p = 0; p < plan.placements().size(); ++p)
      if (!plan.placements()[p].alias && plan.placements()[p].numel > 0)
        m.write_parameter(p, base + l.parameter_offset[p], nullptr);
    m.compute_waits_for_comm();
  }

  static void read_all(sharded_model& m, void* memory, std::uint64_t bytes) {
    const shard_plan& plan = m.plan_;
    // At stage 3 the read gathers: a rank whose arguments are refused tells the others, which
    // would otherwise wait in the all_gather until the communicator's timeout.
    bool gathers = false;
    for (std::size_t b = 0; b < plan.buffers().size(); ++b)
      gathers = gathers || (plan.buffers()[b].numel > 0 && !plan.holds_whole(b));
    std::exception_ptr refused;
    adoption_layout l;
    try {
      l = checked_layout(m, memory, bytes, "read_parameters_async");
    } catch (const error&) {
      if (!gathers) throw;
      refused = std::current_exception();
    }
    if (gathers && m.comm_.world_size() > 1) {
      try {
        m.synchronize();  // the communication stream is idle: the exchange runs on this thread
      } catch (const error&) {
        if (!refused) refused = std::current_exception();  // an earlier failure: this rank refuses
      }
      m.agreement().agree_on_arguments(refused != nullptr, "read_parameters_async");
    }
    if (refused) std::rethrow_exception(refused);
    auto* base = static_cast<unsigned char*>(memory);
    // Buffer by buffer, padding included (zeros): one gather per sharded buffer at stage 3.
    for (std::size_t b = 0; b < plan.buffers().size(); ++b)
      if (plan.buffers()[b].numel > 0) m.copy_buffer_out(b, 0, plan.buffers()[b].numel, base + l.buffer_offset[b]);
    m.compute_waits_for_comm();
  }

 private:
  /// The layout, after the checks every call on trainer memory makes (between steps; memory
  /// not null, large enough, aligned, in the compute stream's space); `call` names the caller.
  static adoption_layout checked_layout(sharded_model& m, const void* memory, std::uint64_t bytes,
                                        const std::string& call) {
    if (!m.between_steps())
      m.raise(call +
              " in the middle of a step: call it between steps (after step(), before the next "
              "micro-batch)");
    adoption_layout l = layout_for_adoption(m.plan_);
    if (memory == nullptr && l.bytes > 0) m.raise(call + ": a null pointer for " + std::to_string(l.bytes) + " bytes");
    if (bytes < l.bytes)
      m.raise(call + ": the memory has " + std::to_string(bytes) + " bytes, the plan's layout needs " +
              std::to_string(l.bytes) + " (layout_for_adoption(plan).bytes)");
    const auto at = reinterpret_cast<std::uintptr_t>(memory);
    if (at % l.alignment != 0)
      m.raise(call + ": the memory at " + hex(at) + " is not aligned to " + std::to_string(l.alignment) +
              " bytes (layout_for_adoption(plan).alignment)");
    m.check_trainer_memory(memory, l.bytes, "the memory given to " + call);  // the compute stream's space
    for (const detail::host_buffer& held : m.params_) {
      const auto from = reinterpret_cast<std::uintptr_t>(held.data());
      if (held.bytes() > 0 && from < at + l.bytes && at < from + held.bytes())
        m.raise(call + ": the memory at " + hex(at) + " overlaps the model's parameter storage at " + hex(from) +
                " (memory adopted already, or the model's own)");
    }
    return l;
  }

  /// Zeroes flat buffer `f`'s padding in `view` (its elements before, between and after its
  /// parameters), on `stream`.
  static void zero_padding(execution_stream& stream, const shard_plan& plan, const flat_buffer& f,
                           unsigned char* view) {
    const std::uint64_t es = dtype_size(f.type);
    std::uint64_t end = 0;  // the end of the parameters so far, in elements
    for (std::size_t p : f.parameters) {
      const parameter_placement& pl = plan.placements()[p];
      if (pl.numel == 0) continue;
      if (pl.offset > end) stream.fill(view + end * es, pl.offset - end, f.type, 0.0);
      end = std::max(end, pl.offset + pl.numel);
    }
    if (f.numel > end) stream.fill(view + end * es, f.numel - end, f.type, 0.0);
  }

  static std::string hex(std::uintptr_t a) {
    char text[2 + 2 * sizeof a + 1];
    std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(a));
    return text;
  }
};

/// Makes `memory` `model`'s parameter storage: parameter p then lives at `memory` +
/// `layout_for_adoption(model.plan()).parameter_offset[p]` (`model.parameter<T>(p)` points
/// there), the step updates it in place, checkpoint loads write into it, and the model's own
/// parameter memory is freed. `memory`: at least `layout.bytes` bytes, aligned to
/// `layout.alignment`, in the compute stream's memory space (host memory on the host path, the
/// device's on the device path), outliving the model; the runtime does not count it in
/// `memory_allocated`. `values`: see `adopted_values`. Call between steps (a forward pass without
/// a backward counts as between steps), at stages 0-2; every rank calls it, each with memory of
/// its own (not shared with another rank or model: not detected), before the next step.
/// Ordered after the compute stream's work so far and before what it enqueues next; returns when
/// the copies are done.
/// Throws errc::invalid_argument, naming the rank and what was expected, at stage 3, in the
/// middle of a step, for a null, too small or misaligned `memory`, and for memory that overlaps
/// the model's current parameter storage; nothing is changed then. Not for `integration::
/// torch_zero`'s model, whose tensors are views of the model's own memory.
inline void adopt_parameters(sharded_model& model, void* memory, std::uint64_t bytes,
                             adopted_values values = adopted_values::from_memory) {
  adoption_access::adopt(model, memory, bytes, values);
}

/// Sets every parameter of `model` (and its master weights, widened to float32) from `memory`,
/// laid out by `layout_for_adoption(model.plan())` as for `adopt_parameters` (its padding is not
/// read), with no host round trip: the whole-model `set_parameter_async`. At every stage; at
/// stage 3 each rank keeps only its shard, as FSDP2's `fully_shard` shards a module's
/// initialized parameters, and the gathered parameters are then at `parameter<T>(p)` between
/// pre_forward and post_forward (units gathered at the time of the call are released, as a step
/// releases them). The memory is not kept: once the compute stream has run the work enqueued
/// after the call began (e.g. after synchronizing the compute stream) it may be changed or
/// freed. `memory`: at least `layout.bytes` bytes,
/// aligned to `layout.alignment`, in the compute stream's space, the same values on every rank.
/// Local. Call between steps. Ordered after the compute stream's work so far and before what it
/// enqueues next; `memory` must stay unchanged until then (cudaMemcpyAsync's contract); errors of
/// the copies surface at the next wait. Throws errc::invalid_argument, naming the rank and what
/// was expected, in the middle of a step and for memory that is null, too small, misaligned,
/// overlapping the model's parameter storage or (where the program's CUDA table can tell) not in
/// the compute stream's space; nothing is changed then.
inline void set_parameters_async(sharded_model& model, const void* memory, std::uint64_t bytes) {
  adoption_access::set_all(model, memory, bytes);
}

/// Copies every parameter of `model` into `memory`, laid out by `layout_for_adoption`, each flat
/// buffer whole (its padding, zeros, included), with no host round trip: the whole-model
/// `read_parameter_async`. At stage 3 a collective (every rank calls it, in the same order as
/// its other collectives) that gathers each sharded buffer once. The compute stream's work
/// enqueued after the call sees the values. Preconditions and errors as
/// `set_parameters_async`; `memory` is written, not kept. At stage 3 the ranks exchange whether
/// their arguments passed before gathering (waiting for the communication stream's work so
/// far): a refusal on one rank makes the others throw errc::invalid_argument naming it.
inline void read_parameters_async(sharded_model& model, void* memory, std::uint64_t bytes) {
  adoption_access::read_all(model, memory, bytes);
}

}  // namespace ringzero::zero
