#pragma once
/// @file
/// all_gather: every rank receives the concatenation of all ranks' inputs (ncclAllGather).

#include <cstdint>
#include <span>

#include "ringzero/collective/request.hpp"
#include "ringzero/core/dtype.hpp"
#if !defined(RINGZERO_SEPARATE_COMPILATION)
#include "ringzero/collective/dispatch.hpp"  // the core's definitions (collective/request.hpp)
#endif

namespace ringzero {

/// Gathers `send_count` elements from every rank; every rank's `recv` (world_size * send_count
/// elements) receives rank q's input at element offset q*send_count.
/// In place when `send == recv + rank*send_count` (NCCL's convention).
/// Errors and thread semantics as `all_reduce`; the result is a copy, bitwise exact.
inline void all_gather(communicator& comm, const void* send, void* recv, std::uint64_t send_count, dtype type,
                       const collective_options& options = {}) {
  detail::run_blocking(
      comm, detail::make_request(collective_kind::all_gather, send, recv, send_count, type, {}, -1, options));
}

/// Asynchronous `all_gather` (see `all_reduce_async` for the handle's semantics).
inline work all_gather_async(communicator& comm, const void* send, void* recv, std::uint64_t send_count, dtype type,
                             const collective_options& options = {}) {
  return detail::issue(
      comm, detail::make_request(collective_kind::all_gather, send, recv, send_count, type, {}, -1, options), true);
}

/// Typed `all_gather`: `recv.size()` must be world_size * `send.size()`.
template <element_type T>
void all_gather(communicator& comm, std::span<const T> send, std::span<T> recv,
                const collective_options& options = {}) {
  auto q = detail::make_request(collective_kind::all_gather, send.data(), recv.data(), send.size(), dtype_of<T>, {}, -1,
                                options);
  q.invalid = detail::span_mismatch(send.size(), send.size(), recv.size(),
                                    send.size() * static_cast<std::uint64_t>(comm.world_size()));
  detail::run_blocking(comm, q);
}

}  // namespace ringzero
