#pragma once
/// @file
/// `collective_request`: the arguments of one public collective call, and the two entry points
/// of the type-erased core that every public collective forwards to (`issue`, `run_blocking`).
/// Light on purpose: the public collective headers include this one, and include the core's
/// definitions (collective/dispatch.hpp: every algorithm and reduction kernel) only when
/// ringzero is header-only; under RINGZERO_SEPARATE_COMPILATION they are compiled once in
/// <ringzero/impl/src.hpp> (docs/compile_time.md).

#include <cstdint>
#include <string>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/backend/descriptor.hpp"
#include "ringzero/backend/progress.hpp"
#include "ringzero/collective/options.hpp"
#include "ringzero/core/config.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/reduce_op.hpp"

namespace ringzero::detail {

/// The arguments of one public collective call.
struct collective_request {
  collective_kind kind = collective_kind::barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  std::uint64_t count = 0;
  dtype type = dtype::float32;
  reduce_op op{};
  int root = -1;
  collective_options options{};
  std::string invalid;                             ///< a problem found by a typed wrapper (e.g. span sizes), if any
  const primitive::binned_view* binned = nullptr;  ///< accumulator collectives: the accumulator
};

/// A request with the given fields (root -1 and op sum where the collective has none).
inline collective_request make_request(collective_kind kind, const void* send, void* recv, std::uint64_t count,
                                       dtype type, reduce_op op, int root, const collective_options& options) {
  collective_request q;
  q.kind = kind;
  q.send = send;
  q.recv = recv;
  q.count = count;
  q.type = type;
  q.op = op;
  q.root = root;
  q.options = options;
  return q;
}

/// "send has 3 elements but recv needs 4" when a typed call's spans disagree, else "".
inline std::string span_mismatch(std::uint64_t send_size, std::uint64_t send_needed, std::uint64_t recv_size,
                                 std::uint64_t recv_needed) {
  if (send_size == send_needed && recv_size == recv_needed) return {};
  return "send span has " + std::to_string(send_size) + " elements (needs " + std::to_string(send_needed) +
         ") and recv span has " + std::to_string(recv_size) + " elements (needs " + std::to_string(recv_needed) + ")";
}

/// Describes and issues a request (the body of every public collective): runs it now when
/// `async` is false and nothing is pending, else queues it on the progress thread. Returns a
/// handle (empty when it already ran); blocking calls rethrow the collective's error.
/// Defined in collective/dispatch.hpp.
RINGZERO_DECL work issue(communicator& c, const collective_request& q, bool async);

/// Describes and runs a blocking request: returns once it has finished, rethrowing its error.
/// Defined in collective/dispatch.hpp.
RINGZERO_DECL void run_blocking(communicator& c, const collective_request& q);

}  // namespace ringzero::detail
