#pragma once
/// @file
/// `local::communicator`: one rank of a `local::world`, ranks being threads of one process.
///
/// - Zero copy: a receiver reads (and reduces from) the sender's buffer in place; the `direct`
///   algorithm reads every peer's buffers through `peer_descriptor`.
/// - Contract: every collective exchanges descriptors on entry; a mismatch in collective, count,
///   dtype, op, root or algorithm, invalid arguments on any rank, or ranks writing each other's
///   buffers raise the same `ringzero::error` on every rank before any data moves.
/// - Timeout: a wait longer than `timeout()` fails with errc::timeout naming the ranks that never
///   arrived, and aborts the world so that every other waiting rank fails too (never a hang).
///   A rank that left the world (returned or threw) fails its waiting peers with errc::peer_exited.
/// Thread semantics: used by its owning rank thread (and its progress thread); see communicator.

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ringzero/backend/backend_communicator.hpp"
#include "ringzero/backend/contract.hpp"
#include "ringzero/backend/local/world.hpp"
#include "ringzero/backend/protocol/failure_text.hpp"
#include "ringzero/core/wait.hpp"

namespace ringzero::local {

/// One rank of a local world. See the file comment.
/// Buffers are in host memory; `local::cuda_communicator` (backend/local/cuda_communicator.hpp)
/// derives from it for CUDA device memory through the protected transfer hooks.
class communicator : public ringzero::detail::backend_communicator {
 public:
  /// Rank `rank` of `w`. Throws errc::invalid_argument when rank is outside [0, w.size()).
  /// `w` must outlive the communicator. At most one communicator per rank and world.
  communicator(world& w, int rank)
      : backend_communicator(rank, w.size()),
        world_(w),
        sent_(static_cast<std::size_t>(w.size()), 0),
        received_(static_cast<std::size_t>(w.size()), 0) {}

  ~communicator() override { stop_progress(); }

  backend_kind backend() const noexcept override { return backend_kind::local; }

  /// ring, halving_doubling and direct; no native collectives.
  bool supports(algorithm a, collective_kind) const noexcept override {
    return a == algorithm::ring || a == algorithm::halving_doubling || a == algorithm::direct;
  }

  /// Shared-memory costs: a rendezvous of ~0.3 us per step and ~10 GB/s of memory traffic
  /// per rank (mu). A byte "transferred" by a zero-copy receive is read from the peer and written
  /// locally (beta = 2 mu); a byte combined also reads the own operand (gamma = mu). direct's
  /// reductions pass each result through an 8 KiB tile in L1 at ~100 GB/s (cache = mu / 10:
  /// with it the model's 2-rank reduce_scatter crosses over from direct to ring at 30 KB, where
  /// ringzero-bench measured the crossover at 32-64 KiB). See docs/algorithms.md.
  link_model link() const noexcept override {
    link_model m;
    m.memory_us_per_byte = 1.0 / 10e3;
    m.alpha_us = 0.3;
    m.beta_us_per_byte = 2 * m.memory_us_per_byte;
    m.gamma_us_per_byte = m.memory_us_per_byte;
    m.sync_us = 0.3;
    m.cache_us_per_byte = m.memory_us_per_byte / 10;
    return m;
  }

  void abort(const std::string& reason) noexcept override {
    try {
      world_.abort("rank " + std::to_string(rank()) + ": " + reason);
    } catch (...) {}
  }

  /// The world this rank belongs to.
  world& shared_world() noexcept { return world_; }

  void begin(const collective_descriptor& op) override {
    if (world_.aborted()) raise(&op, world_.abort_code(), "communicator was aborted earlier: " + world_.abort_reason());
    detail::rank_slot& me = world_.slot(rank());
    me.desc = op;
    const std::uint64_t tag = op.sequence + 1;
    me.arrived.store(tag, std::memory_order_release);
    world_.bell(rank()).ring();
    try {
      wait_for_all(op, &detail::rank_slot::arrived, tag, "arrive at");
      // Peers that arrived may have failed since (a timeout, an exception) and left, taking
      // their buffers with them: a collective never starts on an aborted world.
      if (world_.aborted())
        raise(&op, world_.abort_code(),
              "communicator aborted before " + ringzero::detail::operation_name(&op) +
                  " could start; first failure: " + world_.abort_reason());
    } catch (...) {
      leave(tag);
      throw;
    }
    auto violation = check_contract(
        world_size(), [&](int r) -> const collective_descriptor& { return world_.slot(r).desc; }, true, op.tag_name);
    if (violation) {
      end(op);
      raise(&op, violation->code, violation->message);
    }
  }

