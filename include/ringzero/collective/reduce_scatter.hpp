#pragma once
/// @file
/// reduce_scatter: rank r receives block r of the element-wise reduction (ncclReduceScatter).

#include <cstdint>
#include <span>

#include "ringzero/collective/request.hpp"
#include "ringzero/core/dtype.hpp"
#if !defined(RINGZERO_SEPARATE_COMPILATION)
#include "ringzero/collective/dispatch.hpp"  // the core's definitions (collective/request.hpp)
#endif

namespace ringzero {

/// Reduces every rank's `send` (world_size * `recv_count` elements) with `op`; rank r receives
/// elements [r*recv_count, (r+1)*recv_count) of the result in `recv` (`recv_count` elements).
/// In place when `recv == send + rank*recv_count` (NCCL's convention).
/// Errors, thread semantics and determinism as `all_reduce`; follows ncclReduceScatter.
inline void reduce_scatter(communicator& comm, const void* send, void* recv, std::uint64_t recv_count, dtype type,
                           reduce_op op, const collective_options& options = {}) {
  detail::run_blocking(
      comm, detail::make_request(collective_kind::reduce_scatter, send, recv, recv_count, type, op, -1, options));
}

/// Asynchronous `reduce_scatter` (see `all_reduce_async` for the handle's semantics).
inline work reduce_scatter_async(communicator& comm, const void* send, void* recv, std::uint64_t recv_count, dtype type,
                                 reduce_op op, const collective_options& options = {}) {
  return detail::issue(
      comm, detail::make_request(collective_kind::reduce_scatter, send, recv, recv_count, type, op, -1, options), true);
}

/// Typed `reduce_scatter`: `send.size()` must be world_size * `recv.size()`.
template <element_type T>
void reduce_scatter(communicator& comm, std::span<const T> send, std::span<T> recv, reduce_op op = reduce_kind::sum,
                    const collective_options& options = {}) {
  auto q = detail::make_request(collective_kind::reduce_scatter, send.data(), recv.data(), recv.size(), dtype_of<T>, op,
                                -1, options);
  q.invalid = detail::span_mismatch(send.size(), recv.size() * static_cast<std::uint64_t>(comm.world_size()),
                                    recv.size(), recv.size());
  detail::run_blocking(comm, q);
}

}  // namespace ringzero
