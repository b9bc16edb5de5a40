#pragma once
/// @file
/// The streams of `zero::sharded_model`, defined out of the class: attaching a compute stream
/// (the `device_context`'s, or the host path's caller-thread stream) and making the
/// communication stream, allocating in the compute stream's memory space, setting and reading
/// parameters and the optimizer step as work on the communication stream (its operations:
/// zero/execution_stream.hpp). Included by zero/sharded_model.hpp at its end; include that
/// header, not this one. The manual: docs/zero.md, "One path: streams".

#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::zero {

inline sharded_model::planned sharded_model::plan_for(const communicator& comm, plan_request request,
                                                      const communicator* replica, const device_context* device) {
  request.world_size = comm.world_size() * (replica ? replica->world_size() : 1);
  request.replica_group_size = replica ? comm.world_size() : 0;
  if (!request.space && device != nullptr && device->compute != nullptr) request.space = device->compute->space();
  plan_request empty;
  empty.world_size = request.world_size;
  empty.replica_group_size = request.replica_group_size;
  try {
    return {shard_plan(std::move(request)), {}};
  } catch (const error& e) { return {shard_plan(std::move(empty)), "the planner refused the request: " + e.message()}; }
}

inline std::string sharded_model::attach(const device_context& device) {
  if (device.compute == nullptr)
    return "the device_context has no compute stream (device_context::compute is null): the device path needs the "
           "trainer's compute stream";
  const execution_stream& s = *device.compute;
  const auto space_name = [](ringzero::memory_space m) {
    return m == ringzero::memory_space::cuda ? "CUDA device" : "host";
  };
  for (const communicator* c : {static_cast<const communicator*>(&comm_), static_cast<const communicator*>(replica_)}) {
    if (c == nullptr) continue;
    const char* which = c == &comm_ ? "shard" : "replica";
    if (c->space() != s.communicator_space())
      return std::string("the compute stream is a ") + s.kind() + ", whose model state is " +
             space_name(s.communicator_space()) + " memory, but the " + which + " communicator (" +
             std::string(backend_name(c->backend())) + ") moves " + space_name(c->space()) + " memory: expected a " +
             space_name(s.communicator_space()) + "-memory communicator";
    if (c->space() == ringzero::memory_space::cuda && c->cuda_device() != s.device())
      return std::string("the compute stream is on CUDA device ") + std::to_string(s.device()) + " but the " + which +
             " communicator's rank uses CUDA device " + std::to_string(c->cuda_device()) +
             ": expected a compute stream on device " + std::to_string(c->cuda_device());
  }
  if (options_.reproducible && !s.runs_host_work())
    return std::string("reproducible mode deposits and sums on the host, and the compute stream is a ") + s.kind() +
           ", whose memory host code cannot touch: expected a host-memory compute stream (or reproducible = false)";
  const bool offloaded = plan_.request().offload != offload::none;
  if (offloaded) {
    std::string why = detail::offload_problem(s, plan_.request().offload);
    if (!why.empty()) return why;
  }
  compute_ = device.compute;
  comm_stream_ = s.make_communication_stream(comm_, device.communication);
  compute_mark_ = s.make_event();
  comm_mark_ = s.make_event();
  if (offloaded) offload_ = std::make_unique<detail::optimizer_offload>(plan_, s, device.communication);
  return {};
}

inline void sharded_model::start(const device_context* device, std::string problem) {
  if (device == nullptr) {
    require_host_memory();
    if (plan_.request().offload != offload::none && problem.empty())
      problem = "the plan offloads " + detail::offload_what(plan_.request().offload) +
                ", which runs on the device path only: expected a device_context (the host path keeps the whole "
                "model state in host memory already) or offload::none";
    // The host path: the trainer's thread is the compute stream, the communicator's progress
    // thread drives the communication stream; from here on the one sequence of stream work.
    own_compute_ = std::make_unique<host_execution_stream>(primitive::on_caller_thread);
  }
  // A context that does not fit makes this rank refuse; `agree` tells every rank (the
  // exchange runs in the communicator's memory, whatever the context is).
  std::string why = attach(device != nullptr ? *device : device_context{own_compute_.get(), {}});
  if (why.empty() && plan_.space() != comm_stream_->space())
    why = std::string("the plan is for ") + primitive::to_string(plan_.space()) +
          " memory (plan_request::space), but this model's state lives in " +
          primitive::to_string(comm_stream_->space()) + " memory, its compute stream's: expected a plan for " +
          primitive::to_string(comm_stream_->space()) + " memory";
  if (why.empty() && options_.hook && !options_.hook->supports(comm_stream_->space()))
    why = "the collective hook '" + hook_name(*options_.hook) + "' does not support " +
          primitive::to_string(comm_stream_->space()) +
          " memory, where this model's state lives: override collective_hook::supports in a hook that does";
  if (problem.empty()) problem = std::move(why);
  agreement().agree(problem);
  allocate_everywhere();
}

