#pragma once
/// @file
/// `cost_terms`: the alpha-beta-gamma terms that the algorithms' cost formulas share (Hockney's
/// model; Thakur, Rabenseifner & Gropp 2005), from a world size, the bytes S and a link model.
/// The formulas themselves sit in each algorithm's descriptor; docs/algorithms.md has the table.

#include "ringzero/algorithms/partition.hpp"
#include "ringzero/backend/transport.hpp"

namespace ringzero::algorithms {

/// The terms of one estimate (units: microseconds, bytes, microseconds per byte).
struct cost_terms {
  double nn, p, log_p, S;        ///< n, the largest power of two <= n, log2(p), bytes
  double a, b, g, s, mu, cache;  ///< alpha, beta, gamma, sync, memory, direct's tile
  double eager;                  ///< link_model::eager_bytes (0: no limit)
  bool rem;                      ///< n is not a power of two

  cost_terms(int n, double bytes, const link_model& m) noexcept {
    const hd_layout layout(n);
    nn = n;
    p = layout.p;
    log_p = layout.steps();
    S = bytes;
    a = m.alpha_us;
    b = m.beta_us_per_byte;
    g = m.gamma_us_per_byte;
    s = m.sync_us;
    mu = m.memory_us_per_byte;
    cache = m.cache_us_per_byte;
    eager = m.eager_bytes;
    rem = layout.rem > 0;
  }
  /// The alpha of one step moving `message` bytes: one more past the eager limit (a rendezvous).
  double step_alpha(double message) const noexcept { return past_eager_limit(eager, message) ? 2 * a : a; }
  /// begin + end, paid by every algorithm.
  double rendezvous() const noexcept { return 2 * s; }
  /// The own block copied into the output (read + write).
  double own_block_copy() const noexcept { return 2 * S / nn * mu; }
  /// broadcast: the root copies its input first.
  double root_copy() const noexcept { return 2 * S * mu; }
  /// Ring reduce-scatter: n-1 steps, each moving and combining S/n.
  double ring_reduce_scatter() const noexcept { return (nn - 1) * a + (nn - 1) / nn * S * (b + g); }
  /// Recursive-halving reduce-scatter, with the fold of the ranks beyond p.
  double hd_reduce_scatter() const noexcept {
    return log_p * a + (p - 1) / p * S * (b + g) + (rem ? 2 * a + S * (b + g) + S / nn * b : 0.0);
  }
  /// Recursive-doubling all-gather, with the unfold of the ranks beyond p.
  double hd_all_gather() const noexcept {
    return log_p * a + (p - 1) / p * S * b + (rem ? 2 * a + S / nn * b + S * b : 0.0);
  }
  /// A linear gather (or scatter) of n-1 blocks of S/n.
  double gather() const noexcept { return (nn - 1) * a + (nn - 1) / nn * S * b; }
};

}  // namespace ringzero::algorithms
