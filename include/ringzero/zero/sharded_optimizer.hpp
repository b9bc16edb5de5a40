#pragma once
/// @file
/// `zero::sharded_optimizer`: the optimizer of one rank of a ZeRO plan. It owns the master
/// weights (float32) and optimizer states (float32) of the rank's shard of every trainable flat
/// buffer — the whole buffer at stage 0 — and updates only that range, writing the result back
/// into the training parameters of the same range (rounded to their element type).
///
/// Supported: SGD (with momentum), Adam and AdamW (zero/optimizer.hpp); trainable parameters of
/// float32 (updated in place when there is no master copy), bfloat16 or float16 (which need a
/// float32 master copy); gradients of float32, bfloat16 or float16; float32 optimizer states.
/// Because every update is element-wise, updating shards gives exactly the numbers an unsharded
/// optimizer gives (ZeRO-1, Rajbhandari et al. 2020, section 5.1).
/// Thread semantics: used by one thread. Memory: allocated once at construction.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/zero/host_buffer.hpp"
#include "ringzero/zero/optimizer.hpp"
#include "ringzero/zero/shard_plan.hpp"
#include "ringzero/zero/shard_update.hpp"

namespace ringzero::zero {

/// See the file comment.
class sharded_optimizer {
 public:
  /// The first reason why `plan` and `options` cannot run together ("" when they can): invalid
  /// options, a state count in the plan that differs from the optimizer's, a master or state type
  /// other than float32, a 16-bit trainable parameter without a master copy, or a trainable
  /// parameter or gradient type other than float32, bfloat16 and float16.
  static std::string problem(const shard_plan& plan, const optimizer_options& options) {
    std::string p = options.problem();
    if (!p.empty()) return p;
    const zero::precision& pr = plan.request().precision;
    const bool has_trainable = plan.trainable_elements() > 0;
    if (has_trainable && pr.optimizer_states != options.state_count())
      return "the plan counts " + std::to_string(pr.optimizer_states) + " optimizer state(s) per element but " +
             std::string(optimizer_name(options.kind)) +
             (options.kind == optimizer_kind::sgd && options.momentum != 0 ? " with momentum" : "") + " keeps " +
             std::to_string(options.state_count());
    if (has_trainable && options.state_count() > 0 && pr.optimizer_state != dtype::float32)
      return "optimizer states must be float32, the plan has " + std::string(dtype_name(pr.optimizer_state));
    for (const flat_buffer& f : plan.buffers()) {
      if (!f.trainable || f.payload == 0) continue;
      const auto supported = [](dtype t) { return t == dtype::float32 || t == dtype::bfloat16 || t == dtype::float16; };
      if (!supported(f.type))
        return "trainable parameters must be float32, bfloat16 or float16; unit '" + plan.units()[f.unit].name +
               "' has " + std::string(dtype_name(f.type));
      if (!supported(f.gradient_type))
        return "gradients must be float32, bfloat16 or float16, the plan has " +
               std::string(dtype_name(f.gradient_type));
      if (f.has_master && *pr.master != dtype::float32)
        return "master weights must be float32, the plan has " + std::string(dtype_name(*pr.master));
      if (!f.has_master && f.type != dtype::float32)
        return std::string(dtype_name(f.type)) + " parameters need float32 master weights (set precision.master)";
    }
    return {};
  }

  /// The optimizer of shard `shard_index` of `plan` (0 <= shard_index < plan.shards()).
  /// Throws errc::invalid_argument when `problem(plan, options)` is not empty. `allocate` makes
  /// each buffer of master weights and states (its bytes, and which it is: memory_category::
  /// master_weights or optimizer_states; zero-filled host memory when not given;
  /// the device path allocates in its memory space and zeroes by stream work).
  sharded_optimizer(const shard_plan& plan, int shard_index, const optimizer_options& options,
                    const std::function<detail::host_buffer(std::uint64_t, memory_category)>& allocate = {})
      : plan_(&plan), options_(options), shard_index_(shard_index) {
    const std::string p = problem(plan, options);
    if (!p.empty()) throw error(errc::invalid_argument, "zero::sharded_optimizer: " + p);
    if (shard_index < 0 || shard_index >= plan.shards())
      throw error(errc::invalid_argument, "zero::sharded_optimizer: shard " + std::to_string(shard_index) +
                                              " is outside [0, " + std::to_string(plan.shards()) + ")");
    const auto& buffers = plan.buffers();
    state_.resize(buffers.size());
    for (std::size_t b = 0; b < buffers.size(); ++b) {
      const flat_buffer& f = buffers[b];
      if (!f.trainable) continue;
      buffer_state& s = state_[b];
      s.count = owned_range(b).size();
      const auto make = [&](std::uint64_t bytes, memory_category what) {
        return allocate ? allocate(bytes, what) : detail::host_buffer(bytes);
      };
      if (f.has_master) s.master = make(s.count * sizeof(float), memory_category::master_weights);
      for (int k = 0; k < options.state_count(); ++k)
        s.states[k] = make(s.count * sizeof(float), memory_category::optimizer_states);
    }
  }