inline detail::host_buffer sharded_model::make_buffer(std::uint64_t bytes, memory_category what, bool from_hook) {
  const primitive::memory_space space = comm_stream_->space();
  detail::host_buffer b;
  void* hooked = nullptr;
  if (from_hook && options_.hook && bytes != 0) try {
      hooked = options_.hook->allocate(bytes, space);
    } catch (const std::exception& e) {
      throw error(errc::internal, "the collective hook's allocate(" + std::to_string(bytes) + ") failed: " + e.what());
    } catch (...) {
      throw error(errc::internal, "the collective hook's allocate(" + std::to_string(bytes) + ") failed");
    }
  try {  // (the alignment matters for host memory only: page-aligned from a page up)
    if (hooked != nullptr) {
      constexpr primitive::memory_buffer::free_function give_back = [](void* hook, void* data, std::size_t n,
                                                                       primitive::memory_space m) noexcept {
        static_cast<collective_hook*>(hook)->deallocate(data, n, m);
      };
      b = detail::host_buffer(primitive::memory_buffer::adopt(hooked, bytes, space, comm_stream_->device(), give_back,
                                                              options_.hook.get(), counter(what)));
      if (reinterpret_cast<std::uintptr_t>(hooked) % primitive::host_alignment != 0)
        throw error(errc::invalid_argument, "the collective hook '" + hook_name(*options_.hook) +
                                                "' allocated memory that is not 64-byte aligned");
      const auto at = reinterpret_cast<std::uintptr_t>(hooked);
      for (const auto* pool : {&gathers_buffers_, &buckets_})
        for (const detail::host_buffer& other : *pool) {
          const auto o = reinterpret_cast<std::uintptr_t>(other.data());
          if (other.bytes() != 0 && at < o + other.bytes() && o < at + bytes)
            throw error(errc::invalid_argument, "the collective hook '" + hook_name(*options_.hook) +
                                                    "' allocated memory overlapping another of its buffers");
        }
    } else if (space == primitive::memory_space::host && bytes >= detail::host_buffer::huge_bytes) {
      // Huge pages where the kernel has them: fewer TLB misses in the optimizer step, and direct
      // reads into it (an in-place checkpoint load) pin 2 MiB at a time.
      b = detail::host_buffer::untouched(bytes, counter(what));
    } else {
      b = detail::host_buffer(primitive::memory_buffer::allocate(
          space, bytes, comm_stream_->device(), detail::host_buffer::host_alignment_for(bytes), counter(what)));
    }
  } catch (const error& e) {
    throw error(e.kind(), "zero: cannot allocate " + std::to_string(bytes) + " bytes (" + e.message() + ")");
  }
  if (bytes != 0) comm_stream_->fill(b.data(), bytes, dtype::uint8, 0);
  return b;
}

inline void sharded_model::set_parameter(std::size_t p, std::span<const float> values) {
  const parameter_placement& pl = placement(p);
  if (values.size() != pl.numel)
    raise("set_parameter('" + name(p) + "'): got " + std::to_string(values.size()) + " values for " +
          std::to_string(pl.numel) + " elements");
  const dtype t = plan_.buffers()[pl.buffer].type;
  std::vector<unsigned char> staged(static_cast<std::size_t>(pl.numel * dtype_size(t)));
  visit_dtype(t, [&]<class T>() {
    T* d = reinterpret_cast<T*>(staged.data());
    for (std::uint64_t k = 0; k < pl.numel; ++k) d[k] = static_cast<T>(values[k]);
  });
  write_parameter(p, staged.data(), values.data());
  comm_stream_->synchronize();  // `staged` and `values` must outlive the copies
}

inline void sharded_model::read_parameter(std::size_t p, std::span<float> out) {
  const parameter_placement& pl = placement(p);
  if (out.size() != pl.numel)
    raise("read_parameter('" + name(p) + "'): output has " + std::to_string(out.size()) + " elements, the parameter " +
          std::to_string(pl.numel));
  const dtype t = plan_.buffers()[pl.buffer].type;
  std::vector<unsigned char> staged(static_cast<std::size_t>(pl.numel * dtype_size(t)));
  copy_parameter_out(p, staged.data());
  comm_stream_->synchronize();
  visit_dtype(t, [&]<class T>() {
    const T* s = reinterpret_cast<const T*>(staged.data());
    for (std::uint64_t k = 0; k < pl.numel; ++k) out[k] = static_cast<float>(s[k]);
  });
}

