#pragma once
/// @file
/// `communicator`: the abstract interface every backend implements (local threads, MPI, NCCL).
///
/// A communicator has a rank, a world size, a memory space, a timeout, and point-to-point
/// transfers of bytes (`sendrecv`, and `sendrecv_reduce`, which combines what it receives into
/// a buffer). The collective layer (collective/) brackets every collective with `begin` and
/// `end`, where backends check NCCL's contract; algorithms (algorithms/) are written against the
/// transfers alone, so every algorithm runs on every backend. A backend may also offer its own
/// collectives (`run_native`) and, on shared memory, its peers' buffers (`peer_descriptor`).
///
/// Thread and ordering semantics: a communicator belongs to one rank and is used by one thread
/// at a time (like an NCCL communicator); its asynchronous operations run on its progress thread
/// in issue order. A second thread entering a collective while another runs one gets
/// errc::invalid_argument (`enter_exclusive`). Users normally call the free functions of
/// collective/, not these members.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ringzero/backend/descriptor.hpp"
#include "ringzero/backend/progress.hpp"
#include "ringzero/core/env.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/core/workspace_pool.hpp"

namespace ringzero {

class communicator;

namespace detail {
/// The operation the calling thread is running, and on which communicator (see
/// communicator::current). A thread runs at most one operation at a time.
struct current_operation {
  static inline thread_local const communicator* comm = nullptr;
  static inline thread_local const collective_descriptor* desc = nullptr;
};
}  // namespace detail

/// Which backend a communicator belongs to.
enum class backend_kind : std::uint8_t { local = 0, mpi = 1, nccl = 2 };

/// "local", "mpi" or "nccl".
constexpr std::string_view backend_name(backend_kind b) noexcept {
  switch (b) {
    case backend_kind::local: return "local";
    case backend_kind::mpi: return "mpi";
    case backend_kind::nccl: return "nccl";
  }
  return "invalid";
}

/// Where a communicator's buffers live: host memory, or CUDA device memory (ordered on a stream).
enum class memory_space : std::uint8_t { host = 0, cuda = 1 };

/// A type-erased element-wise combine `dst[i] = a[i] (op) b[i]` over `count` elements, built by
/// the algorithm layer and called by a backend's `sendrecv_reduce` (Gloo's type-erased reduce
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
};

/// The abstract communicator. See the file comment for its contract.
class communicator {
 public:
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  virtual ~communicator() = default;

  /// This rank, 0 <= rank() < world_size().
  int rank() const noexcept { return rank_; }
  /// Number of ranks (>= 1).
  int world_size() const noexcept { return world_size_; }
  /// Which backend this is.
  virtual backend_kind backend() const noexcept = 0;
  /// Where buffers passed to this communicator must live.
  virtual memory_space space() const noexcept { return memory_space::host; }
  /// For memory_space::cuda: the `cudaStream_t` (as `void*`) on which this communicator orders
  /// its work; collectives are enqueued on it and return before the device has run them, as
  /// NCCL's do. nullptr for host memory.
  virtual void* cuda_stream() const noexcept { return nullptr; }
  /// For memory_space::cuda: the CUDA device of this rank; -1 for host memory.
  virtual int cuda_device() const noexcept { return -1; }
  /// Blocks until every operation issued on this communicator so far has completed: queued
  /// asynchronous work (its errors stay in its `work`) and, on a CUDA stream, the device work
  /// (host memory: only the former). Throws errc::timeout / aborted / backend_failure where the
  /// backend detects that the device work cannot complete.
  virtual void synchronize() { progress_.drain(); }
  /// How long a collective or transfer may wait for peers before failing with errc::timeout.
  std::chrono::duration<double> timeout() const noexcept { return timeout_; }
  /// Sets the timeout (seconds > 0); throws errc::invalid_argument otherwise. Timeouts above
  /// `max_timeout_seconds` (1e9 s), infinity included, are stored as that: for ever.
  void set_timeout(std::chrono::duration<double> t) {
    if (!(t.count() > 0.0))
      raise(errc::invalid_argument, "timeout must be positive, got " + std::to_string(t.count()) + " s");
    timeout_ = bounded_timeout(t);
  }
  /// The algorithm RINGZERO_ALGO forced when this communicator was made (automatic if unset).
  algorithm forced_algorithm() const noexcept { return forced_algorithm_; }
  /// Forces `a` for every collective with an automatic choice where it is available
  /// (`algorithm::automatic` restores the cost model).
  void set_forced_algorithm(algorithm a) noexcept { forced_algorithm_ = a; }

