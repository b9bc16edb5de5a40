#pragma once
/// @file
/// Reduction operators: sum, prod, min, max, avg and premul_sum(scalar), with NCCL's meaning.
/// The manual: docs/algorithms.md, "Header notes", `ringzero/core/reduce_op.hpp`.

#include <cstdint>
#include <optional>
#include <string_view>

#include "ringzero/core/enum_names.hpp"

namespace ringzero {

/// Which reduction. The numbering is stable (exchanged between processes).
enum class reduce_kind : std::uint8_t { sum = 0, prod = 1, min = 2, max = 3, avg = 4, premul_sum = 5 };

/// Number of `reduce_kind` enumerators.
inline constexpr int reduce_kind_count = 6;

/// True when `k` is one of the enumerators.
constexpr bool is_valid(reduce_kind k) noexcept {
  return static_cast<unsigned>(k) < static_cast<unsigned>(reduce_kind_count);
}

/// Name as nccl-tests prints it: "sum", "prod", "min", "max", "avg", "premulsum"; "invalid" otherwise.
inline constexpr enum_names<reduce_kind, reduce_kind_count> reduce_kind_names{"sum", "prod", "min",
                                                                              "max", "avg",  "premulsum"};
/// The name of `k` (`reduce_kind_names`).
constexpr std::string_view reduce_kind_name(reduce_kind k) noexcept { return reduce_kind_names(k); }

/// Parses a name printed by `reduce_kind_name` (also "premul_sum"); std::nullopt when unknown.
constexpr std::optional<reduce_kind> parse_reduce_kind(std::string_view s) noexcept {
  if (s == "premul_sum") return reduce_kind::premul_sum;
  return reduce_kind_names.parse(s);
}

/// A reduction operator: a kind, plus the scalar of premul_sum.
/// Implicitly constructible from a `reduce_kind`, so `reduce_kind::sum` can be passed wherever a
/// `reduce_op` is expected; build premul_sum with `reduce_op::premul_sum(s)`.
struct reduce_op {
  reduce_kind kind = reduce_kind::sum;  ///< which reduction
  double scalar = 1.0;                  ///< multiplier of premul_sum; ignored by the other kinds

  constexpr reduce_op() noexcept = default;
  /// The operator `k` (for premul_sum the scalar is 1).
  constexpr reduce_op(reduce_kind k) noexcept : kind(k) {}  // NOLINT(google-explicit-constructor)
  /// premul_sum with multiplier `s`: result = sum over ranks of s_rank * x_rank.
  static constexpr reduce_op premul_sum(double s) noexcept {
    reduce_op op(reduce_kind::premul_sum);
    op.scalar = s;
    return op;
  }
};

}  // namespace ringzero
