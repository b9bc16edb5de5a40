#pragma once
/// @file
/// barrier: returns on every rank once every rank has entered it.

#include "ringzero/collective/request.hpp"
#include "ringzero/core/dtype.hpp"
#if !defined(RINGZERO_SEPARATE_COMPILATION)
#include "ringzero/collective/dispatch.hpp"  // the core's definitions (collective/request.hpp)
#endif

namespace ringzero {

/// Blocks until every rank of `comm` has called `barrier` (as its next collective).
/// Errors: contract_mismatch when another rank called a different collective; timeout naming
/// the ranks that never arrived; aborted; peer_exited. Thread semantics as `all_reduce`.
inline void barrier(communicator& comm, const collective_options& options = {}) {
  detail::run_blocking(
      comm, detail::make_request(collective_kind::barrier, nullptr, nullptr, 0, dtype::uint8, {}, -1, options));
}

/// Asynchronous `barrier` (see `all_reduce_async` for the handle's semantics).
inline work barrier_async(communicator& comm, const collective_options& options = {}) {
  return detail::issue(
      comm, detail::make_request(collective_kind::barrier, nullptr, nullptr, 0, dtype::uint8, {}, -1, options), true);
}

}  // namespace ringzero
