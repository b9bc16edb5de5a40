#pragma once
/// @file
/// `zero::sharded_model`'s micro-batches and step (zero/sharded_model.hpp, which includes this
/// file after the class): `end_backward`, gradient sync (`set_require_gradient_sync`, the
/// window of micro-batches a step reduces) and `step`'s checks before the work on the streams
/// (sharded_model_streams.hpp, `run_step`). Semantics: the declarations' comments. Included by
/// zero/sharded_model.hpp at its end; include that header, not this one.

#include <algorithm>
#include <cstdint>
#include <string>

#include "ringzero/zero/sharded_model.hpp"

namespace ringzero::zero {

inline void sharded_model::end_backward() {
  const int steps = plan_.request().accumulation_steps;
  if (window_closed_)
    raise(trainer_window_ ? "end_backward() after the micro-batch that reduced this step's gradients (the first "
                            "one ended with gradient sync on after no_sync): call step() first"
                          : "end_backward() called " + std::to_string(micro_ + 1) +
                                " times before step(), but the plan accumulates " + std::to_string(steps) +
                                " micro-batch(es) per step");
  const bool last = ends_step();
  if (syncing()) {
    gradient_hooks h{*this};
    gradients_.finish(h);
  }
  if (reproducible_ && last) reduce_reproducibly();
  if (plan_.stage() == 3 && reshard_after_backward_) {
    gather_hooks h{*this};
    gathers_.release_all(h);
  }
  forward_at_ = npos;
  in_backward_ = false;
  // The compute stream's later work (the next micro-batch's gradients, a trainer reading the
  // reduced ones) runs after the reductions; on the host path this waits for them.
  comm_stream_->record(*comm_mark_);
  compute_->wait(*comm_mark_);
  std::fill(marked_.begin(), marked_.end(), false);
  if (!require_sync_) trainer_window_ = true;
  window_closed_ = last;
  micro_begun_ = false;
  require_sync_ = pending_sync_;  // a guard's restore in the middle of the micro-batch
  ++micro_;
}

inline void sharded_model::set_require_gradient_sync(bool on) {
  if (!on && plan_.sharded_gradients() && !options_.reproducible)
    raise("set_require_gradient_sync(false) at stage " + std::to_string(plan_.stage()) +
          ": the gradients are sharded and reduced every micro-batch; to accumulate without traffic, plan with "
          "plan_request::accumulate_unsharded (every rank then holds the full gradients, as at stage 1)");
  if (micro_begun_) {  // the mode of this micro-batch stays; a change waits for its end
    if (on == require_sync_) pending_sync_ = on;
    if (on == require_sync_ || on == pending_sync_) return;
    raise(std::string("set_require_gradient_sync(") + (on ? "true" : "false") +
          ") in the middle of a micro-batch (after its first gradient, mark_ready, pre_backward or post_backward): "
          "change it between end_backward() and the next backward");
  }
  require_sync_ = pending_sync_ = on;
}

inline void sharded_model::restore_gradient_sync(bool on) noexcept {
  pending_sync_ = on;
  if (!micro_begun_) require_sync_ = on;
}

inline step_result sharded_model::step() {
  const int steps = plan_.request().accumulation_steps;
  if (plan_.stage() == 3)
    // A unit gathered by a pre_* hook without its post_* would serve parameters from before
    // this update (and the implicit end_backward below would forget the use).
    for (std::size_t u = 0; u < plan_.units().size(); ++u)
      if (gathers_.in_use(u) && !gathers_.kept(u))
        raise("step() while unit '" + plan_.units()[u].name + "' (" + std::to_string(u) +
              ") is gathered by a pre_forward / pre_backward without its post_forward / post_backward");
  // A micro-batch begun under no_sync whose guard closed since: it ends as it began (nothing
  // reduced), and the sync now on reduces what the step accumulated (the implicit end below).
  if (micro_begun_ && !require_sync_ && pending_sync_ && !window_closed_) end_backward();
  // With sync off and the step's last micro-batch not reduced, nothing was: the step's check
  // refuses it on every rank (run_step).
  const bool sync_off = !require_sync_ && !window_closed_;
  if (!window_closed_ && ends_step()) end_backward();
  if (require_sync_ && !window_closed_)
    raise("step() after " + std::to_string(micro_) + " micro-batch(es), but the plan accumulates " +
          std::to_string(steps) + " (call end_backward() after each)");
  // A micro-batch counts when it ends (end_backward or the implicit end above), whatever the
  // trainer computed in it: a rank that writes into views it kept needs no hook call.
  const auto micro_batches = static_cast<std::uint64_t>(micro_);
  if (plan_.stage() == 3) {
    // A unit gathered after end_backward() (an evaluation pass, a prefetch) holds the
    // parameters from before this update: drop it, so the next pre_forward gathers the
    // updated shards.
    gather_hooks h{*this};
    gathers_.release_all(h);
  }
  forward_at_ = npos;
  in_backward_ = false;
  micro_ = 0;
  trainer_window_ = window_closed_ = micro_begun_ = false;
  require_sync_ = pending_sync_;
  const step_result r = run_step(micro_batches, sync_off);
  if (options_.time_gathers) timer_.collect(false);  // the step waited for every stream: all reached
  return r;
}

}  // namespace ringzero::zero
