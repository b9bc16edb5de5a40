#pragma once
/// @file
/// Point-to-point transfers: send, recv and sendrecv (ncclSend / ncclRecv semantics).
///
/// A send completes when its buffer may be reused: on the local backend once the receiver has
/// copied straight from it (a rendezvous); on MPI once MPI has taken the data, which for a
/// small message may be before the receiver posts its receive. Transfers between a pair of
/// ranks match in order. Two ranks that must exchange data use `sendrecv` (like NCCL's group of
/// a send and a recv): two blocking sends towards each other would each wait for the other (on
/// the local backend always, on MPI above its eager size), and fail with errc::timeout. The sizes of a matched send and
/// receive must be equal: otherwise both ranks get errc::size_mismatch naming both sizes, never a partial copy. Only
/// byte sizes are compared (equal sizes of different dtypes pass). Where the sender learns it: in the call on the local
/// backend and on MPI with the check mode; on MPI without it, the receiver raises in the call and the sender, whose
/// send MPI may already have completed, at a later call on the communicator (backend/mpi/communicator.hpp,
/// docs/mpi.md). Thread semantics: blocking, ordered after the communicator's earlier async operations. Zero-element
/// transfers still match (and check sizes); null pointers are allowed for them.

#include <cstdint>
#include <span>
#include <string>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/backend/contract.hpp"
#include "ringzero/core/checked_arithmetic.hpp"
#include "ringzero/core/dtype.hpp"