  /// True when RINGZERO_REPRODUCIBLE=1 was set when this communicator was made (or
  /// set_reproducible(true) was called): floating sum, avg and premul_sum reductions then run
  /// in reproducible mode (docs/numerics.md) unless a call's options ask for it themselves.
  bool reproducible() const noexcept { return reproducible_; }
  /// Turns the communicator-wide reproducible mode on or off (every rank must do the same).
  void set_reproducible(bool on) noexcept { reproducible_ = on; }

  /// Number of collectives issued on this communicator so far (the next one's sequence number).
  std::uint64_t issued() const noexcept { return sequence_.load(std::memory_order_relaxed); }

  // ---- used by the collective and algorithm layers -------------------------------------

  /// Reserves the next collective sequence number.
  std::uint64_t next_sequence() noexcept { return sequence_.fetch_add(1, std::memory_order_relaxed); }

  /// Marks the calling thread as the one running a collective on this communicator (the
  /// collective layer calls it around every operation). A communicator is used by one thread
  /// at a time (NCCL's and MPI's rule; asynchronous collectives run in order on its progress
  /// thread): when another thread is already inside one, this raises errc::invalid_argument
  /// on the caller instead of letting the two interleave into a mismatch or wrong numbers.
  /// Detects overlapping calls only; calls from two threads that never overlap in time are
  /// the caller's to order.
  void enter_exclusive() {
    if (busy_.exchange(true, std::memory_order_acquire))
      raise(errc::invalid_argument,
            "another thread is running a collective on this communicator at the same time: a communicator is used "
            "by one thread at a time (issue asynchronous collectives, or give each thread its own communicator)");
  }
  /// Ends `enter_exclusive`.
  void leave_exclusive() noexcept { busy_.store(false, std::memory_order_release); }

  /// Starts collective `d` on this rank: checks the cross-rank contract where the backend can
  /// and throws `ringzero::error` (contract_mismatch, invalid_argument, timeout, aborted,
  /// peer_exited) on every rank when it fails. Every rank calls `begin` then `end` per collective.
  virtual void begin(const collective_descriptor& d) = 0;
  /// Finishes collective `d`: returns once no peer will touch this rank's buffers any more.
  virtual void end(const collective_descriptor& d) = 0;

  /// Sends `send_bytes` bytes from `send` to rank `to` and receives `recv_bytes` bytes from rank
  /// `from` into `recv`, concurrently; `to` or `from` may be -1 for none. Returns when both are
  /// complete. Throws errc::size_mismatch when a peer's matching transfer has another size,
  /// errc::timeout / aborted / peer_exited when it cannot complete.
  virtual void sendrecv(const void* send, std::uint64_t send_bytes, int to, void* recv, std::uint64_t recv_bytes,
                        int from) = 0;

  /// Like `sendrecv`, but the received `bytes` are combined on arrival: `acc = own (op) received`
  /// via `combine` (`own` may equal `acc`). Sends `send_bytes` from `send` to `to` (or none if
  /// `to` is -1). Zero-copy backends combine straight from the sender's memory.
  virtual void sendrecv_reduce(const void* send, std::uint64_t send_bytes, int to, const void* own, void* acc,
                               std::uint64_t bytes, int from, const combine_fn& combine) = 0;

  /// Called after a failure inside collective `d` (after `abort`): returns once peers can no longer
  /// touch this rank's buffers for `d`, so the caller may free them. Default: nothing (backends
  /// whose transfers copy through their own buffers).
  virtual void abandon(const collective_descriptor& d) noexcept { (void)d; }

  /// Rank `r`'s descriptor of the current collective when the backend shares memory between
  /// ranks (valid between `begin` and `end`); nullptr on backends without shared memory.
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

  /// Runs `d` with the backend's own collective. Default: throws errc::unsupported.
  virtual void run_native(const collective_descriptor& d) {
    raise(errc::unsupported,
          "backend " + std::string(backend_name(backend())) + " has no native " + std::string(collective_name(d.kind)));
  }

