#pragma once
/// @file
/// `algorithm_table`: every algorithm's descriptor, in the order the cost model breaks ties
/// (direct, ring, halving_doubling, native), and the lookup that selection and dispatch use.
/// Adding an algorithm is adding its descriptor here (docs/algorithms.md).

#include <cstddef>
#include <iterator>
#include <span>

#include "ringzero/algorithms/algorithm_descriptor.hpp"
#include "ringzero/algorithms/direct_descriptor.hpp"
#include "ringzero/algorithms/halving_doubling_descriptor.hpp"
#include "ringzero/algorithms/native_descriptor.hpp"
#include "ringzero/algorithms/ring_descriptor.hpp"

namespace ringzero::algorithms {

/// The descriptors of every algorithm; on equal estimates the earlier one wins.
inline constexpr algorithm_descriptor algorithm_table[] = {direct_descriptor, ring_descriptor,
                                                           halving_doubling_descriptor, native_descriptor};

/// The descriptor of `a` in `table`, or nullptr (`automatic` has none).
constexpr const algorithm_descriptor* find_algorithm(
    algorithm a, std::span<const algorithm_descriptor> table = algorithm_table) noexcept {
  for (const algorithm_descriptor& d : table)
    if (d.id == a) return &d;
  return nullptr;
}

/// The entry that runs collective `k` with algorithm `a` in `table`, or nullptr.
constexpr const collective_entry* find_collective(
    algorithm a, collective_kind k, std::span<const algorithm_descriptor> table = algorithm_table) noexcept {
  const algorithm_descriptor* d = find_algorithm(a, table);
  return d == nullptr ? nullptr : d->find(k);
}

namespace detail {
/// True when every descriptor has an entry for exactly the collectives `algorithm_implements`
/// (core/algorithm.hpp) names. By index, comparing no pointers: g++ under
/// -fsanitize=address,undefined does not evaluate a pointer's comparison with null as a constant.
constexpr bool table_matches_algorithm_implements() noexcept {
  for (std::size_t a = 0; a < std::size(algorithm_table); ++a)
    for (int i = 0; i < collective_kind_count; ++i) {
      const auto k = static_cast<collective_kind>(i);
      bool has = false;
      for (std::size_t j = 0; j < algorithm_table[a].collectives.size(); ++j)
        has = has || algorithm_table[a].collectives[j].kind == k;
      if (has != algorithm_implements(algorithm_table[a].id, k)) return false;
    }
  return true;
}
}  // namespace detail
static_assert(detail::table_matches_algorithm_implements(),
              "algorithm_implements (core/algorithm.hpp) and the algorithm table disagree: update both");

/// True when `a` is an algorithm whose backend moves the data itself (native).
constexpr bool backend_moves_data(algorithm a) noexcept {
  const algorithm_descriptor* d = find_algorithm(a);
  return d != nullptr && d->backend_moves_data;
}

/// True when `a`'s schedule accumulates 16-bit sums in float32 itself (direct).
constexpr bool widens_16bit_sums(algorithm a) noexcept {
  const algorithm_descriptor* d = find_algorithm(a);
  return d != nullptr && d->widens_16bit_sums;
}

}  // namespace ringzero::algorithms
