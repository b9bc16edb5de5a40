#pragma once
/// @file
/// Sums and products of 64-bit sizes that report overflow instead of wrapping: element counts
/// times dtype sizes, shapes, offsets and paddings, checked before any buffer is touched. Every
/// layer uses these (collectives, DDP bucket assignment, ZeRO shard plans, checkpoints).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>

namespace ringzero::detail {

/// `a + b` or std::nullopt on 64-bit overflow.
inline std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) noexcept {
  if (a > std::numeric_limits<std::uint64_t>::max() - b) return std::nullopt;
  return a + b;
}

/// `a * b` or std::nullopt on 64-bit overflow.
inline std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) noexcept {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

/// `x` rounded up to a multiple of `m` (m >= 1), or std::nullopt on 64-bit overflow.
inline std::optional<std::uint64_t> checked_round_up(std::uint64_t x, std::uint64_t m) noexcept {
  const std::uint64_t r = x % m;
  if (r == 0) return x;
  if (x > std::numeric_limits<std::uint64_t>::max() - (m - r)) return std::nullopt;
  return x + (m - r);
}

/// `a * b` bytes, or std::nullopt when that is more than any buffer can hold: a pointer plus
/// the size must not overflow (PTRDIFF_MAX bytes, the most a C++ object may span).
inline std::optional<std::uint64_t> checked_buffer_bytes(std::uint64_t a, std::uint64_t b) noexcept {
  const auto bytes = checked_mul(a, b);
  if (!bytes || *bytes > static_cast<std::uint64_t>(std::numeric_limits<std::ptrdiff_t>::max())) return std::nullopt;
  return bytes;
}

}  // namespace ringzero::detail
