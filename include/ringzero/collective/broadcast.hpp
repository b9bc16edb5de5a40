#pragma once
/// @file
/// broadcast: every rank receives the root's buffer (ncclBroadcast).

#include <cstdint>
#include <span>

#include "ringzero/collective/request.hpp"
#include "ringzero/core/dtype.hpp"
#if !defined(RINGZERO_SEPARATE_COMPILATION)
#include "ringzero/collective/dispatch.hpp"  // the core's definitions (collective/request.hpp)
#endif

namespace ringzero {

/// Copies `count` elements from the root's `send` into every rank's `recv` (the root's too).
/// `send` is read on the root only (ignored, may be null, elsewhere). In place when
/// `send == recv` on the root. `root` in [0, world_size) and equal on every rank.
/// Errors and thread semantics as `all_reduce`; the result is a copy, bitwise exact.
inline void broadcast(communicator& comm, const void* send, void* recv, std::uint64_t count, dtype type, int root,
                      const collective_options& options = {}) {
  detail::run_blocking(comm,
                       detail::make_request(collective_kind::broadcast, send, recv, count, type, {}, root, options));
}

/// Asynchronous `broadcast` (see `all_reduce_async` for the handle's semantics).
inline work broadcast_async(communicator& comm, const void* send, void* recv, std::uint64_t count, dtype type, int root,
                            const collective_options& options = {}) {
  return detail::issue(
      comm, detail::make_request(collective_kind::broadcast, send, recv, count, type, {}, root, options), true);
}

/// Typed in-place `broadcast` of `buffer` from `root`.
template <element_type T>
void broadcast(communicator& comm, std::span<T> buffer, int root, const collective_options& options = {}) {
  broadcast(comm, buffer.data(), buffer.data(), buffer.size(), dtype_of<T>, root, options);
}

}  // namespace ringzero