inline void sharded_model::write_parameter(std::size_t p, const unsigned char* values, const float* master) {
  const parameter_placement& pl = plan_.placements()[p];
  const flat_buffer& f = plan_.buffers()[pl.buffer];
  const algorithms::range own = owned_range(pl.buffer);
  const std::uint64_t lo = std::max(own.begin, pl.offset), hi = std::min(own.end, pl.offset + pl.numel);
  const std::uint64_t es = dtype_size(f.type);
  // In after the trainer's work so far: the whole parameter where the rank holds its buffer
  // whole, else the owned part.
  const bool whole = plan_.holds_whole(pl.buffer);
  if (!whole && plan_.request().quantization.weights != quantized_bits::none) {
    // A kept or prefetched copy holds dequantized values that the raw ones written below would
    // not match: dropped, so the next pre_forward gathers (and quantizes) the new shard. A unit
    // in use keeps its copy, which then shows the raw values.
    gather_hooks h{*this};
    gathers_.release_stale(h);
  }
  comm_waits_for_compute();
  if (whole && pl.numel != 0) comm_stream_->copy(params_[pl.buffer].data() + pl.offset * es, values, pl.numel * es);
  if (!whole && hi > lo)
    comm_stream_->copy(params_[pl.buffer].data() + (lo - own.begin) * es, values + (lo - pl.offset) * es,
                       (hi - lo) * es);
  // A gathered copy of the unit (kept after its forward, prefetched, or held by a pre_* hook)
  // shows the new values too, so no view serves the old ones: every rank passes the same values.
  if (const std::size_t w = storage_unit(p); !whole && pl.numel != 0 && gathers_.held(w))
    comm_stream_->copy(gathered_copy(w, f) + pl.offset * es, values, pl.numel * es);
  float* m = f.trainable ? optimizer_->master(pl.buffer) : nullptr;
  if (m != nullptr && hi > lo && master != nullptr)
    comm_stream_->copy(m + (lo - own.begin), master + (lo - pl.offset), (hi - lo) * sizeof(float));
  if (m != nullptr && hi > lo && master == nullptr)
    comm_stream_->cast(m + (lo - own.begin), dtype::float32, values + (lo - pl.offset) * es, f.type, hi - lo);
}

inline void sharded_model::copy_parameter_out(std::size_t p, unsigned char* out) {
  const parameter_placement& pl = plan_.placements()[p];
  copy_buffer_out(pl.buffer, pl.offset, pl.numel, out);
}

inline void sharded_model::copy_buffer_out(std::size_t b, std::uint64_t offset, std::uint64_t count,
                                           unsigned char* out) {
  const flat_buffer& f = plan_.buffers()[b];
  const std::uint64_t es = dtype_size(f.type);
  comm_waits_for_compute();
  const unsigned char* src = nullptr;
  std::size_t borrowed_slot = npos;
  detail::host_buffer temporary;  // released after the synchronize below
  if (plan_.holds_whole(b)) {
    src = params_[b].data();
  } else {
    const std::size_t w = f.unit;  // the unit that owns the buffer's storage
    const bool quantized = plan_.request().quantization.weights != quantized_bits::none;
    // Gathered on the communication stream: ordered before the copy. Quantized gathers hold
    // dequantized values: the shards are gathered again in full precision, into a temporary
    // buffer of this flat buffer's size when the unit holds its slot (not a slot more in the pool).
    if (gathers_.held(w) && !quantized) {
      src = gathered_copy(w, f);
    } else {
      unsigned char* dst = nullptr;
      if (gathers_.held(w)) {
        temporary = make_buffer(f.numel * es, memory_category::scratch);
        dst = temporary.data();
      } else {
        borrowed_slot = take_gather_slot();
        comm_stream_->wait(*gather_slot_free_[borrowed_slot]);
        dst = gathers_buffers_[borrowed_slot].data() + f.gather_offset;
      }
      unsigned char* shard = gather_input(b, dst);
      const collective_options tag = tagged(call_purpose::read, b);
      if (f.shard_numel > 0)
        comm_stream_->collective(
            [this, shard, dst, &f, tag] { all_gather(comm_, shard, dst, f.shard_numel, f.type, tag); });
      src = dst;
    }
  }
  if (count != 0) comm_stream_->copy(out, src + offset * es, count * es);
  // A borrowed slot's next gather runs after this copy on the same stream; a temporary must
  // outlive it.
  if (borrowed_slot != npos) gather_free_.push_back(borrowed_slot);
  if (temporary.bytes() != 0) comm_stream_->synchronize();
}

