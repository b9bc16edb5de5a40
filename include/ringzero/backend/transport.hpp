#pragma once
/// @file
/// `transport`: the interface the collective and algorithm layers move bytes through (as Gloo's
/// transport::Pair is apart from its Context); users hold a `communicator` instead.
///
/// Every call that belongs to a collective receives it (`op`, whose `sequence` is the tag that
/// matches transfers across ranks), so error messages and matching never depend on thread state.
/// The collective layer brackets each collective with `begin` and `end`; algorithms use the
/// transfers alone, so every algorithm runs on every backend. A backend may also offer its own
/// collectives (`run_native`) and, on shared memory, its peers' buffers (`peer_descriptor`).
/// Thread semantics: as its communicator's (one thread at a time, plus its progress thread).
/// The manual: docs/backends.md.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ringzero/backend/descriptor.hpp"
#include "ringzero/backend/progress.hpp"
#include "ringzero/backend/traffic.hpp"
#include "ringzero/core/enum_names.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/workspace_pool.hpp"

namespace ringzero {

/// Which backend a communicator belongs to.
enum class backend_kind : std::uint8_t { local = 0, mpi = 1, nccl = 2 };

/// "local", "mpi" or "nccl".
inline constexpr enum_names<backend_kind, 3> backend_names{"local", "mpi", "nccl"};
/// "local", "mpi" or "nccl" (`backend_names`).
constexpr std::string_view backend_name(backend_kind b) noexcept { return backend_names(b); }

/// Where a communicator's buffers live: host memory, or CUDA device memory (ordered on a stream).
enum class memory_space : std::uint8_t { host = 0, cuda = 1 };

/// A type-erased element-wise combine `dst[i] = a[i] (op) b[i]` over `count` elements, built by
/// the algorithm layer and called by a backend's `backend_sendrecv_reduce` (Gloo's type-erased reduce
/// function). `a` is the receiver's own operand, `b` the received data.
struct combine_fn {
  void (*fn)(const void* context, void* dst, const void* a, const void* b, std::uint64_t count) = nullptr;
  const void* context = nullptr;
  std::size_t element_size = 1;  ///< bytes per element of every operand

  /// Calls the combine.
  void operator()(void* dst, const void* a, const void* b, std::uint64_t count) const { fn(context, dst, a, b, count); }
};

/// Cost parameters of a backend for the algorithm-selection model (collective/selection.hpp):
/// an alpha-beta-gamma model (Hockney; Thakur, Rabenseifner & Gropp 2005) plus the terms of the
/// shared-memory `direct` algorithm. Units: microseconds and microseconds per byte.
struct link_model {
  double alpha_us = 1.0;             ///< latency of one point-to-point step
  double beta_us_per_byte = 1e-4;    ///< per byte transferred between two ranks
  double gamma_us_per_byte = 1e-4;   ///< per byte combined by a reduction
  double sync_us = 0.0;              ///< one all-rank synchronisation (direct only)
  double memory_us_per_byte = 1e-4;  ///< per byte of memory traffic on one rank (direct only)
  double cache_us_per_byte = 0.0;    ///< per byte through direct's L1-resident tile (write or read)
  /// The largest message that travels in one trip (MPI's eager protocol); a larger one first
  /// waits for its receiver (a rendezvous handshake), which costs one more alpha per step in
  /// the all_reduce formulas of ring and halving_doubling. 0: no such limit.
  double eager_bytes = 0.0;
};

/// True when a message of `message` bytes is past the eager limit `eager_bytes`
/// (link_model::eager_bytes; 0: none), so that its step pays the rendezvous handshake.
constexpr bool past_eager_limit(double eager_bytes, double message) noexcept {
  return eager_bytes > 0 && message > eager_bytes;
}

/// The byte-moving interface of one rank. See the file comment.
class transport {
 public:
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;
  virtual ~transport() = default;

  /// This rank, 0 <= rank() < world_size().
  int rank() const noexcept { return rank_; }
  /// Number of ranks (>= 1).
  int world_size() const noexcept { return world_size_; }
  /// Which backend this is.
  virtual backend_kind backend() const noexcept = 0;
  /// Where the buffers of every transfer live.
  virtual memory_space space() const noexcept = 0;
  /// memory_space::cuda: the `cudaStream_t` (as `void*`) that orders this rank's work; else nullptr.
  virtual void* cuda_stream() const noexcept = 0;
  /// memory_space::cuda: this rank's CUDA device; else -1.
  virtual int cuda_device() const noexcept = 0;

