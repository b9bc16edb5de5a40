#pragma once
/// @file
/// The buffers of `zero::sharded_model`, defined out of the class: allocating the state a plan
/// lays out (agreed across ranks), the gather-slot and gradient-bucket pools with their events,
/// and launching and completing a unit's reduction on the communication stream. Included by
/// zero/sharded_model.hpp at its end; include that header, not this one.

#include "ringzero/collective/all_to_all.hpp"
#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::zero {

inline void sharded_model::allocate_everywhere() {
  std::string problem;
  try {
    allocate();
  } catch (const std::bad_alloc&) {
    problem = "cannot allocate the model state of this rank (std::bad_alloc)";
  } catch (const error& e) { problem = e.message(); }
  agreement().agree_on_allocation(problem);
}

template <element_type T>
std::span<T> sharded_model::gradient(std::size_t p) {
  const parameter_placement& pl = placement(p);
  if (!plan_.parameters()[p].trainable) raise("parameter '" + name(p) + "' is frozen: it has no gradient");
  const flat_buffer& f = plan_.buffers()[pl.buffer];
  check_type(dtype_of<T>, f.gradient_type, p, "gradient");
  micro_begun_ = true;
  if (pl.numel == 0) return {};
  const std::size_t w = storage_unit(p);
  const std::uint64_t gs = dtype_size(f.gradient_type);
  if (syncing()) {
    const auto phase = gradients_.state(w);
    if (phase == detail::gradient_schedule::phase::launched || phase == detail::gradient_schedule::phase::completed)
      raise("the gradient of '" + name(p) + "' was requested after the reduction of unit '" + plan_.units()[w].name +
            "' started in this micro-batch (request gradients before mark_ready / post_backward)");
  }
  if (!plan_.sharded_gradients())
    return {reinterpret_cast<T*>(grads_[pl.buffer].data() + pl.offset * gs), static_cast<std::size_t>(pl.numel)};
  gradient_hooks h{*this};
  gradients_.acquire(w, h);
  unsigned char* bucket = buckets_[unit_bucket_[w]].data();
  return {reinterpret_cast<T*>(bucket + f.gradient_offset + pl.offset * gs), static_cast<std::size_t>(pl.numel)};
}

inline void sharded_model::allocate() {
  const auto& buffers = plan_.buffers();
  const bool stage3 = plan_.stage() == 3, shard_grads = plan_.sharded_gradients();
  params_.reserve(buffers.size());
  grads_.reserve(buffers.size());
  // offload::parameters: the shards in host memory (a replicated frozen buffer stays whole on the device).
  const auto in = [this](bool host, std::uint64_t bytes, memory_category what) {
    return host ? detail::optimizer_offload::allocate(offload_->space, bytes, counter(what)) : make_buffer(bytes, what);
  };
  for (const flat_buffer& f : buffers) {
    const bool sharded = stage3 && !f.replicated;
    params_.emplace_back(in(sharded && parameters_offloaded(), (sharded ? f.shard_numel : f.numel) * dtype_size(f.type),
                            memory_category::parameters));
    grads_.emplace_back(in(parameters_offloaded(),
                           f.trainable ? (shard_grads ? f.shard_numel : f.numel) * dtype_size(f.gradient_type) : 0,
                           memory_category::gradients));
  }
  if (offload_) {  // master weights and states in host memory, with transfer buffers (attach made it)
    const primitive::memory_space space = offload_->space;
    optimizer_.emplace(plan_, shard_index_, options_.optimizer,
                       [this, space](std::uint64_t bytes, memory_category what) {
                         return detail::optimizer_offload::allocate(space, bytes, counter(what));
                       });
    offload_->allocate_buffers(plan_, counter(memory_category::communication_buffers),
                               counter(memory_category::scratch));
  } else {
    optimizer_.emplace(plan_, shard_index_, options_.optimizer,
                       [this](std::uint64_t bytes, memory_category what) { return make_buffer(bytes, what); });
  }
  if (options_.reproducible) reproducible_.emplace(plan_);
  scaler_ = loss_scaler(options_.loss_scaling);
  const std::size_t units = plan_.units().size();
  unit_gather_.assign(units, npos);
  unit_bucket_.assign(units, npos);
  marked_.assign(plan_.trainable_storages().size(), false);
  // The pools at the size the plan predicts for the canonical order, so that a rank short of
  // memory fails here (where allocate_everywhere tells every rank) rather than at its first
  // pre_forward or gradient; they grow only for a trainer that visits units in another order.
  const communication_buffers& cb = plan_.communication();
  for (std::uint64_t i = 0; i < cb.gather_buffers; ++i) {
    gathers_buffers_.emplace_back(make_buffer(cb.gather_buffer_bytes, memory_category::communication_buffers, true));
    gather_free_.push_back(gathers_buffers_.size() - 1);
  }
  for (std::uint64_t i = 0; i < cb.gradient_buckets; ++i) {
    buckets_.emplace_back(make_buffer(cb.gradient_bucket_bytes, memory_category::communication_buffers, true));
    bucket_free_.push_back(buckets_.size() - 1);
  }
  if (cb.quantization_bytes > 0)
    quantization_staging_ = make_buffer(cb.quantization_bytes, memory_category::communication_buffers);
  step_scalars_ = make_buffer(sizeof(step_scalars), memory_category::scratch);  // not model state
  for (std::size_t u = 0; u < units; ++u) gathered_.push_back(compute_->make_event());
  for (std::size_t i = 0; i < gathers_buffers_.size(); ++i) gather_slot_free_.push_back(compute_->make_event());
  for (std::size_t i = 0; i < buckets_.size(); ++i) bucket_free_event_.push_back(compute_->make_event());
  // The trainer's first writes (full gradients) come after the zeroing.
  comm_stream_->record(*comm_mark_);
  compute_->wait(*comm_mark_);
}

