#pragma once
/// @file
/// The `halving_doubling` algorithm's descriptor: every collective but all_to_all over
/// point-to-point transfers (any backend), the schedules of algorithm/halving_doubling.hpp, and
/// their cost (Thakur, Rabenseifner & Gropp 2005; van de Geijn for broadcast).
/// docs/algorithms.md has the cost table.

#include <algorithm>

#include "ringzero/algorithms/algorithm_descriptor.hpp"
#include "ringzero/algorithms/cost_terms.hpp"
#include "ringzero/algorithms/halving_doubling.hpp"
#include "ringzero/algorithms/ring.hpp"

namespace ringzero::algorithms {

namespace detail {
/// halving_doubling's collectives: no all_to_all; the barrier is a dissemination barrier.
inline constexpr collective_entry halving_doubling_collectives[] = {
    {collective_kind::all_reduce, hd_all_reduce,
     [](int n, double bytes, const link_model& m) {  // the cheaper of Rabenseifner's and recursive doubling
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + std::min(hd_rabenseifner_us(n, t.S, t.a, t.b, t.g, t.eager),
                                        hd_recursive_doubling_us(n, t.S, t.a, t.b, t.g, t.eager));
     }},
    {collective_kind::reduce_scatter, hd_reduce_scatter,
     [](int n, double bytes, const link_model& m) {
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + t.hd_reduce_scatter();
     }},
    {collective_kind::all_gather, hd_all_gather,
     [](int n, double bytes, const link_model& m) {
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + t.hd_all_gather() + t.own_block_copy();
     }},
    {collective_kind::broadcast, hd_broadcast,
     [](int n, double bytes, const link_model& m) {  // scatter + all-gather
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + t.gather() + t.hd_all_gather() + t.root_copy();
     }},
    {collective_kind::reduce, hd_reduce,
     [](int n, double bytes, const link_model& m) {  // reduce-scatter + gather
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + t.hd_reduce_scatter() + t.gather();
     }},
    {collective_kind::barrier, dissemination_barrier,
     [](int n, double bytes, const link_model& m) {
       const cost_terms t(n, bytes, m);
       return t.rendezvous() + 2e-3;  // the same barrier as ring's, ranked after it
     }},
};
}  // namespace detail

/// halving_doubling: log-depth schedules over point-to-point transfers; identical run to run.
inline constexpr algorithm_descriptor halving_doubling_descriptor{algorithm::halving_doubling,
                                                                  detail::halving_doubling_collectives, false, false,
                                                                  "point-to-point transfers (every backend)"};

}  // namespace ringzero::algorithms
