// The collective sweep of one collective (chosen at build time by RZT_SWEEP_COLLECTIVE, one
// executable per collective so that they build and run in parallel): every world size of the
// sweep x every algorithm, one launch each; see sweep.hpp for what is covered.
#include <doctest/doctest.h>

#include "ringzero/core/algorithm.hpp"
#include "sweep.hpp"

#ifndef RZT_SWEEP_COLLECTIVE
#error "define RZT_SWEEP_COLLECTIVE (all_reduce, reduce_scatter, reduce, all_gather, broadcast, all_to_all, barrier)"
#endif
#define RZT_STRINGIFY_(x) #x
#define RZT_STRINGIFY(x) RZT_STRINGIFY_(x)

TEST_CASE("sweep of " RZT_STRINGIFY(RZT_SWEEP_COLLECTIVE) " over worlds 1-8 and 13 and every algorithm") {
  const ringzero::collective_kind kind = ringzero::collective_kind::RZT_SWEEP_COLLECTIVE;
  for (int world : rzt::sweep_worlds())
    for (ringzero::algorithm algo : rzt::sweep_algorithms()) rzt::check_result(rzt::sweep(kind, world, algo));
}
