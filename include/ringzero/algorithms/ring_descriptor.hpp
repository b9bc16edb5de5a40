#pragma once
/// @file
/// The `ring` algorithm's descriptor: every collective over point-to-point transfers (any
/// backend), the schedules of algorithm/ring.hpp, and their cost (Patarasuk & Yuan 2009 for the
/// ring; the terms of algorithm/cost_terms.hpp). docs/algorithms.md has the cost table.

#include <algorithm>
#include <cmath>

#include "ringzero/algorithms/algorithm_descriptor.hpp"
#include "ringzero/algorithms/cost_terms.hpp"
#include "ringzero/algorithms/ring.hpp"

namespace ringzero::algorithms {

namespace detail {
/// ring's collectives: all but send and recv; the barrier is a dissemination barrier.
inline constexpr collective_entry ring_collectives[] = {
    {collective_kind::all_reduce, ring_all_reduce,
     [](int n, double bytes, const link_model& m) {
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + 2 * (t.nn - 1) * t.step_alpha(t.S / t.nn) + (t.nn - 1) / t.nn * t.S * (2 * t.b + t.g);
     }},
    {collective_kind::reduce_scatter, ring_reduce_scatter,
     [](int n, double bytes, const link_model& m) {
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + t.ring_reduce_scatter();
     }},
    {collective_kind::all_gather, ring_all_gather,
     [](int n, double bytes, const link_model& m) {
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + t.gather() + t.own_block_copy();
     }},
    {collective_kind::broadcast, ring_broadcast,
     [](int n, double bytes, const link_model& m) {  // a chain pipelined in slices
       const cost_terms t(n, bytes, m);
       const double slices = std::max(1.0, std::ceil(t.S / static_cast<double>(ring_broadcast_slice_bytes)));
       return t.rendezvous() + (t.nn - 2 + slices) * (t.a + t.S / slices * t.b) + t.root_copy();
     }},
    {collective_kind::reduce, ring_reduce,
     [](int n, double bytes, const link_model& m) {
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + t.ring_reduce_scatter() + t.gather();
     }},
    {collective_kind::all_to_all, ring_all_to_all,
     [](int n, double bytes, const link_model& m) {
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + (t.nn - 1) * (t.a + t.S / t.nn * t.b) + t.own_block_copy();
     }},
    {collective_kind::barrier, dissemination_barrier,
     [](int n, double bytes, const link_model& m) {
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + 1e-3;  // ranks just above direct's, below halving_doubling's
     }},
};
}  // namespace detail

/// ring: bandwidth-optimal over point-to-point transfers; results identical run to run.
inline constexpr algorithm_descriptor ring_descriptor{algorithm::ring, detail::ring_collectives, false, false,
                                                      "point-to-point transfers (every backend)"};

}  // namespace ringzero::algorithms
