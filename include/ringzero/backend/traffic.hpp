#pragma once
/// @file
/// `traffic`: the bytes one rank's collectives moved, counted by its transport as they move
/// (`communicator::traffic()`), per collective kind and in total. Take one before and one after a
/// training step and subtract them for the step's traffic. The manual: docs/backends.md,
/// "Counting traffic".

#include <array>
#include <atomic>
#include <cstdint>

#include "ringzero/core/algorithm.hpp"

namespace ringzero {

/// What one rank's collectives of one kind (or of every kind) moved. Units: bytes.
struct traffic_figures {
  /// Collectives run (every rank counts each one it runs, world of one and zero counts too).
  std::uint64_t calls = 0;
  /// Bytes this rank sent to other ranks: the transfers of ringzero's schedules (ring,
  /// halving_doubling, send/recv), and under `direct` (shared memory, no transfer) every byte
  /// that left this rank's buffers for a peer's, whichever rank copied it. Measured.
  std::uint64_t sent = 0;
  /// Bytes this rank received from other ranks, counted the same way. Measured.
  std::uint64_t received = 0;
  /// The backend's own collectives (algorithm::native: MPI_Allreduce, ncclAllReduce, ...) do not
  /// show their transfers: each adds what a bandwidth-optimal ring or chain sends per rank for it
  /// (detail::ring_bytes_per_rank: all_reduce 2(n-1)/n S, reduce_scatter and all_gather (n-1)/n
  /// of the whole buffer, as nccl-tests' bus-bandwidth factors; broadcast and reduce (n-1)/n S, a
  /// chain's average per rank; all_to_all (n-1)/n of the whole buffer). Estimated, kept apart
  /// from `sent`.
  std::uint64_t estimated_sent = 0;

  /// `sent + estimated_sent`: the figure to compare across backends and algorithms.
  std::uint64_t total_sent() const noexcept { return sent + estimated_sent; }

  /// The difference of two readings (this minus `earlier`), every field.
  traffic_figures operator-(const traffic_figures& earlier) const noexcept {
    return {calls - earlier.calls, sent - earlier.sent, received - earlier.received,
            estimated_sent - earlier.estimated_sent};
  }
  /// The sum of two readings, every field.
  traffic_figures& operator+=(const traffic_figures& o) noexcept {
    calls += o.calls;
    sent += o.sent;
    received += o.received;
    estimated_sent += o.estimated_sent;
    return *this;
  }
  friend bool operator==(const traffic_figures&, const traffic_figures&) = default;
};

/// One reading of a rank's traffic counters: per collective kind (indexed by `collective_kind`;
/// point-to-point `send` under send, `recv` under recv, `sendrecv` both ways under send) and
/// their sum.
struct traffic_counts {
  std::array<traffic_figures, collective_kind_count> by_kind{};  ///< indexed by collective_kind

  /// The figures of kind `k`.
  const traffic_figures& of(collective_kind k) const noexcept { return by_kind[static_cast<std::size_t>(k)]; }
  /// Every kind together.
  traffic_figures total() const noexcept {
    traffic_figures t;
    for (const traffic_figures& f : by_kind) t += f;
    return t;
  }
  /// The difference of two readings (this minus `earlier`), kind by kind.
  traffic_counts operator-(const traffic_counts& earlier) const noexcept {
    traffic_counts d;
    for (std::size_t k = 0; k < by_kind.size(); ++k) d.by_kind[k] = by_kind[k] - earlier.by_kind[k];
    return d;
  }
  friend bool operator==(const traffic_counts&, const traffic_counts&) = default;
};

namespace detail {

/// The transport's counters behind `traffic_counts`: relaxed atomics, written by whichever thread runs
/// a collective (the caller's or the progress thread) and read by any thread. A reading taken
/// while a collective runs may show part of it.
class traffic_counter {
 public:
  /// Counts one collective of kind `k` as run.
  void count_call(collective_kind k) noexcept { at(k).calls.fetch_add(1, std::memory_order_relaxed); }
  /// Adds measured bytes to kind `k`.
  void add(collective_kind k, std::uint64_t sent, std::uint64_t received) noexcept {
    figures& f = at(k);
    if (sent != 0) f.sent.fetch_add(sent, std::memory_order_relaxed);
    if (received != 0) f.received.fetch_add(received, std::memory_order_relaxed);
  }
  /// Adds an estimate (a native collective) to kind `k`.
  void add_estimate(collective_kind k, std::uint64_t sent) noexcept {
    at(k).estimated_sent.fetch_add(sent, std::memory_order_relaxed);
  }
  /// The counters now.
  traffic_counts read() const noexcept {
    traffic_counts t;
    for (std::size_t k = 0; k < kinds_.size(); ++k) {
      const figures& f = kinds_[k];
      t.by_kind[k] = {f.calls.load(std::memory_order_relaxed), f.sent.load(std::memory_order_relaxed),
                      f.received.load(std::memory_order_relaxed), f.estimated_sent.load(std::memory_order_relaxed)};
    }
    return t;
  }

 private:
  struct figures {
    std::atomic<std::uint64_t> calls{0}, sent{0}, received{0}, estimated_sent{0};
  };
  figures& at(collective_kind k) noexcept { return kinds_[static_cast<std::size_t>(k)]; }
  std::array<figures, collective_kind_count> kinds_{};
};

/// What a bandwidth-optimal ring (a chain for broadcast and reduce) sends per rank for a
/// collective of kind `k` over `n` ranks that moves `bytes` (traffic_figures::estimated_sent):
/// `bytes` is the whole buffer for all_reduce, broadcast and reduce, one rank's block for
/// reduce_scatter, all_gather and all_to_all (their count is per rank). 0 for n < 2.
constexpr std::uint64_t ring_bytes_per_rank(collective_kind k, int n, std::uint64_t bytes) noexcept {
  if (n < 2) return 0;
  const auto m = static_cast<std::uint64_t>(n - 1);
  switch (k) {
    case collective_kind::all_reduce: return 2 * m * bytes / static_cast<std::uint64_t>(n);
    case collective_kind::reduce_scatter:
    case collective_kind::all_gather:
    case collective_kind::all_to_all: return m * bytes;
    case collective_kind::broadcast:
    case collective_kind::reduce: return m * bytes / static_cast<std::uint64_t>(n);
    default: return 0;
  }
}

}  // namespace detail

}  // namespace ringzero