inline detail::host_buffer& sharded_model::grow(std::vector<detail::host_buffer>& pool, std::uint64_t bytes,
                                                const char* what) {
  try {
    return pool.emplace_back(make_buffer(bytes, memory_category::communication_buffers, true));
  } catch (const std::bad_alloc&) {
    ringzero::detail::raise(comm_, errc::internal,
                            "zero::sharded_model: cannot allocate another " + std::string(what) + " of " +
                                std::to_string(bytes) +
                                " bytes (beyond the plan's count: units visited out of order, or kept by "
                                "set_reshard_after_backward(false))");
  } catch (const error& e) {
    ringzero::detail::raise(
        comm_, e.kind(),
        "zero::sharded_model: another " + std::string(what) +
            " (beyond the plan's count: units visited out of order, or kept by set_reshard_after_backward(false)): " +
            e.message());
  }
}

inline std::size_t sharded_model::take_gather_slot() {
  if (!gather_free_.empty()) {
    const std::size_t s = gather_free_.back();
    gather_free_.pop_back();
    return s;
  }
  grow(gathers_buffers_, plan_.communication().gather_buffer_bytes, "gather buffer");
  gather_slot_free_.push_back(compute_->make_event());
  return gathers_buffers_.size() - 1;
}

inline void sharded_model::start_gather(std::size_t u) {
  const std::size_t slot = take_gather_slot();
  unit_gather_[u] = slot;
  try {
    execution_stream& s = *comm_stream_;
    s.wait(*gather_slot_free_[slot]);
    if (options_.time_gathers)
      timer_.time(s, 0, detail::gather_timer::kind::gather, [&] { enqueue_gather(u, slot); });
    else
      enqueue_gather(u, slot);
    s.record(*gathered_[u]);
  } catch (...) {  // nothing was started: the slot goes back (a failing hook aborted the communicator)
    gather_free_.push_back(slot);
    unit_gather_[u] = npos;
    throw;
  }
}

inline void sharded_model::pre(std::size_t u, bool forward) {
  check_unit(u);
  if (plan_.stage() != 3) return;
  gather_hooks h{*this};
  gathers_.use(u, h);
  if (forward && !in_backward_) {
    // A forward back at or before the unit the last one reached starts a new pass: what the
    // previous pass left for a backward that did not come (units kept by the policy, a
    // prefetch no use took: an evaluation, a generation step, a pass stopped early) is
    // released, after u took what it needs of it, so a pass holds no more than the plan.
    if (forward_at_ != npos && u <= forward_at_) gathers_.release_stale(h);
    forward_at_ = u;
  }
  if (!forward) in_backward_ = true;
  // A forward recomputed inside a backward prefetches nothing: the units after it are done.
  if (!forward || !in_backward_)
    for (std::size_t v : plan_.prefetch_after(u, forward)) gathers_.prefetch(v, h);
  gathers_.wait_for(u, h);
  // Passes without a step (evaluation) would keep intervals pending: add those reached.
  if (options_.time_gathers && timer_.pending() > 4096) timer_.collect(false);
}

inline void sharded_model::wait_gather(std::size_t u) {
  if (options_.time_gathers)
    timer_.time(*compute_, 1, detail::gather_timer::kind::wait, [&] { compute_->wait(*gathered_[u]); });
  else
    compute_->wait(*gathered_[u]);
}

inline gather_timing sharded_model::gather_times() {
  synchronize();
  timer_.collect(true);
  return timer_.totals();
}

