#pragma once
/// @file
/// Algorithm selection: which algorithms implement which collective and what each costs (both
/// read from the descriptors of algorithms/algorithm_table.hpp), the cost model that picks one,
/// and how per-call options and RINGZERO_ALGO override it.
/// The manual: docs/algorithms.md, "Header notes", `ringzero/collective/selection.hpp`.

#include <cmath>
#include <optional>
#include <string>

#include "ringzero/algorithms/algorithm_table.hpp"
#include "ringzero/backend/communicator.hpp"
#include "ringzero/collective/options.hpp"

namespace ringzero {

/// True when `a` can run collective `k` on communicator `c`.
inline bool algorithm_available(const communicator& c, algorithm a, collective_kind k) noexcept {
  return a != algorithm::automatic && algorithm_implements(a, k) && detail::transport_of(c).supports(a, k);
}

/// The model's estimate in microseconds of collective `k` with algorithm `a` on `n` ranks moving
/// `bytes` (S in docs/algorithms.md) under `m`, the rendezvous (2s) included: the cost formula
/// of `a`'s descriptor for `k`. +infinity for an algorithm without a formula (native) and for a
/// collective the algorithm does not implement.
inline double estimate_us(collective_kind k, algorithm a, int n, double bytes, const link_model& m) noexcept {
  const algorithms::collective_entry* e = algorithms::find_collective(a, k);
  return e != nullptr && e->cost_us != nullptr ? e->cost_us(n, bytes, m) : INFINITY;
}

/// The algorithm the cost model picks for `k` on `c` with S = `bytes`: native when the backend
/// prefers it, else the backend's measured choice (`transport::tuned_choice`, a tuning table:
/// core/tuning_table.hpp) when it is available, else the cheapest estimate over the table's
/// available algorithms (the earlier on a tie), else the first available algorithm without a
/// formula (native).
inline algorithm model_choice(const communicator& comm, collective_kind k, double bytes) noexcept {
  const transport& c = detail::transport_of(comm);
  if (c.prefers_native(k) && algorithm_available(comm, algorithm::native, k)) return algorithm::native;
  if (const std::optional<algorithm> tuned = c.tuned_choice(k, bytes); tuned && algorithm_available(comm, *tuned, k))
    return *tuned;
  const link_model m = c.link();
  algorithm best = algorithm::ring;  // what an automatic call names when nothing is available
  double best_cost = INFINITY;
  for (const algorithms::algorithm_descriptor& d : algorithms::algorithm_table) {
    const algorithms::collective_entry* e = d.find(k);
    if (e == nullptr || e->cost_us == nullptr || !c.supports(d.id, k)) continue;
    const double cost = e->cost_us(c.world_size(), bytes, m);
    if (cost < best_cost) {
      best_cost = cost;
      best = d.id;
    }
  }
  if (best_cost < INFINITY) return best;
  for (const algorithms::algorithm_descriptor& d : algorithms::algorithm_table) {  // no formula: native
    const algorithms::collective_entry* e = d.find(k);
    if (e != nullptr && e->cost_us == nullptr && c.supports(d.id, k)) return d.id;
  }
  return best;
}

/// Resolves the algorithm of one call: an explicit `requested` algorithm must be available
/// (else the returned string says why, to be reported on every rank); `automatic` takes
/// RINGZERO_ALGO (`forced`) when it is available for this collective and backend, else the model.
inline algorithm resolve_algorithm(const communicator& c, collective_kind k, double bytes, algorithm requested,
                                   algorithm forced, std::string& problem) {
  if (requested != algorithm::automatic) {
    if (algorithm_available(c, requested, k)) return requested;
    problem = "algorithm " + std::string(algorithm_name(requested)) + " is not available for " +
              std::string(collective_name(k)) + " on the " + std::string(backend_name(c.backend())) + " backend";
    return requested;
  }
  if (forced != algorithm::automatic && algorithm_available(c, forced, k)) return forced;
  return model_choice(c, k, bytes);
}

}  // namespace ringzero