namespace ringzero {

namespace detail {

/// Validates one side of a transfer on the calling rank; throws errc::invalid_argument.
inline std::uint64_t transfer_bytes(const communicator& c, const void* buffer, std::uint64_t count, dtype type,
                                    int peer, const char* what) {
  if (!is_valid(type))
    raise(c, errc::invalid_argument,
          std::string(what) + ": unknown dtype value " + std::to_string(static_cast<unsigned>(type)));
  if (peer < 0 || peer >= c.world_size())
    raise(c, errc::invalid_argument,
          std::string(what) + ": peer " + std::to_string(peer) + " is outside [0, " + std::to_string(c.world_size()) +
              ")");
  const auto bytes = checked_mul(count, dtype_size(type));
  if (!bytes)
    raise(c, errc::invalid_argument,
          std::string(what) + ": count " + std::to_string(count) + " of " + std::string(dtype_name(type)) +
              " overflows the buffer size in bytes");
  if (*bytes > 0 && buffer == nullptr)
    raise(c, errc::invalid_argument, std::string(what) + ": buffer is null with count " + std::to_string(count));
  return *bytes;
}

/// Runs one transfer on `c`, after its pending async work, naming `kind` in errors.
inline void transfer(communicator& c, collective_kind kind, dtype type, const void* send, std::uint64_t send_bytes,
                     int to, void* recv, std::uint64_t recv_bytes, int from) {
  transport& t = transport_of(c);
  if (!t.progress().running_here()) t.progress().drain();
  collective_descriptor d;
  d.kind = kind;
  d.type = type;  // for the backends' messages (element counts)
  t.sendrecv(d, send, send_bytes, to, recv, recv_bytes, from);
  t.count_run(d);
}

}  // namespace detail

/// Sends `count` elements of `type` from `buffer` to rank `peer` (!= own rank; use `sendrecv`
/// to send to oneself). Returns once `buffer` may be reused: on the local backend when `peer`
/// has copied the data; on MPI when MPI has taken it (a small message may be buffered before
/// `peer` posts its receive; the check mode first waits for `peer`'s matching record).
/// Errors: invalid_argument (bad peer, dtype, null buffer, overflow); size_mismatch;
/// contract_mismatch (the peer runs another operation, or, with MPI's check mode, does not
/// post the matching side); timeout; aborted; peer_exited.
inline void send(communicator& comm, const void* buffer, std::uint64_t count, dtype type, int peer) {
  const std::uint64_t bytes = detail::transfer_bytes(comm, buffer, count, type, peer, "send");
  if (peer == comm.rank())
    detail::raise(comm, errc::invalid_argument, "send to oneself would never complete; use sendrecv");
  detail::transfer(comm, collective_kind::send, type, buffer, bytes, peer, nullptr, 0, -1);
}

/// Receives `count` elements of `type` from rank `peer` into `buffer`. Errors as `send`.
inline void recv(communicator& comm, void* buffer, std::uint64_t count, dtype type, int peer) {
  const std::uint64_t bytes = detail::transfer_bytes(comm, buffer, count, type, peer, "recv");
  if (peer == comm.rank())
    detail::raise(comm, errc::invalid_argument, "recv from oneself would never complete; use sendrecv");
  detail::transfer(comm, collective_kind::recv, type, nullptr, 0, -1, buffer, bytes, peer);
}

/// Sends `send_count` elements to `to` and receives `recv_count` elements from `from`,
/// concurrently. `to` and `from` may both be the own rank (a copy to oneself), not one alone:
/// a send to oneself is received only by the same call's receive from oneself (otherwise, as
/// with `send` to oneself, nothing would ever take it, and on MPI a later call's receive from
/// oneself would get this call's data). `send` and `recv` must not overlap. Errors as `send`.
inline void sendrecv(communicator& comm, const void* send_buffer, std::uint64_t send_count, int to, void* recv_buffer,
                     std::uint64_t recv_count, int from, dtype type) {
  const std::uint64_t sb = detail::transfer_bytes(comm, send_buffer, send_count, type, to, "sendrecv (send side)");
  const std::uint64_t rb = detail::transfer_bytes(comm, recv_buffer, recv_count, type, from, "sendrecv (recv side)");
  if ((to == comm.rank()) != (from == comm.rank()))
    detail::raise(
        comm, errc::invalid_argument,
        "sendrecv: to " + std::to_string(to) + " and from " + std::to_string(from) + ": " +
            (to == comm.rank() ? std::string("a send to oneself needs the same call's receive from oneself (from == ")
                               : std::string("a receive from oneself needs the same call's send to oneself (to == ")) +
            std::to_string(comm.rank()) + "); nothing else " + (to == comm.rank() ? "receives" : "sends") + " it");
  if (detail::ranges_overlap(send_buffer, sb, recv_buffer, rb))
    detail::raise(comm, errc::invalid_argument, "sendrecv: send and receive buffers overlap");
  detail::transfer(comm, collective_kind::send, type, send_buffer, sb, to, recv_buffer, rb, from);
}

/// Asynchronous `send`: queued on `comm`'s progress thread behind its earlier async operations
/// and run in issue order, one at a time (like NCCL calls on one stream without a group). So a
/// rank must not wait for a peer's message while its own earlier async send to that peer is
/// still queued: exchange data with `sendrecv`. `buffer` must stay valid until the work completes.
inline work send_async(communicator& comm, const void* buffer, std::uint64_t count, dtype type, int peer) {
  const std::uint64_t bytes = detail::transfer_bytes(comm, buffer, count, type, peer, "send");
  if (peer == comm.rank())
    detail::raise(comm, errc::invalid_argument, "send to oneself would never complete; use sendrecv");
  transport* c = &detail::transport_of(comm);
  return work(c->progress().submit([c, buffer, bytes, peer, type] {
    collective_descriptor d;
    d.kind = collective_kind::send;
    d.type = type;
    c->sendrecv(d, buffer, bytes, peer, nullptr, 0, -1);
    c->count_run(d);
  }));
}

/// Asynchronous `recv` (see `send_async` for ordering).
inline work recv_async(communicator& comm, void* buffer, std::uint64_t count, dtype type, int peer) {
  const std::uint64_t bytes = detail::transfer_bytes(comm, buffer, count, type, peer, "recv");
  if (peer == comm.rank())
    detail::raise(comm, errc::invalid_argument, "recv from oneself would never complete; use sendrecv");
  transport* c = &detail::transport_of(comm);
  return work(c->progress().submit([c, buffer, bytes, peer, type] {
    collective_descriptor d;
    d.kind = collective_kind::recv;
    d.type = type;
    c->sendrecv(d, nullptr, 0, -1, buffer, bytes, peer);
    c->count_run(d);
  }));
}

/// Typed `send` of a span.
template <element_type T>
void send(communicator& comm, std::span<const T> buffer, int peer) {
  send(comm, buffer.data(), buffer.size(), dtype_of<T>, peer);
}

/// Typed `recv` into a span (its size is the expected count).
template <element_type T>
void recv(communicator& comm, std::span<T> buffer, int peer) {
  recv(comm, buffer.data(), buffer.size(), dtype_of<T>, peer);
}

}  // namespace ringzero
