#pragma once
/// @file
/// all_reduce: every rank receives the element-wise reduction of all ranks' inputs
/// (ncclAllReduce semantics).

#include <cstdint>
#include <span>

#include "ringzero/collective/request.hpp"
#include "ringzero/core/dtype.hpp"
#if !defined(RINGZERO_SEPARATE_COMPILATION)
#include "ringzero/collective/dispatch.hpp"  // the core's definitions (collective/request.hpp)
#endif

namespace ringzero {

/// Reduces `count` elements of `type` from every rank's `send` with `op` and writes the result
/// to every rank's `recv`. In place when `send == recv`.
/// - Counts: `count` elements per rank in both buffers (64-bit).
/// - Errors (`ringzero::error`, raised on every rank alike): invalid_argument (null buffer with
///   count > 0, count overflowing the byte size, bad dtype/op/premul scalar, partially
///   overlapping buffers, unavailable algorithm, on any rank); contract_mismatch (ranks differ in
///   collective, count, dtype, op or algorithm); timeout; aborted; peer_exited.
/// - Thread and ordering: blocking; runs after every earlier async operation of `comm`.
/// - Determinism: bitwise identical on every rank and from run to run for a given world size,
///   algorithm and count; exact for inputs whose reduction is exact in any order.
/// - Follows NCCL's ncclAllReduce; avg divides once at the end (see core/reduce_op.hpp).
inline void all_reduce(communicator& comm, const void* send, void* recv, std::uint64_t count, dtype type, reduce_op op,
                       const collective_options& options = {}) {
  detail::run_blocking(comm,
                       detail::make_request(collective_kind::all_reduce, send, recv, count, type, op, -1, options));
}

/// Asynchronous `all_reduce`: returns at once; the operation runs on `comm`'s progress thread in
/// issue order and `work::wait()` rethrows its error. The buffers must stay valid (and `send`
/// unmodified, `recv` untouched) until the work completes.
inline work all_reduce_async(communicator& comm, const void* send, void* recv, std::uint64_t count, dtype type,
                             reduce_op op, const collective_options& options = {}) {
  return detail::issue(
      comm, detail::make_request(collective_kind::all_reduce, send, recv, count, type, op, -1, options), true);
}

/// Typed `all_reduce` of two spans of equal size (a size difference is an invalid argument).
template <element_type T>
void all_reduce(communicator& comm, std::span<const T> send, std::span<T> recv, reduce_op op = reduce_kind::sum,
                const collective_options& options = {}) {
  auto q = detail::make_request(collective_kind::all_reduce, send.data(), recv.data(), recv.size(), dtype_of<T>, op, -1,
                                options);
  q.invalid = detail::span_mismatch(send.size(), recv.size(), recv.size(), recv.size());
  detail::run_blocking(comm, q);
}

/// Typed in-place `all_reduce` of `buffer`.
template <element_type T>
void all_reduce(communicator& comm, std::span<T> buffer, reduce_op op = reduce_kind::sum,
                const collective_options& options = {}) {
  all_reduce(comm, buffer.data(), buffer.data(), buffer.size(), dtype_of<T>, op, options);
}

/// Typed asynchronous in-place `all_reduce` of `buffer` (see `all_reduce_async`).
template <element_type T>
work all_reduce_async(communicator& comm, std::span<T> buffer, reduce_op op = reduce_kind::sum,
                      const collective_options& options = {}) {
  return all_reduce_async(comm, buffer.data(), buffer.data(), buffer.size(), dtype_of<T>, op, options);
}

}  // namespace ringzero
