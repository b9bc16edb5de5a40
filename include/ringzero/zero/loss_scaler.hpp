#pragma once
/// @file
/// `zero::loss_scaling_options` and `zero::loss_scaler`: dynamic loss scaling for float16
/// training. The trainer multiplies its loss by `scale()` so that small gradients survive in
/// float16; the step unscales (multiplies the gradients by 1 / scale), skips the update when a
/// gradient is not finite and multiplies the scale by `backoff_factor`, and multiplies it by
/// `growth_factor` after `growth_interval` consecutive good steps. The rule and its defaults
/// follow PyTorch's torch.amp.GradScaler (init_scale 2^16, growth_factor 2, backoff_factor 0.5,
/// growth_interval 2000; a grown scale that is not finite is not taken).
/// Pure values; thread semantics: as a plain value. The manual: docs/zero.md, "Dynamic loss scaling".

#include <cmath>
#include <cstdint>
#include <string>

namespace ringzero::zero {

/// Options of dynamic loss scaling (`sharded_model_options::loss_scaling`).
struct loss_scaling_options {
  /// Off by default: the scale stays 1 and nothing is unscaled.
  bool enabled = false;
  /// The first scale: finite and > 0 (powers of two keep the unscaling exact).
  double initial_scale = 65536.0;
  /// Factor applied after `growth_interval` consecutive good steps: finite and > 1.
  double growth_factor = 2.0;
  /// Factor applied after a step with a non-finite gradient: in (0, 1).
  double backoff_factor = 0.5;
  /// Consecutive good steps before the scale grows: >= 1.
  std::int64_t growth_interval = 2000;
};

/// The first problem of `o` ("" when none), naming the option (checked also when not enabled).
inline std::string loss_scaling_problem(const loss_scaling_options& o) {
  if (!(std::isfinite(o.initial_scale) && o.initial_scale > 0))
    return "loss_scaling.initial_scale must be finite and > 0, got " + std::to_string(o.initial_scale);
  if (!(std::isfinite(o.growth_factor) && o.growth_factor > 1))
    return "loss_scaling.growth_factor must be finite and > 1, got " + std::to_string(o.growth_factor);
  if (!(o.backoff_factor > 0 && o.backoff_factor < 1))
    return "loss_scaling.backoff_factor must be in (0, 1), got " + std::to_string(o.backoff_factor);
  if (o.growth_interval < 1)
    return "loss_scaling.growth_interval must be >= 1, got " + std::to_string(o.growth_interval);
  return {};
}

/// The scale and the count of consecutive good steps (GradScaler's growth tracker). Valid
/// options are a precondition (`loss_scaling_problem` is empty).
class loss_scaler {
 public:
  loss_scaler() = default;
  explicit loss_scaler(const loss_scaling_options& o) noexcept
      : options_(o), scale_(o.enabled ? o.initial_scale : 1.0) {}

  /// Whether scaling is on.
  bool enabled() const noexcept { return options_.enabled; }
  /// The factor the trainer multiplies its loss by (1 when not enabled).
  double scale() const noexcept { return scale_; }
  /// The factor the step multiplies the gradients by: 1 / scale (1 when not enabled).
  double inverse_scale() const noexcept { return 1.0 / scale_; }
  /// Consecutive good steps since the scale last changed (always < growth_interval).
  std::uint64_t good_steps() const noexcept { return good_steps_; }
  /// The options.
  const loss_scaling_options& options() const noexcept { return options_; }

  /// After a step: `overflow` (a non-finite gradient, the step skipped) backs off and restarts
  /// the count; else one more good step, growing the scale when the count reaches the interval.
  void update(bool overflow) noexcept {
    if (!options_.enabled) return;
    if (overflow) {
      scale_ *= options_.backoff_factor;
      good_steps_ = 0;
      return;
    }
    if (++good_steps_ < static_cast<std::uint64_t>(options_.growth_interval)) return;
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    good_steps_ = 0;
  }

  /// The problem of restoring (scale, good_steps) ("" when none): the scale must be finite and > 0.
  static std::string restore_problem(double scale) {
    if (!(std::isfinite(scale) && scale > 0))
      return "the loss scale must be finite and > 0, got " + std::to_string(scale);
    return {};
  }
  /// Sets the state (a checkpoint's); `restore_problem(scale)` must be empty. A count at or
  /// past the interval is taken as interval - 1 (the next good step grows the scale).
  void restore(double scale, std::uint64_t good_steps) noexcept {
    scale_ = scale;
    const auto interval = static_cast<std::uint64_t>(options_.growth_interval);
    good_steps_ = good_steps < interval ? good_steps : interval - 1;
  }

 private:
  loss_scaling_options options_{};
  double scale_ = 1.0;
  std::uint64_t good_steps_ = 0;
};

}  // namespace ringzero::zero
