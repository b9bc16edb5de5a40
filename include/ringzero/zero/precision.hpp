#pragma once
/// @file
/// `zero::precision`: the element types of the four kinds of model state a ZeRO plan stores —
/// training parameters, gradients, master weights and optimizer states — and how many bytes
/// each costs per parameter element.
///
/// The ZeRO paper (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
/// Parameter Models", section 3.1) assumes mixed-precision Adam: float16 parameters and
/// gradients (2 + 2 bytes per element) and K = 12 bytes of optimizer state per element (a float32
/// master copy of the parameters plus Adam's float32 momentum and variance).
/// `precision::mixed_adam()` is that setup; `optimizer_bytes_per_element` is K.

#include <cstdint>
#include <optional>

#include "ringzero/core/dtype.hpp"

namespace ringzero::zero {

/// Element types of the model state. Pure value.
struct precision {
  /// Element type of a parameter whose `parameter_spec::type` is unset.
  dtype parameter = dtype::float32;
  /// Element type of every gradient; unset: each parameter's own element type.
  std::optional<dtype> gradient;
  /// Element type of the master weights (the copy the optimizer updates). A master copy is kept
  /// for a trainable parameter whose element type differs from this one; unset, or equal to the
  /// parameter's type: no master copy, the optimizer updates the parameters themselves.
  std::optional<dtype> master;
  /// Element type of each optimizer state tensor.
  dtype optimizer_state = dtype::float32;
  /// Optimizer state tensors per parameter element: 2 for Adam and AdamW (exp_avg, exp_avg_sq),
  /// 1 for SGD with momentum, 0 for plain SGD.
  int optimizer_states = 2;

  /// The paper's setup: float16 parameters and gradients, float32 master weights and two float32
  /// Adam states (K = 12).
  static constexpr precision mixed_adam() noexcept {
    precision p;
    p.parameter = dtype::float16;
    p.gradient = dtype::float16;
    p.master = dtype::float32;
    return p;
  }
  /// bfloat16 parameters and gradients, float32 master weights and two float32 Adam states (K = 12).
  static constexpr precision bfloat16_adam() noexcept {
    precision p = mixed_adam();
    p.parameter = dtype::bfloat16;
    p.gradient = dtype::bfloat16;
    return p;
  }
  /// Everything in float32 with Adam: no master copy (K = 8).
  static constexpr precision float32_adam() noexcept { return precision{}; }

  /// The element type of a parameter declared with `declared` (or none).
  constexpr dtype parameter_type(std::optional<dtype> declared) const noexcept { return declared.value_or(parameter); }
  /// The gradient element type of a parameter of type `param`.
  constexpr dtype gradient_type(dtype param) const noexcept { return gradient.value_or(param); }
  /// True when a trainable parameter of type `param` has a separate master copy.
  constexpr bool has_master(dtype param) const noexcept { return master.has_value() && *master != param; }
  /// Bytes of master weights per element of a trainable parameter of type `param` (0 without a copy).
  constexpr std::uint64_t master_bytes_per_element(dtype param) const noexcept {
    return has_master(param) ? dtype_size(*master) : 0;
  }
  /// Bytes of optimizer state per element, master copy excluded.
  constexpr std::uint64_t state_bytes_per_element() const noexcept {
    return static_cast<std::uint64_t>(optimizer_states < 0 ? 0 : optimizer_states) * dtype_size(optimizer_state);
  }
  /// The paper's K for a trainable parameter of type `param`: master copy plus optimizer states,
  /// in bytes per element (12 for `mixed_adam`).
  constexpr std::uint64_t optimizer_bytes_per_element(dtype param) const noexcept {
    return master_bytes_per_element(param) + state_bytes_per_element();
  }
};

}  // namespace ringzero::zero
