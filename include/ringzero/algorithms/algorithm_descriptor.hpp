#pragma once
/// @file
/// `algorithm_descriptor`: everything about one algorithm in one value: which collectives it
/// implements, how it runs each (a function over `call`), what the cost model says each costs,
/// and how dispatch treats its data. Selection (collective/selection.hpp) and dispatch
/// (collective/dispatch.hpp) loop over `algorithm_table` (algorithm_table.hpp) instead of
/// switching on the algorithm. How to add an algorithm: docs/algorithms.md.

#include <span>
#include <string_view>

#include "ringzero/algorithms/call.hpp"
#include "ringzero/core/algorithm.hpp"

namespace ringzero::algorithms {

/// How one algorithm runs one collective kind and what it costs.
struct collective_entry {
  collective_kind kind = collective_kind::barrier;
  /// Runs the collective on n >= 2 ranks with count > 0 (a barrier: count 0), between the
  /// backend's begin and end. Throws ringzero::error on failure.
  void (*run)(const call& c) = nullptr;
  /// The model's estimate in microseconds on `n` ranks moving `bytes` (S, docs/algorithms.md)
  /// under `m`, the rendezvous included; nullptr when the algorithm has no formula (the model
  /// then never picks it over one that has).
  double (*cost_us)(int n, double bytes, const link_model& m) = nullptr;
};

/// One algorithm: its identity, its collectives (each kind at most once) and its data handling.
/// None of today's algorithms limits dtype, op or world size: every dtype and op runs (16-bit
/// sums accumulate in float32, see `widens_16bit_sums`), on any world size (a world of one is
/// a copy done by dispatch unless `backend_moves_data`). The backend says which algorithms it
/// offers (transport::supports).
struct algorithm_descriptor {
  algorithm id = algorithm::automatic;
  std::span<const collective_entry> collectives;
  /// True when the schedule accumulates 16-bit sums in float32 itself; otherwise dispatch runs
  /// it on a float32 copy of the input (float32_accumulation.hpp).
  bool widens_16bit_sums = false;
  /// True when the backend's own collective moves the data: ringzero's data operations (and
  /// CUDA kernels) are not needed, and a world of one on device memory still runs it.
  bool backend_moves_data = false;
  /// What the backend must offer, in words (for docs and messages).
  std::string_view requires_backend;

  /// The entry for collective `k`, or nullptr when this algorithm does not implement it.
  constexpr const collective_entry* find(collective_kind k) const noexcept {
    for (const collective_entry& e : collectives)
      if (e.kind == k) return &e;
    return nullptr;
  }
};

}  // namespace ringzero::algorithms
