#pragma once
/// @file
/// The `direct` algorithm's descriptor: every collective on shared memory (each rank reads its
/// peers' buffers in place; the local backend), the schedules of algorithm/direct.hpp, and their
/// cost in memory traffic (mu) and direct's L1 tile (cache). docs/algorithms.md has the table.

#include "ringzero/algorithms/algorithm_descriptor.hpp"
#include "ringzero/algorithms/cost_terms.hpp"
#include "ringzero/algorithms/direct.hpp"

namespace ringzero::algorithms {

namespace detail {
/// Reductions read S and write S/n through the tile; copies read and write S.
inline double direct_copy_us(int n, double bytes, const link_model& m) {
  const cost_terms t(n, bytes, m);
  return t.rendezvous() + 2 * t.S * t.mu;
}
inline double direct_reduce_us(int n, double bytes, const link_model& m) {
  const cost_terms t(n, bytes, m);
  return t.rendezvous() + (t.S + t.S / t.nn) * t.mu + 2 * t.S / t.nn * t.cache;
}

/// direct's collectives: all but send and recv; the barrier moves nothing (begin and end
/// already synchronise every rank).
inline constexpr collective_entry direct_collectives[] = {
    {collective_kind::all_reduce, direct_all_reduce,
     [](int n, double bytes, const link_model& m) {
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + 2 * t.S * t.mu + (t.S + t.S / t.nn) * t.cache;
     }},
    {collective_kind::reduce_scatter, direct_reduce_scatter, direct_reduce_us},
    {collective_kind::all_gather, direct_all_gather, direct_copy_us},
    {collective_kind::broadcast, direct_broadcast, direct_copy_us},
    {collective_kind::reduce, direct_reduce, direct_reduce_us},
    {collective_kind::all_to_all, direct_all_to_all, direct_copy_us},
    {collective_kind::barrier, [](const call&) {},
     [](int n, double bytes, const link_model& m) { return cost_terms(n, bytes, m).rendezvous(); }},
};
}  // namespace detail

/// direct: zero-copy on shared memory; widens 16-bit sums in its own tiles.
inline constexpr algorithm_descriptor direct_descriptor{algorithm::direct, detail::direct_collectives, true, false,
                                                        "shared memory between ranks (local backend)"};

}  // namespace ringzero::algorithms