  /// The range of buffer `b` this optimizer updates: the rank's shard (the whole buffer at stage 0).
  algorithms::range owned_range(std::size_t b) const {
    const flat_buffer& f = plan_->buffers().at(b);
    return plan_->stage() == 0 ? algorithms::range{0, f.numel} : f.shard(shard_index_);
  }

  /// The float32 master weights of buffer `b`'s owned range, or nullptr without a master copy.
  float* master(std::size_t b) noexcept { return reinterpret_cast<float*>(state_[b].master.data()); }

  /// The float32 master weights of buffer `b`'s owned range, or nullptr without a master copy.
  const float* master(std::size_t b) const noexcept { return reinterpret_cast<const float*>(state_[b].master.data()); }
  /// Optimizer state `k` (0 <= k < options().state_count(): SGD's momentum buffer; Adam's
  /// exp_avg, exp_avg_sq) of buffer `b`'s owned range, float32; nullptr for a frozen buffer or
  /// an empty range. For checkpoints (checkpoint/).
  float* state(std::size_t b, int k) noexcept { return reinterpret_cast<float*>(state_[b].states[k].data()); }
  const float* state(std::size_t b, int k) const noexcept {
    return reinterpret_cast<const float*>(state_[b].states[k].data());
  }
  /// Sets the number of steps begun so far, as a checkpoint restores it (the next step is
  /// `steps + 1`, so Adam's bias correction continues where the saved run stopped).
  void set_steps(std::uint64_t steps) noexcept { step_ = steps; }

  /// Starts a new step (the step count used by Adam's bias correction and SGD's first momentum).
  void begin_step() noexcept { ++step_; }
  /// Steps begun so far.
  std::uint64_t steps() const noexcept { return step_; }
  /// The options (the learning rate may be changed with `set_learning_rate`).
  const optimizer_options& options() const noexcept { return options_; }
  /// Sets the learning rate for the next steps (a scheduler's job). Throws errc::invalid_argument,
  /// leaving the options as they were, when the options with this rate have a `problem()`: not
  /// finite, < 0, not representable as a float32, or out of the limits it shares with beta1 and
  /// the weight decay (zero/optimizer.hpp).
  void set_learning_rate(double lr) {
    optimizer_options o = options_;
    o.lr = lr;
    const std::string p = o.problem();
    if (!p.empty()) throw error(errc::invalid_argument, "zero::sharded_optimizer: " + p);
    options_ = o;
  }

  /// Updates buffer `b`'s owned range: `params` points at its first element (parameter dtype),
  /// `grads` at its gradient (gradient dtype), each `owned_range(b).size()` elements; gradients
  /// are multiplied by `grad_scale` first. Call `begin_step` once before the step's updates.
  void update(std::size_t b, void* params, const void* grads, float grad_scale) {
    const flat_buffer& f = plan_->buffers()[b];
    if (!f.trainable || state_[b].count == 0) return;
    detail::update_shard(describe(b, params, grads, step_), grad_scale);
  }

  /// Buffer `b`'s update at step number `step` (counting from 1) as data, for a stream that runs
  /// it later (the device path): `params` and `grads` as for `update`; the state pointers are
  /// this optimizer's. A frozen buffer or an empty range gives count 0.
  shard_update describe(std::size_t b, void* params, const void* grads, std::uint64_t step) {
    const flat_buffer& f = plan_->buffers()[b];
    buffer_state& s = state_[b];
    shard_update u;
    u.rule = detail::make_update_rule(options_, step);
    u.params = params;
    u.param_type = f.type;
    u.grads = grads;
    u.gradient_type = f.gradient_type;
    u.master = f.has_master ? master(b) : nullptr;
    u.s0 = reinterpret_cast<float*>(s.states[0].data());
    u.s1 = reinterpret_cast<float*>(s.states[1].data());
    u.count = f.trainable ? s.count : 0;
    return u;
  }

  /// Bytes of master weights held.
  std::uint64_t master_bytes() const noexcept {
    std::uint64_t n = 0;
    for (const buffer_state& s : state_) n += s.master.bytes();
    return n;
  }
  /// Bytes of optimizer states held.
  std::uint64_t state_bytes() const noexcept {
    std::uint64_t n = 0;
    for (const buffer_state& s : state_) n += s.states[0].bytes() + s.states[1].bytes();
    return n;
  }
  /// Bytes of master weights held in memory space `space`.
  std::uint64_t master_bytes(primitive::memory_space space) const noexcept {
    std::uint64_t n = 0;
    for (const buffer_state& s : state_) n += s.master.space() == space ? s.master.bytes() : 0;
    return n;
  }
  /// Bytes of optimizer states held in memory space `space`.
  std::uint64_t state_bytes(primitive::memory_space space) const noexcept {
    std::uint64_t n = 0;
    for (const buffer_state& s : state_)
      for (const detail::host_buffer& b : s.states) n += b.space() == space ? b.bytes() : 0;
    return n;
  }

 private:
  struct buffer_state {
    std::uint64_t count = 0;
    detail::host_buffer master;
    detail::host_buffer states[2];
  };

  const shard_plan* plan_;
  optimizer_options options_;
  int shard_index_;
  std::uint64_t step_ = 0;
  std::vector<buffer_state> state_;
};

}  // namespace ringzero::zero
