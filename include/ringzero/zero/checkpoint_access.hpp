#pragma once
/// @file
/// `zero::checkpoint_access`: what checkpoint/ needs of a `sharded_model` beyond its training
/// interface: where this rank's part of each flat buffer lies, the bytes of its held
/// parameters, the writable optimizer and loss scaler, and the restore protocol
/// (`begin_restore`, then writes or `exchange_state`). Checkpoint code uses this adapter; the
/// model's public interface stays the trainer's. The pointers are host memory on the host path;
/// on the device path (`through_stream()`) they are the compute stream's memory (a GPU's, or the
/// simulated device's; with offload the optimizer's state, and with offload::parameters the
/// parameter shards too, are pinned host memory), which checkpoint/ reaches only with
/// `copy_to_host` / `copy_from_host`.
/// Thread semantics: the model's (its rank's thread, between steps). Included by
/// zero/sharded_model.hpp at its end.

#include <cstddef>
#include <utility>
#include <vector>

#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::zero {

/// See the file comment. Holds a reference: the model must outlive it.
class checkpoint_access {
 public:
  explicit checkpoint_access(sharded_model& model) noexcept : m_(model) {}

  /// The range of buffer b whose master weights and optimizer states this rank holds (and
  /// whose parameters its optimizer updates): the whole buffer at stage 0, its shard otherwise.
  algorithms::range optimizer_range(std::size_t b) const { return m_.owned_range(b); }
  /// The range of buffer b whose parameters this rank stores: the whole buffer at stages 0-2
  /// and for a replicated frozen buffer at stage 3 (`shard_plan::holds_whole`), else its shard.
  algorithms::range held_range(std::size_t b) const {
    return m_.plan_.holds_whole(b) ? algorithms::range{0, m_.plan_.buffers().at(b).numel} : m_.owned_range(b);
  }
  /// The bytes of `held_range(b)` (the buffer's dtype).
  unsigned char* held_parameters(std::size_t b) { return m_.params_.at(b).data(); }
  /// Stage 3: the gathered copy of buffer b (all `numel` elements) while its unit is held (a
  /// unit kept by reshard_after_forward after an evaluation pass, a prefetch no use took), read
  /// through `copy_to_host`; nullptr when not held, for a buffer held whole, and at stages 0-2.
  const unsigned char* gathered_parameters(std::size_t b) {
    const flat_buffer& f = m_.plan_.buffers().at(b);
    if (m_.plan_.holds_whole(b) || f.shard_numel == 0 || !m_.gathers_.held(f.unit)) return nullptr;
    return m_.gathered_copy(f.unit, f);
  }
  /// The optimizer, writable: master weights, states and the step count, for restoring a
  /// checkpoint after `begin_restore()`.
  sharded_optimizer& optimizer() noexcept { return *m_.optimizer_; }
  /// The loss scaler, writable (a checkpoint restores its scale and good-step count).
  loss_scaler& scaler() noexcept { return m_.scaler_; }

  /// Copies `bytes` bytes of the model's memory at `src` (from `held_parameters`, the
  /// optimizer's master weights or states) into host memory `dst`, on the runtime's stream after
  /// the compute stream's work enqueued so far; done when `synchronize()` returns. Throws
  /// errc::invalid_argument (naming this rank) unless `between_steps()`. Local.
  void copy_to_host(void* dst, const void* src, std::uint64_t bytes) {
    if (!m_.between_steps()) m_.raise("the model's state can only be read between steps");
    m_.comm_waits_for_compute();
    m_.comm_stream_->copy(dst, src, bytes);
  }
  /// Copies `bytes` bytes of host memory `src` into the model's memory at `dst` (within
  /// `held_parameters` or the optimizer's master weights or states), on the runtime's stream;
  /// done when `synchronize()` returns. Call after `begin_restore()`. Local.
  void copy_from_host(void* dst, const void* src, std::uint64_t bytes) { m_.comm_stream_->copy(dst, src, bytes); }
  /// True on the device path (a `device_context`: CUDA memory, or host memory behind the
  /// simulated device's stream): checkpoint/ then reads and writes the model's state only through
  /// `copy_to_host` / `copy_from_host`, never directly and never by exchanging buffers, so the
  /// simulated device runs the code a GPU runs.
  bool through_stream() const noexcept { return m_.own_compute_ == nullptr; }
  /// True when the held parameters are the trainer's memory (`adopt_parameters`): a load then
  /// copies into them (`exchange_state` would put other memory in their place).
  bool parameters_adopted() const noexcept {
    for (const auto& b : m_.params_)
      if (b.borrowed()) return true;
    return false;
  }
  /// Waits for the copies of `copy_to_host` (the runtime's stream); rethrows its error.
  void synchronize() { m_.synchronize(); }
  /// As `synchronize`, dropping any error (before the copies' destination is freed on an error).
  void synchronize_quietly() noexcept { m_.comm_stream_->synchronize_quietly(); }

  /// Before a checkpoint overwrites the state: releases every stage-3 gather (they would show
  /// the old parameters), zeroes the gradients after the compute stream's work so far, and waits. Throws
  /// errc::invalid_argument (naming this rank) unless `between_steps()`. Local.
  void begin_restore() {
    if (!m_.between_steps())
      m_.raise("a checkpoint can only be restored between steps (after step(), before the next micro-batch)");
    if (m_.plan_.stage() == 3) {
      sharded_model::gather_hooks h{m_};
      m_.gathers_.release_all(h);
    }
    m_.comm_waits_for_compute();  // the trainer's reads of the old state come first
    m_.zero_gradients();
    m_.synchronize();
  }

  /// For a load that fills a second copy of the state and then makes it live without copying
  /// (checkpoint/zero_state.hpp): exchanges the held parameters (one block per buffer, of
  /// `held_parameters`' size) and the optimizer (master weights, states, step count) with `held`
  /// and `spare`, which then hold the previous ones. `spare` must be built from the model's
  /// plan, this rank's shard and `optimizer().options()`; the live optimizer keeps its learning
  /// rate. Call after `begin_restore()`. Throws errc::invalid_argument (naming this rank,
  /// nothing exchanged) when a size or the optimizer's kind differs, on the device path, and when
  /// the parameters are the trainer's memory (`parameters_adopted`). O(buffers). Local.
  void exchange_state(std::vector<detail::host_buffer>& held, sharded_optimizer& spare) {
    sharded_optimizer& live = *m_.optimizer_;
    auto& params = m_.params_;
    bool fits = !through_stream() && !parameters_adopted() && held.size() == params.size() &&
                spare.options().kind == live.options().kind;
    for (std::size_t b = 0; fits && b < params.size(); ++b) {
      fits = held[b].bytes() == params[b].bytes() && spare.owned_range(b).begin == optimizer_range(b).begin &&
             spare.owned_range(b).end == optimizer_range(b).end &&
             (spare.master(b) == nullptr) == (live.master(b) == nullptr);
      for (int k = 0; fits && k < live.options().state_count(); ++k)
        fits = (spare.state(b, k) == nullptr) == (live.state(b, k) == nullptr);
    }
    if (!fits)
      m_.raise(through_stream()       ? "exchange_state: the device path's state is written with copy_from_host"
               : parameters_adopted() ? "exchange_state: the parameters are the trainer's memory (adopt_parameters)"
                                      : "exchange_state: the spare state does not have this rank's layout");
    const double lr = live.options().lr;
    params.swap(held);
    std::swap(live, spare);
    live.set_learning_rate(lr);  // valid: it was this optimizer's rate
  }

 private:
  sharded_model& m_;
};

}  // namespace ringzero::zero
