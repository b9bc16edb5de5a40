#pragma once
// The collective sweep: world sizes 1-8 and 13 x counts 0, 1, 3, 7, world-1, world, world+1,
// 1000003 x every dtype x every reduce op x in place and out of place x every algorithm, for
// all_reduce, reduce_scatter, all_gather, broadcast (several roots), reduce (several roots),
// all_to_all and barrier on the local (threads) backend, with exact expected values
// (reference.hpp) compared bitwise.
//
// One `local::launch` per (collective, world, algorithm); the rank function loops over the rest
// and records mismatches in its `rank_log`; `check_result` turns them into doctest checks on
// the main thread. Every rank also records a digest of each output that must be identical on
// every rank (all_reduce, all_gather, broadcast), and `check_result` compares them.
//
// Full mode (the default) runs that whole product except at the 1000003 count on worlds 5-8
// and 13: there reduce_scatter, all_gather and all_to_all (whose buffers hold world_size
// blocks) run a rotating selection of dtypes and ops, and the other collectives every dtype and
// op in one placement each, alternating. Quick mode (-Dtest_sweep=quick,
// RINGZERO_TEST_SWEEP_QUICK; used by the ThreadSanitizer and ASan/UBSan builds) keeps every
// world, small count, dtype, op, placement, root choice and algorithm, and drops most of the
// 1000003-element calls. See `run_large` and `run_large_placement` in sweep.cpp.

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ringzero/core/algorithm.hpp"

namespace rzt {

/// What one rank saw during a sweep launch.
struct rank_log {
  std::uint64_t calls = 0;                  ///< collectives issued
  std::uint64_t failures = 0;               ///< mismatches and unexpected outcomes
  std::vector<std::string> first_failures;  ///< the first few, described
  std::vector<std::uint64_t> digests;       ///< digest of every output that must match on all ranks

  /// Records a failure (keeps the first eight descriptions).
  void fail(std::string what) {
    ++failures;
    if (first_failures.size() < 8) first_failures.push_back(std::move(what));
  }
};

/// The outcome of one launch of the sweep.
struct sweep_result {
  std::string title;         ///< "all_reduce world 4 ring"
  std::string launch_error;  ///< what `launch` threw, if anything
  std::vector<rank_log> ranks;
};

/// World sizes of the sweep: 1-8 and 13.
std::vector<int> sweep_worlds();

/// Algorithms of the sweep: ring, direct, halving_doubling.
std::vector<ringzero::algorithm> sweep_algorithms();

/// Runs the sweep of collective `kind` on `world` ranks with algorithm `algo` (one launch).
sweep_result sweep(ringzero::collective_kind kind, int world, ringzero::algorithm algo);

/// Doctest checks of a sweep's outcome, on the calling (main) thread.
inline void check_result(const sweep_result& s) {
  INFO(s.title);
  CHECK_MESSAGE(s.launch_error.empty(), s.title << ": launch threw: " << s.launch_error);
  REQUIRE(!s.ranks.empty());
  std::uint64_t calls = 0;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    const rank_log& log = s.ranks[r];
    calls += log.calls;
    std::string text;
    for (const auto& f : log.first_failures) text += "\n  " + f;
    CHECK_MESSAGE(log.failures == 0, s.title << " rank " << r << ": " << log.failures << " failures" << text);
    CHECK_MESSAGE(log.calls == s.ranks[0].calls,
                  s.title << ": rank " << r << " issued " << log.calls << " collectives, rank 0 " << s.ranks[0].calls);
    CHECK_MESSAGE(log.digests.size() == s.ranks[0].digests.size(),
                  s.title << ": rank " << r << " digest count differs");
  }
  CHECK_MESSAGE(calls > 0, s.title << ": no collective ran");
  // Bitwise identical results on every rank.
  std::uint64_t differing = 0, first = 0;
  for (std::size_t r = 1; r < s.ranks.size(); ++r) {
    const auto& a = s.ranks[0].digests;
    const auto& b = s.ranks[r].digests;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (a[i] != b[i] && differing++ == 0) first = i;
  }
  CHECK_MESSAGE(differing == 0,
                s.title << ": " << differing << " outputs differ between ranks (first: call " << first << ")");
}

}  // namespace rzt
