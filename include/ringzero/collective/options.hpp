#pragma once
/// @file
/// `collective_options`: per-call settings of a collective.

#include "ringzero/core/algorithm.hpp"

namespace ringzero {

/// Per-call settings of a collective (the defaults suit almost every call).
struct collective_options {
  /// The algorithm. `automatic` uses RINGZERO_ALGO when set (and available for this collective
  /// and backend), else the cost model (collective/selection.hpp). An explicit algorithm that
  /// the collective or backend does not offer is an invalid argument, reported on every rank.
  /// All ranks must resolve to the same algorithm (checked).
  algorithm algo = algorithm::automatic;
};

}  // namespace ringzero