  void end(const collective_descriptor& op) override {
    const std::uint64_t tag = op.sequence + 1;
    depart(tag);
    try {
      wait_for_all(op, &detail::rank_slot::departed, tag, "finish");
    } catch (...) {
      wait_for_readers(tag);
      throw;
    }
  }

  /// After a failure inside collective `d` (the world is aborted by then): departs and returns
  /// only once no peer that entered `d` can still read or write this rank's buffers, so the
  /// caller may free them. Bounded by the timeout.
  void abandon(const collective_descriptor& d) noexcept override { leave(d.sequence + 1); }

  const collective_descriptor* peer_descriptor(int r) const noexcept override { return &world_.slot(r).desc; }

 protected:
  void backend_sendrecv(const collective_descriptor& op, const void* send, std::uint64_t send_bytes, int to, void* recv,
                        std::uint64_t recv_bytes, int from) override {
    ringzero::detail::check_peer(*this, op, to, "send to");
    ringzero::detail::check_peer(*this, op, from, "receive from");
    if (world_.aborted()) raise(&op, world_.abort_code(), "communicator was aborted earlier: " + world_.abort_reason());
    const std::uint64_t k = to >= 0 ? post(op, to, send, send_bytes) : 0;
    if (from >= 0) {
      try {
        const void* data = await_message(op, from, recv_bytes);
        if (recv_bytes != 0 && data != recv) copy_received(recv, data, recv_bytes, from);
        consume(from);
      } catch (...) {
        if (to >= 0) settle_posted(to, k);
        throw;
      }
    }
    if (to >= 0) await_consumed(op, to, k, send_bytes);
  }

  void backend_sendrecv_reduce(const collective_descriptor& op, const void* send, std::uint64_t send_bytes, int to,
                               const void* own, void* acc, std::uint64_t bytes, int from,
                               const combine_fn& combine) override {
    ringzero::detail::check_peer(*this, op, to, "send to");
    ringzero::detail::check_peer(*this, op, from, "receive from");
    const std::uint64_t k = to >= 0 ? post(op, to, send, send_bytes) : 0;
    if (from >= 0) {
      try {
        const void* data = await_message(op, from, bytes);
        if (bytes != 0) combine(acc, own, readable_received(data, bytes, from), bytes / combine.element_size);
        consume(from);
      } catch (...) {
        if (to >= 0) settle_posted(to, k);
        throw;
      }
    }
    if (to >= 0) await_consumed(op, to, k, send_bytes);
  }

  // ---- transfer hooks: how a message's data is ordered and moved -----------------------
  // The host protocol (post, await_message, consume, await_consumed) stays the same for every
  // memory space; a rank whose buffers are in device memory orders the device work around it.

  /// Called just before this rank posts a message to `to`; returns the signal published with
  /// it (host: none). A device rank records an event after the work that produced the data.
  virtual void* signal_ready(int to) {
    (void)to;
    return nullptr;
  }
  /// Called once the message from `from` has arrived with the sender's `signal`, before its
  /// data is read (host: nothing). A device rank makes its stream wait for that event.
  virtual void on_arrival(int from, void* signal) {
    (void)from;
    (void)signal;
  }
  /// Moves `bytes` received bytes from the sender's buffer `src` into `dst` (host: memcpy).
  virtual void copy_received(void* dst, const void* src, std::uint64_t bytes, int from) {
    (void)from;
    std::memcpy(dst, src, static_cast<std::size_t>(bytes));
  }
  /// The sender's buffer `data` as this rank's combine may read it (host: as is; a device rank
  /// without peer access to the sender's device stages it first).
  virtual const void* readable_received(const void* data, std::uint64_t bytes, int from) {
    (void)bytes;
    (void)from;
    return data;
  }
  /// Called just before this rank reports the message from `from` consumed; returns the signal
  /// published with the report (host: none). A device rank records an event after its reads.
  virtual void* signal_consumed(int from) {
    (void)from;
    return nullptr;
  }
  /// Called once `to` reported this rank's message consumed with `signal`, before the send
  /// returns (host: nothing). A device rank makes its stream wait for that event, so that no
  /// later work overwrites the buffer while the receiver's device still reads it.
  virtual void on_consumed(int to, void* signal) {
    (void)to;
    (void)signal;
  }

 private:
  using clock = std::chrono::steady_clock;

  clock::time_point deadline() const { return clock::now() + std::chrono::duration_cast<clock::duration>(timeout()); }

