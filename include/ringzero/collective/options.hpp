#pragma once
/// @file
/// `collective_options`: per-call settings of a collective.

#include <cstdint>
#include <string>

#include "ringzero/core/algorithm.hpp"

namespace ringzero {

/// How the errors of the contract check name a call's tag (collective_options::tag_name):
/// `name(context, tag)` returns a description of the call that `tag` labels (e.g. "all_gather of
/// unit 'h.3'"). It must be a pure function of the tag, the same on every rank, because each rank
/// names every rank's tag with its own namer; it runs where the check runs (the calling rank's
/// thread, or its communicator's progress thread for an asynchronous call), while the call is in
/// flight, only when a check fails, and must not throw. `context` must outlive the call. Empty
/// (`name` null): tags print as hexadecimal numbers.
struct tag_namer {
  std::string (*name)(const void* context, std::uint64_t tag) noexcept = nullptr;
  const void* context = nullptr;
  explicit operator bool() const noexcept { return name != nullptr; }
};

/// Per-call settings of a collective (the defaults suit almost every call).
struct collective_options {
  /// The algorithm. `automatic` uses RINGZERO_ALGO when set (and available for this collective
  /// and backend), else the cost model (collective/selection.hpp). An explicit algorithm that
  /// the collective or backend does not offer is an invalid argument, reported on every rank.
  /// All ranks must resolve to the same algorithm (checked).
  algorithm algo = algorithm::automatic;
  /// A label the caller gives this call (Gloo's per-collective tag), which every rank must give
  /// alike: where the backend checks the contract (always on the local backend, in MPI's and
  /// NCCL's check mode) a difference is errc::contract_mismatch on every rank ("tag mismatch:
  /// rank 0: 3; rank 1: 4") and no rank runs the call. It tells apart calls that would
  /// otherwise look alike (same collective, count and dtype), such as the gathers of two
  /// same-sized units issued in different orders on different ranks. 0 (the default) is a tag
  /// like any other. It does not change which data is exchanged.
  std::uint64_t tag = 0;
  /// Names the tags in errors (see tag_namer): where the contract check finds a mismatch, the
  /// message names each rank's call through this rank's namer ("tag mismatch: rank 0: all_gather
  /// of unit 'h.1' ...; rank 1: all_gather of unit 'h.0' ..."), and other mismatches (count,
  /// dtype, ...) add the calls' names. Local: not compared between ranks, never sent.
  tag_namer tag_name;
  /// Reproducible mode (docs/numerics.md): all_reduce, reduce_scatter and reduce of float16,
  /// bfloat16, float32 or float64 with sum, avg or premul_sum return a result that depends only
  /// on the ranks' inputs, not on world size, rank order, algorithm or backend. Other dtypes and
  /// ops are errc::invalid_argument (naming both) on every rank; device memory is
  /// errc::unsupported. false: RINGZERO_REPRODUCIBLE (communicator::reproducible()) decides,
  /// which applies only where it can and refuses floating prod. Must match on every rank (checked).
  bool reproducible = false;
};

}  // namespace ringzero