  /// Reserves the next collective sequence number (the tag of its transfers).
  /// Taken when the collective starts running (inline, or on the progress thread in queue
  /// order), so that the numbers follow the order in which a rank's calls run, which is the
  /// order of issue on the owning thread whichever thread runs them.
  std::uint64_t next_sequence() noexcept { return sequence_.fetch_add(1, std::memory_order_relaxed); }
  /// Counts a collective as issued (`issued()`), when the caller issues it.
  void count_issue() noexcept { issued_.fetch_add(1, std::memory_order_relaxed); }
  /// Number of collectives issued so far (counted at issue; sequence numbers are taken at start).
  std::uint64_t issued() const noexcept { return issued_.load(std::memory_order_relaxed); }

  /// Marks the calling thread as the one running `op` here. A communicator is used by one thread
  /// at a time (NCCL's and MPI's rule): when another thread is inside a collective, raises
  /// errc::invalid_argument instead of letting the two interleave. Detects overlap only.
  void enter_exclusive(const collective_descriptor& op) {
    if (busy_.exchange(true, std::memory_order_acquire))
      raise(&op, errc::invalid_argument,
            "another thread is running a collective on this communicator at the same time: a communicator is used "
            "by one thread at a time (issue asynchronous collectives, or give each thread its own communicator)");
  }
  /// Ends `enter_exclusive`.
  void leave_exclusive() noexcept { busy_.store(false, std::memory_order_release); }

  /// Starts collective `op` on this rank: checks the cross-rank contract where the backend can
  /// and throws `ringzero::error` (contract_mismatch, invalid_argument, timeout, aborted,
  /// peer_exited) on every rank when it fails. Every rank calls `begin` then `end` per collective.
  virtual void begin(const collective_descriptor& op) = 0;
  /// Finishes collective `op`: returns once no peer will touch this rank's buffers any more.
  virtual void end(const collective_descriptor& op) = 0;

  /// Within `op`: sends `send_bytes` bytes from `send` to rank `to` and receives `recv_bytes`
  /// bytes from rank `from` into `recv`, concurrently; `to` or `from` may be -1 for none. Returns
  /// when both are complete, and counts both in `traffic()` under `op`'s kind (a copy to oneself
  /// is not traffic). Throws errc::size_mismatch when a peer's matching transfer has another
  /// size, errc::timeout / aborted / peer_exited when it cannot complete (nothing counted then).
  void sendrecv(const collective_descriptor& op, const void* send, std::uint64_t send_bytes, int to, void* recv,
                std::uint64_t recv_bytes, int from) {
    backend_sendrecv(op, send, send_bytes, to, recv, recv_bytes, from);
    traffic_.add(op.kind, counted(to, send_bytes), counted(from, recv_bytes));
  }

  /// Like `sendrecv`, but the received `bytes` are combined on arrival: `acc = own (op) received`
  /// via `combine` (`own` may equal `acc`). Zero-copy backends combine straight from the sender.
  void sendrecv_reduce(const collective_descriptor& op, const void* send, std::uint64_t send_bytes, int to,
                       const void* own, void* acc, std::uint64_t bytes, int from, const combine_fn& combine) {
    backend_sendrecv_reduce(op, send, send_bytes, to, own, acc, bytes, from, combine);
    traffic_.add(op.kind, counted(to, send_bytes), counted(from, bytes));
  }

  /// Counts bytes moved within `op` without `sendrecv`: under `direct`, the bytes that leave this
  /// rank's buffers for peers' (`sent`) and that come from peers' buffers into this rank's
  /// (`received`), whichever rank copies them.
  void count_peer_traffic(const collective_descriptor& op, std::uint64_t sent, std::uint64_t received) noexcept {
    traffic_.add(op.kind, sent, received);
  }
  /// Counts a native collective's estimated bytes sent (detail::ring_bytes_per_rank).
  void count_estimated_traffic(const collective_descriptor& op, std::uint64_t sent) noexcept {
    traffic_.add_estimate(op.kind, sent);
  }
  /// Counts collective `op` as run (collective/dispatch.hpp, once per collective).
  void count_run(const collective_descriptor& op) noexcept { traffic_.count_call(op.kind); }
  /// This rank's traffic so far (backend/traffic.hpp). Any thread.
  traffic_counts traffic() const noexcept { return traffic_.read(); }

  /// Called after a failure inside `op` (after `abort`): returns once peers can no longer touch
  /// this rank's buffers for `op`. Default: nothing (backends that copy through their own buffers).
  virtual void abandon(const collective_descriptor& op) noexcept { (void)op; }

  /// Rank `r`'s descriptor of the running collective when ranks share memory (valid between
  /// `begin` and `end`); nullptr on backends without shared memory.
  virtual const collective_descriptor* peer_descriptor(int r) const noexcept {
    (void)r;
    return nullptr;
  }