  status failure_of(int peer) const {
    if (world_.aborted()) return status::aborted;
    if (world_.exited(peer)) return status::peer_exited;
    return status::ok;
  }

  [[noreturn]] void fail_wait(const collective_descriptor& op, status st, const std::string& waiting_for,
                              const std::vector<int>& missing) {
    const std::string who = ringzero::detail::describe_ranks(missing);
    if (st == status::timeout) {
      const std::string msg = "timed out after " + ringzero::detail::seconds_text(timeout()) + " s waiting for " + who +
                              " to " + waiting_for + " " + ringzero::detail::operation_name(&op) +
                              " (they never arrived)";
      world_.abort("rank " + std::to_string(rank()) + ": " + msg, errc::timeout);
      raise(&op, errc::timeout, msg);
    }
    if (st == status::peer_exited) {
      std::string msg;
      for (int r : missing)
        if (world_.exited(r)) {
          msg = "rank " + std::to_string(r) + " left the world (" + world_.exit_description(r) +
                ") while this rank waited for it to " + waiting_for + " " + ringzero::detail::operation_name(&op);
          break;
        }
      world_.abort("rank " + std::to_string(rank()) + ": " + msg, errc::peer_exited);
      raise(&op, errc::peer_exited, msg);
    }
    raise(&op, world_.abort_code(),
          "communicator aborted while waiting for " + who + " to " + waiting_for + " " +
              ringzero::detail::operation_name(&op) + "; first failure: " + world_.abort_reason());
  }

  void depart(std::uint64_t tag) noexcept {
    auto& departed = world_.slot(rank()).departed;
    if (departed.load(std::memory_order_relaxed) >= tag) return;
    departed.store(tag, std::memory_order_release);
    world_.bell(rank()).ring();
  }

  /// Zero-copy means peers work on this rank's buffers in place: before a failing rank returns
  /// (and its caller frees them), every peer that entered collective `tag` must have left it.
  /// A peer that had not arrived when the world was aborted never starts it (begin checks the
  /// abort first), and a failing peer departs too, so this wait ends promptly; aborts do not
  /// interrupt it, the timeout bounds it.
  void wait_for_readers(std::uint64_t tag) noexcept {
    const auto until = deadline();
    for (int q = 0; q < world_size(); ++q) {
      if (q == rank()) continue;
      auto& s = world_.slot(q);
      (void)ringzero::detail::wait_until(
          [&] {
            return s.departed.load(std::memory_order_acquire) >= tag || s.arrived.load(std::memory_order_acquire) < tag;
          },
          [&] { return world_.exited(q) ? status::peer_exited : status::ok; }, until, world_.oversubscribed(),
          &world_.bell(q));
    }
  }

  void leave(std::uint64_t tag) noexcept {
    depart(tag);
    wait_for_readers(tag);
  }

  /// Waits until every peer's `field` reached `tag` in `op`; throws on timeout, abort or exit.
  void wait_for_all(const collective_descriptor& op, std::atomic<std::uint64_t> detail::rank_slot::*field,
                    std::uint64_t tag, const char* what) {
    const auto until = deadline();
    for (int r = 0; r < world_size(); ++r) {
      if (r == rank()) continue;
      auto& peer = world_.slot(r).*field;
      status st =
          ringzero::detail::wait_until([&] { return peer.load(std::memory_order_acquire) >= tag; },
                                       [&] { return failure_of(r); }, until, world_.oversubscribed(), &world_.bell(r));
      if (st == status::ok) continue;
      std::vector<int> missing;
      for (int q = 0; q < world_size(); ++q)
        if (q != rank() && (world_.slot(q).*field).load(std::memory_order_acquire) < tag) missing.push_back(q);
      if (missing.empty()) continue;  // everyone arrived just as we gave up
      fail_wait(op, st, what, missing);
    }
  }

  /// The tag of operation `op`: 1 + sequence for a collective's internal transfers, 0 for
  /// send/recv. A message is only accepted by the same kind of operation on the receiver, so
  /// point-to-point traffic and collectives issued in a different order on two ranks raise an
  /// error instead of delivering one operation's data to another.
  static std::uint64_t tag_of(const collective_descriptor& op) noexcept {
    if (op.kind == collective_kind::send || op.kind == collective_kind::recv) return 0;
    return op.sequence + 1;
  }

  static std::string tag_name(std::uint64_t tag) {
    return tag == 0 ? std::string("a send/recv") : "collective #" + std::to_string(tag - 1);
  }

