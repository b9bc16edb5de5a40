#pragma once
/// @file
/// The CUDA `fill` kernel: sets `count` elements of a dtype to a value by a launcher
/// (primitive/kernels/grid.hpp: a CUDA stream, or the host in CI), writing exactly the
/// bits of the host's `fill` (primitive/fill.hpp: the float64 value converted with the cast
/// rules, computed once on the host). 16-byte vector stores with a scalar head and tail
/// (primitive/kernels/elementwise.hpp). Returns the launcher's result.

#include <cstdint>

#include "ringzero/primitive/fill.hpp"
#include "ringzero/primitive/kernels/elementwise.hpp"

namespace ringzero::primitive::kernels {

/// Sets `count` elements of `type` at `dst` to `value` converted to `type`, by `launcher`.
/// Returns `launch_invalid_value` for an invalid dtype.
template <class Launcher>
int fill(const Launcher& launcher, void* dst, std::uint64_t count, dtype type, double value) noexcept {
  if (!is_valid(type)) return launch_invalid_value;
  if (count == 0) return launch_success;
  const std::uint64_t bits = element_pattern(type, value);
  switch (dtype_size(type)) {
    case 1: return launch_generate(launcher, static_cast<std::uint8_t*>(dst), count, static_cast<std::uint8_t>(bits));
    case 2: return launch_generate(launcher, static_cast<std::uint16_t*>(dst), count, static_cast<std::uint16_t>(bits));
    case 4: return launch_generate(launcher, static_cast<std::uint32_t*>(dst), count, static_cast<std::uint32_t>(bits));
    default: return launch_generate(launcher, static_cast<std::uint64_t*>(dst), count, bits);
  }
}

}  // namespace ringzero::primitive::kernels