inline void sharded_model::enqueue_gather(std::size_t u, std::size_t slot) {
  execution_stream& s = *comm_stream_;
  unsigned char* base = gathers_buffers_[slot].data();
  const communication_quantization& qz = plan_.request().quantization;
  for (std::size_t b : plan_.units()[u].buffers) {
    const flat_buffer& f = plan_.buffers()[b];
    if (f.shard_numel == 0 || f.replicated) continue;  // a replicated buffer is held whole
    const collective_options tag = tagged(call_purpose::gather, b);
    unsigned char* dst = base + f.gather_offset;
    unsigned char* src = gather_input(b, dst);  // offload::parameters: copied into place first
    if (qz.weights == quantized_bits::none) {
      if (options_.hook) {
        const gather_call call{u, b, src, dst, f.shard_numel, f.type, tag};
        s.collective([this, call] {
          run_hook("all_gather", call.unit, call.buffer, [&] { options_.hook->all_gather(comm_, call); });
        });
      } else {
        s.collective([this, src, dst, &f, tag] { all_gather(comm_, src, dst, f.shard_numel, f.type, tag); });
      }
      continue;
    }
    // Quantized (zero/quantization.hpp): the rank's segment in place in the staging buffer,
    // all_gathered as bytes, every segment (its own too) dequantized into the gather buffer.
    const quantized_layout l{qz.weights, qz.block_size, f.shard_numel, static_cast<std::uint32_t>(plan_.shards())};
    const std::uint64_t segment = l.segment_bytes();
    unsigned char* staged = quantization_staging_.data();
    unsigned char* mine = staged + static_cast<std::uint64_t>(shard_index_) * segment;
    s.quantize_segments(quantized_layout{l.bits, l.block_size, l.count, 1}, src, f.type, mine);
    s.collective([this, mine, staged, segment, tag] { all_gather(comm_, mine, staged, segment, dtype::uint8, tag); });
    s.dequantize_segments(l, staged, dst, f.type, false, 0, nullptr);
  }
}

inline void sharded_model::fill_bucket(std::size_t u) {
  if (!plan_.sharded_gradients()) return;
  std::size_t slot;
  if (!bucket_free_.empty()) {
    slot = bucket_free_.back();
    bucket_free_.pop_back();
  } else {
    grow(buckets_, plan_.communication().gradient_bucket_bytes, "gradient bucket");
    bucket_free_event_.push_back(compute_->make_event());
    slot = buckets_.size() - 1;
    // The new bucket is zeroed on the communication stream (make_buffer): the compute stream's
    // fill and the trainer's writes below come after that.
    comm_stream_->record(*bucket_free_event_[slot]);
  }
  unit_bucket_[u] = slot;
  // Zeroed on the compute stream, after the reduction that used the slot last.
  compute_->wait(*bucket_free_event_[slot]);
  compute_->fill(buckets_[slot].data(), plan_.units()[u].gradient_bytes, dtype::uint8, 0);
}

inline void sharded_model::launch_reduction(std::size_t u) {
  const int stage = plan_.stage();
  const bool full_gradients = !plan_.sharded_gradients();  // in grads_, else in the unit's bucket
  execution_stream& s = *comm_stream_;
  comm_waits_for_compute();  // the trainer's gradients are complete
  if (reproducible_) {       // deposit this micro-batch; the view of the next one starts at zero
    unsigned char* bucket = full_gradients ? nullptr : buckets_[unit_bucket_[u]].data();  // released before this runs
    s.host_work(
        [this, u, full_gradients, bucket] {
          for (std::size_t b : plan_.units()[u].buffers) {
            const flat_buffer& f = plan_.buffers()[b];
            if (!f.trainable || f.numel == 0) continue;
            unsigned char* full = full_gradients ? grads_[b].data() : bucket + f.gradient_offset;
            reproducible_->deposit(b, full);
            if (full_gradients) std::memset(full, 0, static_cast<std::size_t>(f.numel * dtype_size(f.gradient_type)));
          }
        },
        "reproducible mode's deposit of a micro-batch's gradients");
    return;
  }
  for (std::size_t b : plan_.units()[u].buffers) {
    const flat_buffer& f = plan_.buffers()[b];
    if (!f.trainable || f.numel == 0) continue;
    const std::uint64_t gs = dtype_size(f.gradient_type);
    const std::uint64_t own = static_cast<std::uint64_t>(shard_index_) * f.shard_numel * gs;
    unsigned char* full = full_gradients ? grads_[b].data() : buckets_[unit_bucket_[u]].data() + f.gradient_offset;
    const collective_options tag = tagged(call_purpose::reduce, b);
    if (const quantized_bits q = plan_.request().quantization.gradients; q != quantized_bits::none) {
      // Quantized (zero/quantization.hpp): every rank's segment quantized, an all_to_all, and
      // this rank's segment replaced by the float32 average of what it received and its own.
      const quantized_layout l{q, plan_.request().quantization.block_size, f.shard_numel,
                               static_cast<std::uint32_t>(plan_.shards())};
      unsigned char* send = quantization_staging_.data();
      unsigned char* recv = send + l.bytes();
      const std::uint64_t segment = l.segment_bytes();
      s.quantize_segments(l, full, f.gradient_type, send);
      s.collective([this, send, recv, segment, tag] { all_to_all(comm_, send, recv, segment, dtype::uint8, tag); });
      s.dequantize_segments(l, recv, full + own, f.gradient_type, true, static_cast<std::uint32_t>(shard_index_),
                            full + own);
      continue;
    }
    if (options_.hook) {
      const reduction_call call{u, b, full, f.numel, f.shard_numel, f.gradient_type, stage == 0, shard_index_, tag};
      s.collective(
          [this, call] { run_hook("reduction", call.unit, call.buffer, [&] { options_.hook->reduce(comm_, call); }); });
    } else if (stage == 0)
      s.collective(
          [this, full, &f, tag] { all_reduce(comm_, full, full, f.numel, f.gradient_type, reduce_kind::avg, tag); });
    else
      s.collective([this, full, own, &f, tag] {
        reduce_scatter(comm_, full, full + own, f.shard_numel, f.gradient_type, reduce_kind::avg, tag);
      });
  }
}