  std::uint64_t post(const collective_descriptor& op, int to, const void* data, std::uint64_t bytes) {
    detail::mailbox& box = world_.box(rank(), to);
    void* signal = signal_ready(to);
    const std::uint64_t k = ++sent_[static_cast<std::size_t>(to)];
    // The previous message on this channel is always consumed here (every send waits for its
    // receiver), so the fields may be overwritten.
    box.data = data;
    box.bytes = bytes;
    box.tag = tag_of(op);
    box.ready_signal = signal;
    box.posted.store(k, std::memory_order_release);
    world_.bell(rank()).ring();
    return k;
  }

  const void* await_message(const collective_descriptor& op, int from, std::uint64_t expected) {
    detail::mailbox& box = world_.box(from, rank());
    const std::uint64_t k = ++received_[static_cast<std::size_t>(from)];
    status st = ringzero::detail::wait_until([&] { return box.posted.load(std::memory_order_acquire) >= k; },
                                             [&] { return failure_of(from); }, deadline(), world_.oversubscribed(),
                                             &world_.bell(from));
    if (st != status::ok) fail_wait(op, st, "send its data for", {from});
    const std::uint64_t want_tag = tag_of(op);
    if (box.tag != want_tag) {
      const std::uint64_t got_tag = box.tag;
      box.tag_mismatch = true;
      box.expected = expected;
      box.consumed_signal = nullptr;
      box.consumed.store(k, std::memory_order_release);
      world_.bell(rank()).ring();
      raise(&op, errc::contract_mismatch,
            "rank " + std::to_string(from) + " sent data for " + tag_name(got_tag) + " while rank " +
                std::to_string(rank()) + " expected data for " + tag_name(want_tag) +
                ": the two ranks issued operations in different orders");
    }
    if (box.bytes != expected) {
      const std::uint64_t got = box.bytes;
      box.tag_mismatch = false;
      box.expected = expected;
      box.consumed_signal = nullptr;
      box.consumed.store(k, std::memory_order_release);
      world_.bell(rank()).ring();
      raise(&op, errc::size_mismatch,
            "rank " + std::to_string(from) + " sends " + std::to_string(got) + " bytes but rank " +
                std::to_string(rank()) + " expects " + std::to_string(expected) + " bytes");
    }
    on_arrival(from, box.ready_signal);
    return box.data;
  }

  void consume(int from) {
    detail::mailbox& box = world_.box(from, rank());
    box.consumed_signal = signal_consumed(from);
    box.expected = box.bytes;
    box.tag_mismatch = false;
    box.consumed.store(received_[static_cast<std::size_t>(from)], std::memory_order_release);
    world_.bell(rank()).ring();
  }

  void await_consumed(const collective_descriptor& op, int to, std::uint64_t k, std::uint64_t bytes) {
    detail::mailbox& box = world_.box(rank(), to);
    status st = ringzero::detail::wait_until([&] { return box.consumed.load(std::memory_order_acquire) >= k; },
                                             [&] { return failure_of(to); }, deadline(), world_.oversubscribed(),
                                             &world_.bell(to));
    if (st != status::ok) fail_wait(op, st, "receive the data of", {to});
    if (box.tag_mismatch)
      raise(&op, errc::contract_mismatch,
            "rank " + std::to_string(to) + " expected data of another operation than " + tag_name(tag_of(op)) +
                ": the two ranks issued operations in different orders");
    if (box.expected != bytes)
      raise(&op, errc::size_mismatch,
            "rank " + std::to_string(rank()) + " sends " + std::to_string(bytes) + " bytes but rank " +
                std::to_string(to) + " expects " + std::to_string(box.expected) + " bytes");
    on_consumed(to, box.consumed_signal);
  }

  /// After the receive half of a transfer failed: waits (within the timeout, unless the world is
  /// aborted or the peer gone) until rank `to` has taken message `k`, which points into the
  /// caller's send buffer, so that the caller may free that buffer once the error reaches it
  /// (a size mismatch on one half of a sendrecv while the peer still reads the other).
  void settle_posted(int to, std::uint64_t k) noexcept {
    detail::mailbox& box = world_.box(rank(), to);
    const status st = ringzero::detail::wait_until([&] { return box.consumed.load(std::memory_order_acquire) >= k; },
                                                   [&] { return failure_of(to); }, deadline(), world_.oversubscribed(),
                                                   &world_.bell(to));
    if (st != status::ok) return;
    try {
      on_consumed(to, box.consumed_signal);
    } catch (...) {  // the receive error being reported matters more
    }
  }

  world& world_;
  std::vector<std::uint64_t> sent_;
  std::vector<std::uint64_t> received_;
};

}  // namespace ringzero::local
