#pragma once
/// @file
/// all_to_all: rank r sends block q of its input to rank q, which stores it as block r
/// (NCCL 2.28's ncclAlltoAll, MPI_Alltoall).

#include <cstdint>
#include <span>

#include "ringzero/collective/request.hpp"
#include "ringzero/core/dtype.hpp"
#if !defined(RINGZERO_SEPARATE_COMPILATION)
#include "ringzero/collective/dispatch.hpp"  // the core's definitions (collective/request.hpp)
#endif

namespace ringzero {

/// Exchanges blocks of `count` elements: `send` and `recv` hold world_size * count elements;
/// block q of rank r's `send` lands in block r of rank q's `recv`. Not in place: overlapping
/// buffers are an invalid argument. Algorithms: direct (local) and ring (pairwise exchange).
/// Errors and thread semantics as `all_reduce`; the result is a copy, bitwise exact.
inline void all_to_all(communicator& comm, const void* send, void* recv, std::uint64_t count, dtype type,
                       const collective_options& options = {}) {
  detail::run_blocking(comm,
                       detail::make_request(collective_kind::all_to_all, send, recv, count, type, {}, -1, options));
}

/// Asynchronous `all_to_all` (see `all_reduce_async` for the handle's semantics).
inline work all_to_all_async(communicator& comm, const void* send, void* recv, std::uint64_t count, dtype type,
                             const collective_options& options = {}) {
  return detail::issue(
      comm, detail::make_request(collective_kind::all_to_all, send, recv, count, type, {}, -1, options), true);
}

/// Typed `all_to_all`: both spans must hold world_size * count elements (count = size / world_size).
template <element_type T>
void all_to_all(communicator& comm, std::span<const T> send, std::span<T> recv,
                const collective_options& options = {}) {
  const std::uint64_t n = static_cast<std::uint64_t>(comm.world_size());
  const std::uint64_t count = recv.size() / n;
  auto q =
      detail::make_request(collective_kind::all_to_all, send.data(), recv.data(), count, dtype_of<T>, {}, -1, options);
  q.invalid = detail::span_mismatch(send.size(), count * n, recv.size(), count * n);
  detail::run_blocking(comm, q);
}

}  // namespace ringzero
