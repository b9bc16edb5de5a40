#pragma once
/// @file
/// Algorithm selection: which algorithms implement which collective, the cost model that picks
/// one, and how per-call options and RINGZERO_ALGO override it.
/// The manual: docs/algorithms.md, "Header notes", `ringzero/collective/selection.hpp`.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "ringzero/algorithm/halving_doubling.hpp"
#include "ringzero/algorithm/partition.hpp"
#include "ringzero/algorithm/ring.hpp"
#include "ringzero/backend/communicator.hpp"
#include "ringzero/collective/options.hpp"

namespace ringzero {

/// True when ringzero has algorithm `a` for collective `k` (independent of the backend).
constexpr bool algorithm_implements(algorithm a, collective_kind k) noexcept {
  switch (a) {
    case algorithm::ring:
    case algorithm::direct:
    case algorithm::native: return k != collective_kind::send && k != collective_kind::recv;
    case algorithm::halving_doubling:
      return k != collective_kind::all_to_all && k != collective_kind::send && k != collective_kind::recv;
    case algorithm::automatic: return true;
  }
  return false;
}

/// True when `a` can run collective `k` on communicator `c`.
inline bool algorithm_available(const communicator& c, algorithm a, collective_kind k) noexcept {
  return a != algorithm::automatic && algorithm_implements(a, k) && c.supports(a, k);
}

/// The model's estimate in microseconds of collective `k` with algorithm `a` on `n` ranks moving
/// `bytes` (S in the table above) under `m`, the rendezvous (2s) included. +infinity for an
/// algorithm without a formula (native).
inline double estimate_us(collective_kind k, algorithm a, int n, double bytes, const link_model& m) noexcept {
  const algorithms::hd_layout layout(n);
  const double nn = n, p = layout.p, log_p = layout.steps(), S = bytes;
  const double a_ = m.alpha_us, b = m.beta_us_per_byte, g = m.gamma_us_per_byte, s = m.sync_us,
               mu = m.memory_us_per_byte;
  const double c = m.cache_us_per_byte;
  const bool rem = layout.rem > 0;
  const double rendezvous = 2 * s;                // begin + end, paid by every algorithm
  const double own_block_copy = 2 * S / nn * mu;  // the own block into the output (read + write)
  const double root_copy = 2 * S * mu;            // broadcast: the root copies its input first
  auto ring_rs = [&] { return (nn - 1) * a_ + (nn - 1) / nn * S * (b + g); };
  auto hd_rs = [&] { return log_p * a_ + (p - 1) / p * S * (b + g) + (rem ? 2 * a_ + S * (b + g) + S / nn * b : 0.0); };
  auto hd_ag = [&] { return log_p * a_ + (p - 1) / p * S * b + (rem ? 2 * a_ + S / nn * b + S * b : 0.0); };
  auto gather = [&] { return (nn - 1) * a_ + (nn - 1) / nn * S * b; };
  switch (a) {
    case algorithm::direct:
      switch (k) {
        case collective_kind::reduce_scatter:
        case collective_kind::reduce: return rendezvous + (S + S / nn) * mu + 2 * S / nn * c;
        case collective_kind::all_reduce: return rendezvous + 2 * S * mu + (S + S / nn) * c;
        case collective_kind::barrier: return rendezvous;
        default: return rendezvous + 2 * S * mu;
      }
    case algorithm::ring:
      switch (k) {
        case collective_kind::all_reduce: return rendezvous + 2 * (nn - 1) * a_ + (nn - 1) / nn * S * (2 * b + g);
        case collective_kind::reduce_scatter: return rendezvous + ring_rs();
        case collective_kind::all_gather: return rendezvous + gather() + own_block_copy;
        case collective_kind::broadcast: {
          const double slices =
              std::max(1.0, std::ceil(S / static_cast<double>(algorithms::ring_broadcast_slice_bytes)));
          return rendezvous + (nn - 2 + slices) * (a_ + S / slices * b) + root_copy;
        }
        case collective_kind::reduce: return rendezvous + ring_rs() + gather();
        case collective_kind::all_to_all: return rendezvous + (nn - 1) * (a_ + S / nn * b) + own_block_copy;
        case collective_kind::barrier: return rendezvous + 1e-3;
        default: break;
      }
      break;
    case algorithm::halving_doubling:
      switch (k) {
        case collective_kind::all_reduce:  // the cheaper of Rabenseifner's and recursive doubling
          return rendezvous + std::min(algorithms::hd_rabenseifner_us(n, S, a_, b, g),
                                       algorithms::hd_recursive_doubling_us(n, S, a_, b, g));
        case collective_kind::reduce_scatter: return rendezvous + hd_rs();
        case collective_kind::all_gather: return rendezvous + hd_ag() + own_block_copy;
        case collective_kind::broadcast: return rendezvous + gather() + hd_ag() + root_copy;
        case collective_kind::reduce: return rendezvous + hd_rs() + gather();
        case collective_kind::barrier: return rendezvous + 2e-3;
        default: break;
      }
      break;
    default: break;
  }
  return INFINITY;
}

/// The algorithm the cost model picks for `k` on `c` with S = `bytes`.
inline algorithm model_choice(const communicator& c, collective_kind k, double bytes) noexcept {
  if (c.prefers_native(k) && algorithm_available(c, algorithm::native, k)) return algorithm::native;
  const link_model m = c.link();
  algorithm best = algorithm::ring;
  double best_cost = INFINITY;
  for (algorithm a : {algorithm::direct, algorithm::ring, algorithm::halving_doubling}) {
    if (!algorithm_available(c, a, k)) continue;
    const double cost = estimate_us(k, a, c.world_size(), bytes, m);
    if (cost < best_cost) {
      best_cost = cost;
      best = a;
    }
  }
  if (best_cost == INFINITY && algorithm_available(c, algorithm::native, k)) return algorithm::native;
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