inline step_result sharded_model::run_step(std::uint64_t micro_batches, bool sync_off) {
  execution_stream& s = *comm_stream_;
  const auto& buffers = plan_.buffers();
  comm_waits_for_compute();  // the last micro-batch's gradients and reads of the parameters
  // Work on the communication stream: a refusal (learning rates differ) makes the stream skip
  // the rest, so nothing is half-updated, and the synchronize at the end rethrows it.
  s.collective([this, micro_batches, sync_off] {
    agreement().check_step(optimizer_->options().lr, optimizer_->steps() + 1, micro_batches, sync_off);
  });
  if (replica_ != nullptr && replica_->world_size() > 1)
    for (std::size_t b = 0; b < buffers.size(); ++b)
      if (buffers[b].trainable && buffers[b].numel > 0) {
        unsigned char* g = owned_gradient(b);
        const std::uint64_t n = owned_range(b).size();
        const collective_options tag = tagged(call_purpose::replica_average, b);
        s.collective([this, g, n, &buffers, b, tag] {
          all_reduce(*replica_, g, g, n, buffers[b].gradient_type, reduce_kind::avg, tag);
        });
      }
  // The norm, the decision and the update as stream operations (kernels on CUDA): the decision
  // is read on the stream, so the host learns it only at the step's one wait below.
  step_scalars* scalars = reinterpret_cast<step_scalars*>(step_scalars_.data());
  s.fill(scalars, sizeof(step_scalars), dtype::uint8, 0);
  s.fill(&scalars->inverse_scale, 1, dtype::float64, scaler_.inverse_scale());  // 1 / the loss scale
  for (std::size_t b = 0; b < buffers.size(); ++b)
    if (buffers[b].trainable && owned_range(b).size() > 0)
      s.add_sum_of_squares(&scalars->squares, owned_gradient(b), owned_range(b).size(), buffers[b].gradient_type);
  if (plan_.stage() >= 1 && comm_.world_size() > 1)
    s.collective([this, scalars] {
      all_reduce(comm_, &scalars->squares, &scalars->squares, 1, dtype::float64, reduce_kind::sum,
                 tagged(call_purpose::norm, 0));
    });
  s.decide_step(scalars, options_.max_grad_norm, skips_nonfinite());
  if (offload_) {
    enqueue_offloaded_update(scalars);  // zero/sharded_model_offload.hpp
  } else {
    // Step number steps() + 1: a skipped step (decided on the stream) updates nothing and does not count.
    const std::uint64_t next = optimizer_->steps() + 1;
    for (std::size_t b = 0; b < buffers.size(); ++b)
      if (buffers[b].trainable && owned_range(b).size() > 0)
        s.update_shard(optimizer_->describe(b, owned_parameters(b), owned_gradient(b), next), scalars);
  }
  // Stages 1-2 regather whatever was decided: after a skipped step every shard is unchanged on
  // every rank (one global norm), so the all_gather rewrites the same values.
  if (plan_.stage() == 1 || plan_.stage() == 2)
    for (std::size_t b = 0; b < buffers.size(); ++b)
      if (buffers[b].trainable && buffers[b].numel > 0)
        s.collective([this, &buffers, b] {
          const gather_call call{buffers[b].unit,
                                 b,
                                 owned_parameters(b),
                                 params_[b].data(),
                                 buffers[b].shard_numel,
                                 buffers[b].type,
                                 tagged(call_purpose::regather, b)};
          if (options_.hook)
            run_hook("all_gather", call.unit, b, [&] { options_.hook->all_gather(comm_, call); });
          else
            all_gather(comm_, call.shard, call.gathered, call.shard_numel, call.type, call.options);
        });
  zero_gradients();
  s.copy(&decided_, scalars, sizeof(step_scalars));
  // The result is a host value: the one host wait of the device path, once per step. The
  // compute stream's later work is enqueued after it, so it sees the updated parameters.
  s.synchronize();
  step_result r;
  r.gradient_norm = decided_.gradient_norm;
  r.clip_coefficient = decided_.clip_coefficient;
  r.skipped = decided_.skipped != 0;
  scaler_.update(r.skipped);                              // the decision is global: every rank's scale stays the same
  if (!r.skipped && !offload_) optimizer_->begin_step();  // the offloaded update began it on the CPU
  r.steps = optimizer_->steps();
  return r;
}

}  // namespace ringzero::zero
