#pragma once
/// @file
/// reduce: the root receives the element-wise reduction of all ranks' inputs (ncclReduce).

#include <cstdint>
#include <span>

#include "ringzero/collective/request.hpp"
#include "ringzero/core/dtype.hpp"
#if !defined(RINGZERO_SEPARATE_COMPILATION)
#include "ringzero/collective/dispatch.hpp"  // the core's definitions (collective/request.hpp)
#endif

namespace ringzero {

/// Reduces `count` elements from every rank's `send` with `op` into the root's `recv`.
/// `recv` is written on the root only; on other ranks it is ignored (may be null) and never
/// touched. In place when `send == recv` on the root.
/// Errors, thread semantics and determinism as `all_reduce`; follows ncclReduce.
inline void reduce(communicator& comm, const void* send, void* recv, std::uint64_t count, dtype type, reduce_op op,
                   int root, const collective_options& options = {}) {
  detail::run_blocking(comm, detail::make_request(collective_kind::reduce, send, recv, count, type, op, root, options));
}

/// Asynchronous `reduce` (see `all_reduce_async` for the handle's semantics).
inline work reduce_async(communicator& comm, const void* send, void* recv, std::uint64_t count, dtype type,
                         reduce_op op, int root, const collective_options& options = {}) {
  return detail::issue(comm, detail::make_request(collective_kind::reduce, send, recv, count, type, op, root, options),
                       true);
}

/// Typed in-place `reduce` of `buffer` into the root's `buffer`.
template <element_type T>
void reduce(communicator& comm, std::span<T> buffer, reduce_op op, int root, const collective_options& options = {}) {
  reduce(comm, buffer.data(), buffer.data(), buffer.size(), dtype_of<T>, op, root, options);
}

}  // namespace ringzero
