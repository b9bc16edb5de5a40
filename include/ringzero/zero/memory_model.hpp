#pragma once
/// @file
/// Per-rank memory by category (`zero::memory_breakdown`) and the ZeRO paper's memory model
/// (`zero::paper_model_state_memory`).
/// The manual: docs/zero.md, "Header notes", `ringzero/zero/memory_model.hpp`.

#include <cstddef>
#include <cstdint>

namespace ringzero::zero {

/// Bytes held by one rank, by category. Units: bytes. The sums below are unchecked; a
/// `shard_plan` refuses any request for which its `memory()` categories or these sums would
/// overflow 64 bits, so for a plan's memory they are exact.
struct memory_breakdown {
  std::uint64_t parameters = 0;             ///< parameters (full, or the shard at stage 3 unless kept whole)
  std::uint64_t gradients = 0;              ///< gradients (the shard at 2-3 unless accumulated unsharded, else full)
  std::uint64_t master_weights = 0;         ///< master copy of the parameters the optimizer updates
  std::uint64_t optimizer_states = 0;       ///< optimizer state tensors (momentum, variance, ...)
  std::uint64_t communication_buffers = 0;  ///< gather buffers and gradient buckets (stages 2-3)

  /// Parameters + gradients + master weights + optimizer states (the paper's "model states").
  constexpr std::uint64_t model_states() const noexcept {
    return parameters + gradients + master_weights + optimizer_states;
  }
  /// Model states plus communication buffers.
  constexpr std::uint64_t total() const noexcept { return model_states() + communication_buffers; }

  friend constexpr bool operator==(const memory_breakdown&, const memory_breakdown&) = default;
};

/// What asked for memory: the categories of `memory_breakdown`, and `scratch`, what a runtime
/// allocates outside the model state (the step's scalars, offload's step decision, agreement
/// records, read_parameter's temporary copy). `zero::sharded_model::memory_allocated` counts by it.
enum class memory_category : std::uint8_t {
  parameters,
  gradients,
  master_weights,
  optimizer_states,
  communication_buffers,
  scratch,
};
/// The number of `memory_category` values.
inline constexpr std::size_t memory_categories = 6;

/// Element sizes of the paper's model: bytes per element of parameters, of gradients, and of
/// optimizer state (K, which includes the master copy).
struct element_bytes {
  double parameter = 2;
  double gradient = 2;
  double optimizer = 12;  ///< the paper's K
};

/// Model-state memory of one device in the paper's model, by category. Units: bytes.
struct model_memory {
  double parameters = 0;
  double gradients = 0;
  double optimizer_states = 0;  ///< K Psi or K Psi / N: master weights included
  /// Sum of the three categories.
  constexpr double total() const noexcept { return parameters + gradients + optimizer_states; }
};

/// The model-state memory per device of a model with `psi` parameter elements on `n` devices at
/// ZeRO `stage` (0-3), with element sizes `bytes` (the table in the file comment).
/// Preconditions: n >= 1, 0 <= stage <= 3 (a stage outside that range is treated as 3).
constexpr model_memory model_state_memory(double psi, double n, int stage, element_bytes bytes) noexcept {
  model_memory m;
  m.parameters = bytes.parameter * psi / (stage >= 3 ? n : 1.0);
  m.gradients = bytes.gradient * psi / (stage >= 2 ? n : 1.0);
  m.optimizer_states = bytes.optimizer * psi / (stage >= 1 ? n : 1.0);
  return m;
}

/// The paper's formulas under its own assumptions (mixed-precision Adam, 2 + 2 + K bytes with
/// K = `k`, 12 by default): 16 Psi, 4 Psi + 12 Psi/N, 2 Psi + 14 Psi/N, 16 Psi/N for stages 0-3.
constexpr model_memory paper_model_state_memory(double psi, double n, int stage, double k = 12) noexcept {
  return model_state_memory(psi, n, stage, element_bytes{2, 2, k});
}

}  // namespace ringzero::zero
