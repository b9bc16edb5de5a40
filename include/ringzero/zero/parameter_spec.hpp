#pragma once
/// @file
/// `zero::parameter_spec`: what the ZeRO shard planner and the sharded runtime know about one
/// model parameter: its name, shape, element type, whether it is trained, which parameters share
/// its storage (a tie group) and which gather unit (wrapping unit) it belongs to.
///
/// Pure values; no allocation beyond the strings and the shape.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ringzero/core/checked_arithmetic.hpp"
#include "ringzero/core/dtype.hpp"

namespace ringzero::zero {

/// One parameter of a model, as the trainer registers it.
///
/// - `shape`: dimensions in elements, outermost first (as PyTorch prints them); an empty shape
///   is a scalar (1 element); a zero dimension makes a zero-size parameter (0 elements), which is
///   planned (it has a place and a name) but owns no storage.
/// - `type`: the element type the trainer stores and computes with (the "training parameter"
///   dtype). Unset: the planner uses `precision::parameter` (see zero/precision.hpp).
/// - `trainable`: false for a frozen parameter: it has no gradient, no master weights and no
///   optimizer state, but it is still stored (and sharded at stage 3).
/// - `tie_group`: parameters with the same non-empty tie group share one storage (PyTorch's tied
///   weights, e.g. GPT-2's token embedding and output projection). They must agree in shape,
///   dtype and `trainable`. The first member in registration order owns the storage; the others
///   are aliases of it. The trainer accumulates the gradients of every use into that one storage.
/// - `unit`: the gather unit (FSDP's wrapping unit, usually one layer or transformer block).
///   Parameters naming the same unit form one unit, wherever they appear. Parameters with an
///   empty unit are grouped in registration order into automatic units of at most
///   `plan_request::unit_bytes` bytes each (PyTorch's size-based wrapping policy).
struct parameter_spec {
  std::string name;                  ///< unique name, e.g. "h.0.attn.c_attn.weight"
  std::vector<std::uint64_t> shape;  ///< dimensions in elements; empty: a scalar
  std::optional<dtype> type;         ///< element type; unset: `precision::parameter`
  bool trainable = true;             ///< false: frozen (no gradient, no optimizer state)
  std::string tie_group;             ///< shared storage group; empty: not tied
  std::string unit;                  ///< gather unit name; empty: automatic

  /// Number of elements: the product of `shape` (1 for a scalar), or std::nullopt when the
  /// product overflows 64 bits.
  std::optional<std::uint64_t> numel() const noexcept {
    std::uint64_t n = 1;
    for (std::uint64_t d : shape) {
      if (d == 0) return 0;
      const std::optional<std::uint64_t> product = ringzero::detail::checked_mul(n, d);
      if (!product) {
        // a later zero dimension would still make it zero
        for (std::uint64_t e : shape)
          if (e == 0) return 0;
        return std::nullopt;
      }
      n = *product;
    }
    return n;
  }

  friend bool operator==(const parameter_spec&, const parameter_spec&) = default;
};

/// "[768, 2304]" (or "[]" for a scalar): a shape as PyTorch prints it, for messages and tables.
inline std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace ringzero::zero