inline void sharded_model::complete_reduction(std::size_t u) {
  if (!plan_.sharded_gradients()) return;
  // Sharded gradients: the rank's reduced shard of the bucket is added to its gradient shard (in
  // float for 16-bit types; reproducible mode deposited the bucket instead), then the bucket
  // is free again for the compute stream once this work has run.
  if (!reproducible_) {
    unsigned char* bucket = buckets_[unit_bucket_[u]].data();
    for (std::size_t b : plan_.units()[u].buffers) {
      const flat_buffer& f = plan_.buffers()[b];
      if (!f.trainable || f.numel == 0) continue;
      const std::uint64_t gs = dtype_size(f.gradient_type);
      const unsigned char* src =
          bucket + f.gradient_offset + static_cast<std::uint64_t>(shard_index_) * f.shard_numel * gs;
      unsigned char* dst = grads_[b].data();
      primitive::reduce_spec sum;
      sum.type = f.gradient_type;
      sum.kind = reduce_kind::sum;
      comm_stream_->reduce(dst, dst, src, f.shard_numel, sum);
    }
  }
  comm_stream_->record(*bucket_free_event_[unit_bucket_[u]]);
  bucket_free_.push_back(unit_bucket_[u]);
  unit_bucket_[u] = npos;
}

inline memory_breakdown sharded_model::memory_in_use() const {
  memory_breakdown m;
  for (const auto& b : params_) m.parameters += b.bytes();
  for (const auto& b : grads_) m.gradients += b.bytes();
  m.master_weights = optimizer_->master_bytes();
  m.optimizer_states = optimizer_->state_bytes();
  for (const auto& b : gathers_buffers_) m.communication_buffers += b.bytes();
  for (const auto& b : buckets_) m.communication_buffers += b.bytes();
  m.communication_buffers += (offload_ ? offload_->bytes() : 0) + quantization_staging_.bytes();
  return m;
}

inline memory_breakdown sharded_model::memory_in_use(primitive::memory_space space) const {
  memory_breakdown m;
  const auto in = [space](const detail::host_buffer& b) { return b.space() == space ? b.bytes() : 0; };
  for (const auto& b : params_) m.parameters += in(b);
  for (const auto& b : grads_) m.gradients += in(b);
  m.master_weights = optimizer_->master_bytes(space);
  m.optimizer_states = optimizer_->state_bytes(space);
  for (const auto* pool : {&gathers_buffers_, &buckets_})
    for (const auto& b : *pool) m.communication_buffers += in(b);
  m.communication_buffers += (offload_ && offload_->space == space ? offload_->bytes() : 0) + in(quantization_staging_);
  return m;
}

template <class F>
void sharded_model::run_hook(const char* what, std::size_t unit, std::size_t buffer, F&& call) {
  try {
    call();
  } catch (...) {
    errc code = errc::internal;
    std::string why = "an exception that is not a std::exception", hook = "?";
    try {
      throw;
    } catch (const error& e) {
      if (e.kind() == errc::aborted) throw;  // a peer failed: its error says why, not this hook
      code = e.kind();
      why = e.what();
    } catch (const std::exception& e) { why = e.what(); } catch (...) {
    }
    hook = hook_name(*options_.hook);
    const std::string message = "zero::sharded_model: the collective hook '" + hook + "' failed in the " + what +
                                " of unit '" + plan_.units()[unit].name + "' (flat buffer " + std::to_string(buffer) +
                                "): " + why;
    ringzero::detail::transport_of(comm_).abort(message);  // the peers fail instead of waiting for this rank
    ringzero::detail::raise(comm_, code, message);
  }
}

}  // namespace ringzero::zero
