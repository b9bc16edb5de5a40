#pragma once
/// @file
/// `communicator`: what a user holds for one rank (as Gloo's Context): rank, world size, backend,
/// memory space, timeout, algorithm and reproducibility settings, and `synchronize`. Users pass
/// it to the collectives of collective/. How bytes move is the backend's `transport`
/// (backend/transport.hpp), reached by the collective layer through `detail::transport_of`;
/// every backend implements both (backend/backend_communicator.hpp). See docs/backends.md.
///
/// Thread semantics: a communicator belongs to one rank and is used by one thread at a time
/// (like an NCCL communicator); its asynchronous operations run on its progress thread in issue
/// order. A second thread entering a collective while another runs one gets errc::invalid_argument.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ringzero/backend/transport.hpp"
#include "ringzero/core/env.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero {

class communicator;

namespace detail {
/// The transport of `c` (the collective and algorithm layers' way in; users never need it).
transport& transport_of(const communicator& c) noexcept;
[[noreturn]] void raise(const communicator& c, errc code, const std::string& message);
}  // namespace detail

/// The user-facing communicator of one rank. See the file comment.
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
  virtual void synchronize() { its_transport().progress().drain(); }
  /// How long a collective or transfer may wait for peers before failing with errc::timeout.
  std::chrono::duration<double> timeout() const noexcept { return timeout_; }
  /// Sets the timeout (seconds > 0); throws errc::invalid_argument otherwise. Timeouts above
  /// `max_timeout_seconds` (1e9 s), infinity included, are stored as that: for ever.
  void set_timeout(std::chrono::duration<double> t) {
    if (!(t.count() > 0.0))
      detail::raise(*this, errc::invalid_argument, "timeout must be positive, got " + std::to_string(t.count()) + " s");
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

  /// Number of collectives issued on this communicator so far (including asynchronous ones not
  /// yet run, and those a ZeRO communication stream issues when its task runs).
  std::uint64_t issued() const noexcept { return its_transport().issued(); }
  /// Bytes of scratch memory the backend holds for this rank's collectives (in its memory space),
  /// reused across calls and grown on demand: for memory accounting.
  std::size_t scratch_bytes() const noexcept { return its_transport().scratch_bytes(); }
  /// The bytes this rank's collectives and transfers moved so far, per collective kind
  /// (backend/traffic.hpp): measured for ringzero's schedules, estimated for the backend's own
  /// collectives. Subtract two readings for a step's traffic. Any thread; a reading taken while
  /// a collective runs may include part of it.
  traffic_counts traffic() const noexcept { return its_transport().traffic(); }

 protected:
  /// Base constructor; throws errc::invalid_argument unless 0 <= rank < world_size, or when
  /// RINGZERO_TIMEOUT, RINGZERO_ALGO or RINGZERO_REPRODUCIBLE is malformed. The timeout starts
  /// from RINGZERO_TIMEOUT (default 300 s), the forced algorithm from RINGZERO_ALGO. With
  /// `defer_environment_errors` a malformed variable is kept in `environment_error()` instead
  /// (the defaults apply), for a backend whose handshake reports it on every rank (MPI: a rank
  /// that threw alone would leave its peers waiting in theirs).
  communicator(int rank, int world_size, bool defer_environment_errors = false) : rank_(rank), world_size_(world_size) {
    try {
      timeout_ = env_timeout();
      forced_algorithm_ = env_algorithm();
      reproducible_ = env_reproducible();
    } catch (const error& e) {
      if (!defer_environment_errors) throw;
      environment_error_ = e.message();
    }
    if (world_size < 1)
      throw error(errc::invalid_argument, "world size must be at least 1, got " + std::to_string(world_size));
    if (rank < 0 || rank >= world_size)
      throw error(errc::invalid_argument,
                  "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world_size) + ")");
  }

 private:
  friend transport& detail::transport_of(const communicator& c) noexcept;
  /// The backend's transport (backend/backend_communicator.hpp implements it).
  virtual transport& its_transport() const noexcept = 0;

  int rank_;
  int world_size_;
  std::chrono::duration<double> timeout_{default_timeout_seconds};
  algorithm forced_algorithm_ = algorithm::automatic;
  bool reproducible_ = false;
  std::string environment_error_;

 protected:
  /// Why a RINGZERO_* variable was refused when deferred (see the constructor); empty when none.
  const std::string& environment_error() const noexcept { return environment_error_; }
};

namespace detail {

inline transport& transport_of(const communicator& c) noexcept { return c.its_transport(); }

/// `c`'s backend, rank and world size, for an error raised outside any collective (no
/// collective or sequence number, unlike the transport's context of an operation).
inline error_context context_of(const communicator& c) {
  error_context e;
  e.backend = std::string(backend_name(c.backend()));
  e.rank = c.rank();
  e.world_size = c.world_size();
  return e;
}

/// Throws `ringzero::error(code, ...)` with `c`'s backend, rank and world size (no collective).
[[noreturn]] inline void raise(const communicator& c, errc code, const std::string& message) {
  transport_of(c).raise(nullptr, code, message);
}

}  // namespace detail

}  // namespace ringzero
