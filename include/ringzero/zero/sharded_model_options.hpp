#pragma once
/// @file
/// `zero::sharded_model_options` (what a `sharded_model` is asked to do beyond its plan) and
/// `zero::step_result` (what one `step()` did). Plain values; the model checks the options
/// across ranks at construction (zero/model_agreement.hpp). The manual: docs/zero.md.

#include <cstdint>
#include <memory>

#include "ringzero/zero/collective_hook.hpp"
#include "ringzero/zero/loss_scaler.hpp"
#include "ringzero/zero/optimizer.hpp"

namespace ringzero::zero {

/// Options of a `sharded_model`.
struct sharded_model_options {
  /// The optimizer; its state count must match the plan's `precision::optimizer_states`.
  optimizer_options optimizer{};
  /// Clip the global gradient norm to this value (> 0); 0: no clipping.
  double max_grad_norm = 0;
  /// Skip the update (and zero the gradients) when the global gradient norm is not finite, as
  /// mixed-precision trainers do on overflow; false: apply it anyway.
  bool skip_nonfinite_steps = true;
  /// Dynamic loss scaling (zero/loss_scaler.hpp; meant for float16): the trainer multiplies its
  /// loss by `loss_scale()`; a non-finite step is then always skipped.
  loss_scaling_options loss_scaling{};
  /// Reproducible gradient accumulation (see the file comment and docs/zero.md). Refused (on
  /// every rank, errc::invalid_argument) with max_grad_norm > 0, hybrid sharding, or gradients
  /// that are not float16, bfloat16, float32 or float64.
  bool reproducible = false;
  /// Replaces the parameter all_gathers and gradient reductions, and may allocate the
  /// communication buffers (zero/collective_hook.hpp); null: the runtime's own. Shared: the
  /// model keeps it alive. Refused with quantized communication or reproducible mode.
  std::shared_ptr<collective_hook> hook;
  /// Stage 3: time every unit's gather on the communication stream and every wait of the compute
  /// stream for one, with timing events (zero/gather_timing.hpp; `sharded_model::gather_times()`).
  /// Costs two event records per gather and per wait (on CUDA, events with timing). Local: the
  /// ranks may differ.
  bool time_gathers = false;
};

/// What `sharded_model::step()` did.
struct step_result {
  double gradient_norm = 0;     ///< global L2 norm of the averaged gradients, before clipping
  double clip_coefficient = 1;  ///< factor the gradients were multiplied by (1: not clipped)
  bool skipped = false;         ///< the norm was not finite and the update was skipped
  std::uint64_t steps = 0;      ///< optimizer updates applied so far
};

}  // namespace ringzero::zero