  /// True when this backend can run `k` with algorithm `a` (ring and halving_doubling are
  /// available everywhere; direct needs shared memory; native needs the backend's own collective).
  virtual bool supports(algorithm a, collective_kind k) const noexcept {
    (void)k;
    return a == algorithm::ring || a == algorithm::halving_doubling;
  }

  /// Runs `op` with the backend's own collective. Default: throws errc::unsupported.
  virtual void run_native(const collective_descriptor& op) {
    raise(
        &op, errc::unsupported,
        "backend " + std::string(backend_name(backend())) + " has no native " + std::string(collective_name(op.kind)));
  }

  /// True when the cost model should pick the backend's own collective for `k` whenever it
  /// has one (NCCL's collectives beat any schedule built from its send/recv).
  virtual bool prefers_native(collective_kind k) const noexcept {
    (void)k;
    return false;
  }

  /// Cost parameters of this backend (collective/selection.hpp).
  virtual link_model link() const noexcept = 0;

  /// The measured choice for `k` at S = `bytes` on this communicator (core/tuning_table.hpp),
  /// which the cost model defers to when the algorithm is available; std::nullopt where no rule
  /// applies. Default: none (the MPI backend has a tuning table).
  virtual std::optional<algorithm> tuned_choice(collective_kind k, double bytes) const noexcept {
    (void)k;
    (void)bytes;
    return std::nullopt;
  }

  /// Makes every rank's pending and future waits fail promptly with `reason` (a rank failed in
  /// a collective). Default: nothing (backends without shared state rely on their timeout).
  virtual void abort(const std::string& reason) noexcept { (void)reason; }

  /// Scratch memory in this rank's memory space: slot `slot`, at least `bytes` bytes, reused
  /// across calls (see workspace_pool). Valid until the same slot grows.
  virtual void* scratch(int slot, std::size_t bytes) { return pool_.get(slot, bytes); }

  /// Bytes of scratch memory currently held.
  virtual std::size_t scratch_bytes() const noexcept { return pool_.capacity_bytes(); }

  /// The progress engine that runs this rank's asynchronous operations.
  detail::progress_engine& progress() noexcept { return progress_; }

  /// Where an error raised within `op` (nullptr: outside any collective) happened: backend,
  /// rank, world size, and the collective with its sequence number.
  error_context context(const collective_descriptor* op) const {
    error_context c;
    c.backend = std::string(backend_name(backend()));
    c.rank = rank_;
    c.world_size = world_size_;
    if (op != nullptr) {
      c.collective = std::string(collective_name(op->kind));
      if (op->kind != collective_kind::send && op->kind != collective_kind::recv)
        c.sequence = static_cast<std::int64_t>(op->sequence);
    }
    return c;
  }

  /// Throws `ringzero::error(code, context(op), message)`.
  [[noreturn]] void raise(const collective_descriptor* op, errc code, const std::string& message) const {
    throw error(code, context(op), message);
  }

 protected:
  /// Rank `rank` of `world_size` (the communicator checks both).
  transport(int rank, int world_size) noexcept : rank_(rank), world_size_(world_size) {}

  /// The backend's transfer behind `sendrecv` (same contract; the wrapper counts the bytes).
  virtual void backend_sendrecv(const collective_descriptor& op, const void* send, std::uint64_t send_bytes, int to,
                                void* recv, std::uint64_t recv_bytes, int from) = 0;
  /// The backend's combining transfer behind `sendrecv_reduce` (same contract).
  virtual void backend_sendrecv_reduce(const collective_descriptor& op, const void* send, std::uint64_t send_bytes,
                                       int to, const void* own, void* acc, std::uint64_t bytes, int from,
                                       const combine_fn& combine) = 0;

  /// Stops the progress thread after its queued work; backend destructors call this first so
  /// that no queued operation runs against a half-destroyed backend.
  void stop_progress() noexcept {
    try {
      progress_.shutdown();
    } catch (...) {}
  }

 private:
  /// The bytes of a transfer with `peer` that count as traffic: none for no peer or oneself.
  std::uint64_t counted(int peer, std::uint64_t bytes) const noexcept { return peer >= 0 && peer != rank_ ? bytes : 0; }

  int rank_;
  int world_size_;
  std::atomic<std::uint64_t> sequence_{0};
  std::atomic<std::uint64_t> issued_{0};
  std::atomic<bool> busy_{false};  ///< a thread is inside a collective (enter_exclusive)
  workspace_pool pool_;
  detail::traffic_counter traffic_;
  detail::progress_engine progress_;
};

}  // namespace ringzero
