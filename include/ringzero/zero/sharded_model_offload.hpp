#pragma once
/// @file
/// The optimizer step of `zero::sharded_model` with offload::optimizer or offload::parameters
/// (zero/offload.hpp), defined out of the class: the gradient shards copied to host memory on the
/// communication stream, the update on the CPU (the offload stream), the updated parameter shards
/// copied back, pipelined buffer by buffer (ZeRO-Offload, Ren et al. 2021, section 4.2); with
/// offload::parameters the shards are host memory already, so the CPU updates them in place and
/// nothing is copied (FSDP2's CPUOffloadPolicy). One code path for both kinds of
/// communication stream: the offload stream waits for its events on its own thread (wait_host:
/// cudaEventSynchronize there on CUDA, never on the trainer's thread), and the communication
/// stream waits for the offload stream's events with wait_host_stream (cudaLaunchHostFunc on
/// CUDA). Included by zero/sharded_model.hpp at its end; include that header, not this one. The
/// manual: docs/zero.md, "CPU offload".

#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::zero {

inline void sharded_model::enqueue_offloaded_update(const step_scalars* scalars) {
  detail::optimizer_offload& o = *offload_;
  execution_stream& c = *comm_stream_;
  execution_stream& cpu = *o.stream;
  const auto& buffers = plan_.buffers();
  const auto moved = [&](std::size_t b) { return buffers[b].trainable && owned_range(b).size() > 0; };
  // Where the CPU finds buffer b's gradient shard and writes its parameter shard: the transfer
  // buffers, or with offload::parameters the shards themselves (no copy in or out).
  const bool in_place = parameters_offloaded();
  const auto host_gradient = [&](std::size_t b) { return in_place ? owned_gradient(b) : o.gradients[b].data(); };
  const auto host_parameters = [&](std::size_t b) { return in_place ? owned_parameters(b) : o.parameters[b].data(); };
  // A refused step (learning rates differ) left its error on the offload stream too, which took
  // it over from the communication stream: drop it (the previous step() waited for this stream's
  // last work, so this does not wait), or every later step would fail with it.
  cpu.synchronize_quietly();
  // The offload stream waits for a point of the communication stream on its own thread.
  const auto cpu_waits_for = [&](const execution_stream::event& e, const char* what) {
    cpu.host_work([&c, &e] { c.wait_host(e); }, what);
  };
  // The communication stream has decided (skip, clip) in `scalars` (its memory: device memory on
  // CUDA); a copy in host memory tells the CPU, which begins the step.
  const step_scalars* decided = reinterpret_cast<const step_scalars*>(o.decided.data());
  c.copy(o.decided.data(), scalars, sizeof(step_scalars));
  c.record(*o.started);
  cpu_waits_for(*o.started, "waiting for the offloaded step's decision");
  cpu.host_work(
      [this, decided] {
        if (decided->skipped == 0) optimizer_->begin_step();
      },
      "the offloaded step's decision");
  // In: every gradient shard (and float32 parameters without master weights: the update
  // changes them in place), each announced to the CPU as soon as it has arrived.
  for (std::size_t b = 0; b < buffers.size(); ++b) {
    if (!moved(b)) continue;
    const std::uint64_t n = owned_range(b).size();
    if (!in_place) {
      c.copy(o.gradients[b].data(), owned_gradient(b), n * dtype_size(buffers[b].gradient_type));
      if (!buffers[b].has_master) c.copy(o.parameters[b].data(), owned_parameters(b), n * dtype_size(buffers[b].type));
    }
    c.record(*o.copied_in[b]);  // in place: the shard's reductions are done
  }
  // The CPU updates buffer b while the copies of the others run: the same per-element rule as
  // without offload (sharded_optimizer::update), so the results are bitwise the same.
  for (std::size_t b = 0; b < buffers.size(); ++b) {
    if (!moved(b)) continue;
    cpu_waits_for(*o.copied_in[b], "waiting for a gradient shard's copy to host memory");
    cpu.host_work(
        [this, b, decided, parameters = host_parameters(b), gradient = host_gradient(b)] {
          const flat_buffer& f = plan_.buffers()[b];
          if (decided->skipped == 0) {
            optimizer_->update(b, parameters, gradient, static_cast<float>(decided->gradient_multiplier));
            return;
          }
          // Skipped: the copy back must leave the parameters as they are. With master weights
          // they are the master weights rounded (set_parameter, a checkpoint load and every
          // update keep them so); without, the copy in brought them.
          if (!f.has_master) return;
          const float* w = optimizer_->master(b);
          visit_dtype(f.type, [&]<class P>() {
            if constexpr (std::is_same_v<P, bfloat16> || std::is_same_v<P, float16> || std::is_same_v<P, float>) {
              P* p = reinterpret_cast<P*>(parameters);
              for (std::uint64_t j = 0, n = owned_range(b).size(); j < n; ++j) p[j] = static_cast<P>(w[j]);
            }
          });
        },
        "the offloaded optimizer update");
    cpu.record(*o.updated[b]);
  }
  // Out: each updated parameter shard once its update is done (buffer b's copy overlaps the
  // update of b + 1).
  for (std::size_t b = 0; b < buffers.size(); ++b) {
    if (!moved(b) || in_place) continue;
    c.wait_host_stream(*o.updated[b]);
    c.copy(owned_parameters(b), o.parameters[b].data(), owned_range(b).size() * dtype_size(buffers[b].type));
  }
  // The rest of the step (the all_gather of stages 1-2, the result) comes after the CPU's work.
  cpu.record(*o.finished);
  c.wait_host_stream(*o.finished);
}

}  // namespace ringzero::zero