  /// True when the cost model should pick the backend's own collective for `k` whenever it
  /// has one (NCCL's collectives beat any schedule built from its send/recv).
  virtual bool prefers_native(collective_kind k) const noexcept {
    (void)k;
    return false;
  }

  /// Cost parameters of this backend (collective/selection.hpp).
  virtual link_model link() const noexcept = 0;

  /// Makes every rank's pending and future waits on this communicator fail promptly with
  /// `reason` (called when a rank fails in the middle of a collective, so peers never hang).
  /// Default: nothing (backends without shared state rely on their timeout).
  virtual void abort(const std::string& reason) noexcept { (void)reason; }

  /// Scratch memory in this communicator's memory space: slot `slot`, at least `bytes` bytes,
  /// reused across calls (see workspace_pool). Valid until the same slot grows.
  virtual void* scratch(int slot, std::size_t bytes) { return pool_.get(slot, bytes); }

  /// Bytes of scratch memory currently held.
  virtual std::size_t scratch_bytes() const noexcept { return pool_.capacity_bytes(); }

  /// The progress engine that runs this communicator's asynchronous operations.
  detail::progress_engine& progress() noexcept { return progress_; }

  /// The collective that the calling thread is running on this communicator (for error messages
  /// and transfer matching), or nullptr. Per thread: the owning thread and the progress thread
  /// never see each other's, so reading it never races with a collective finishing elsewhere.
  const collective_descriptor* current() const noexcept {
    return detail::current_operation::comm == this ? detail::current_operation::desc : nullptr;
  }
  /// Sets (or clears, with nullptr) the calling thread's current collective on this communicator
  /// (the collective layer does this, around each operation it runs).
  void set_current(const collective_descriptor* d) noexcept {
    detail::current_operation::comm = d ? this : nullptr;
    detail::current_operation::desc = d;
  }

  /// Where an error raised now happened: backend, rank, world size and current collective.
  error_context context() const {
    error_context c;
    c.backend = std::string(backend_name(backend()));
    c.rank = rank_;
    c.world_size = world_size_;
    if (const collective_descriptor* d = current()) {
      c.collective = std::string(collective_name(d->kind));
      if (d->kind != collective_kind::send && d->kind != collective_kind::recv)
        c.sequence = static_cast<std::int64_t>(d->sequence);
    }
    return c;
  }

  /// Throws `ringzero::error(code, context(), message)`.
  [[noreturn]] void raise(errc code, const std::string& message) const { throw error(code, context(), message); }

 protected:
  /// Base constructor; throws errc::invalid_argument unless 0 <= rank < world_size, or when
  /// RINGZERO_TIMEOUT, RINGZERO_ALGO or RINGZERO_REPRODUCIBLE is malformed. The timeout starts from RINGZERO_TIMEOUT
  /// (default 300 s), the forced algorithm from RINGZERO_ALGO.
  communicator(int rank, int world_size)
      : rank_(rank),
        world_size_(world_size),
        timeout_(env_timeout()),
        forced_algorithm_(env_algorithm()),
        reproducible_(env_reproducible()) {
    if (world_size < 1)
      throw error(errc::invalid_argument, "world size must be at least 1, got " + std::to_string(world_size));
    if (rank < 0 || rank >= world_size)
      throw error(errc::invalid_argument,
                  "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world_size) + ")");
  }

  /// Stops the progress thread after its queued work; derived destructors call this first so
  /// that no queued operation runs against a half-destroyed communicator.
  void stop_progress() noexcept {
    try {
      progress_.shutdown();
    } catch (...) {}
  }

 private:
  int rank_;
  int world_size_;
  std::chrono::duration<double> timeout_;
  algorithm forced_algorithm_ = algorithm::automatic;
  bool reproducible_ = false;
  std::atomic<std::uint64_t> sequence_{0};
  std::atomic<bool> busy_{false};  ///< a thread is inside a collective (enter_exclusive)
  workspace_pool pool_;
  detail::progress_engine progress_;
};

namespace detail {

/// Sets and clears the communicator's current collective (for error messages).
class current_collective {
 public:
  current_collective(communicator& c, const collective_descriptor* d) noexcept : c_(c) { c_.set_current(d); }
  ~current_collective() { c_.set_current(nullptr); }
  current_collective(const current_collective&) = delete;
  current_collective& operator=(const current_collective&) = delete;

 private:
  communicator& c_;
};

}  // namespace detail

}  // namespace ringzero
