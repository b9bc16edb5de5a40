#pragma once
/// @file
/// `mpi::communicator`: one rank per MPI process, over a duplicate of an MPI communicator
/// (MPI_COMM_WORLD or one of the program's); how CPU jobs leave one machine. It runs ring and
/// halving_doubling over nonblocking point-to-point transfers (backend/mpi/transport.hpp) and
/// MPI's own collectives as the algorithm `native` (backend/mpi/native_collectives.hpp).
/// Errors: invalid or mismatched arguments raise the same ringzero::error on every rank (before
/// any data moves in check mode, RINGZERO_CHECK=1); a wait past `timeout()` aborts the job or
/// throws, per `failure_policy`; a peer that destroyed its communicator makes waiting ranks fail
/// with errc::peer_exited (backend/mpi/control_channel.hpp).
/// Threads: used by one thread at a time (its owner or its progress thread); MPI must run at
/// MPI_THREAD_SERIALIZED or above. Construction and destruction are collective.
/// Manual (transfers, settings, contract checking, timeouts, departures, `native`): docs/mpi.md.

#include "ringzero/backend/mpi/comm_holder.hpp"
#include "ringzero/backend/mpi/datatype.hpp"
#include "ringzero/backend/mpi/environment.hpp"
#include "ringzero/backend/mpi/lingering.hpp"
#include "ringzero/backend/mpi/link_pacer.hpp"
#include "ringzero/backend/mpi/options.hpp"
#include "ringzero/backend/mpi/wire.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ringzero/backend/backend_communicator.hpp"
#include "ringzero/backend/contract.hpp"
#include "ringzero/backend/protocol/contract_exchange.hpp"
#include "ringzero/backend/protocol/failure_text.hpp"
#include "ringzero/backend/protocol/watchdog.hpp"
#include "ringzero/core/config.hpp"
#include "ringzero/core/wait.hpp"
#include "ringzero/primitive/copy.hpp"
#include "ringzero/primitive/reduce.hpp"

namespace ringzero::mpi {

/// Exit code of a job aborted by a timeout (like the `timeout` command's).
inline constexpr int timeout_exit_code = 124;

/// How long the destructor of an aborted communicator waits for its peers' departure notices
/// (or the timeout, when shorter). After a failure the peers that are still waiting fail at
/// their next poll (within milliseconds) and depart at once; a peer busy elsewhere (computing,
/// sleeping, stuck) would otherwise hold the destructor for a whole timeout. The MPI
/// communicators of a peer that has not departed by then are not freed at once (see
/// `detail::lingering`).
inline constexpr std::chrono::milliseconds failed_departure_wait{250};

/// True when this build checks contracts by default (no NDEBUG: a debug build).
#ifdef NDEBUG
inline constexpr bool check_by_default = false;
#else
inline constexpr bool check_by_default = true;
#endif

namespace detail {

/// What a rank knows about a peer that left the communicator.
struct peer_state {
  bool departed = false;
  bool unwinding = false;
  std::uint64_t data_sent_to_me = 0;        ///< data slices it had sent to this rank
  std::uint64_t data_received_from_me = 0;  ///< data slices it had received from this rank
  std::uint64_t records_sent_to_me = 0;     ///< check-mode descriptors it had sent to this rank
};

/// The rank and size of `comm`, after checking that MPI is usable with ringzero.
struct comm_shape {
  int rank = 0;
  int size = 1;
  bool serialize = false;

  explicit comm_shape(MPI_Comm comm) {
    if (!is_active())
      throw error(
          errc::invalid_argument,
          "mpi::communicator: MPI is not initialised (or already finalised); create a ringzero::mpi::environment "
          "or call MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) first");
    const int level = thread_level();
    if (level < MPI_THREAD_SERIALIZED)
      throw error(errc::unsupported,
                  std::string("mpi::communicator: MPI was initialised with ") + thread_level_name(level) +
                      "; ringzero runs asynchronous collectives on a progress thread and needs "
                      "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (use ringzero::mpi::environment, or "
                      "MPI_Init_thread with MPI_THREAD_MULTIPLE)");
    serialize = level < MPI_THREAD_MULTIPLE;
    if (comm == MPI_COMM_NULL)
      throw error(errc::invalid_argument, "mpi::communicator: the MPI communicator is MPI_COMM_NULL");
    int inter = 0;
    MPI_Comm_test_inter(comm, &inter);
    if (inter) throw error(errc::invalid_argument, "mpi::communicator: intercommunicators are not supported");
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
};

/// Number of slices of a transfer of `bytes` bytes (at least 1: an empty message still travels).
constexpr std::uint64_t slice_count(std::uint64_t bytes, std::uint64_t slice) noexcept {
  return bytes <= slice ? 1 : (bytes + slice - 1) / slice;
}

}  // namespace detail

/// One rank of an MPI communicator. See the file comment for transfers, checking, timeouts
/// and threads.
class communicator final : public ringzero::detail::backend_communicator {
 public:
  /// Makes a communicator over a duplicate of `comm` (collective over `comm`: every rank of it
  /// must construct one). Throws errc::invalid_argument when MPI is not initialised, `comm` is
  /// null or an intercommunicator, the options are invalid, a RINGZERO_* variable is malformed
  /// on any rank, the ranks disagree on the check mode, slice size, pipeline depth, link model,
  /// paced link or RINGZERO_ALGO, or the size differs from
  /// `expected_world_size`; errc::unsupported below MPI_THREAD_SERIALIZED; errc::timeout when
  /// not every rank joins within the timeout (under failure_policy::throw_error).
  explicit communicator(MPI_Comm comm = MPI_COMM_WORLD, const communicator_options& options = {})
      : communicator(detail::comm_shape(comm), comm, options) {}

  /// Stops the progress thread after its queued work, tells the peers that this rank left and
  /// waits for their departure notices, then frees the MPI communicators. The wait lasts up to
  /// the timeout, or up to `failed_departure_wait` (250 ms) once the communicator was aborted
  /// (a failure here or on a peer: the peers still in a wait fail and depart at once, and one
  /// busy elsewhere must not hold this rank for another timeout), then up to 200 ms more to
  /// cancel notices that a busy peer has not taken. When a peer has not departed by then, the
  /// MPI communicators go to `detail::lingering`, which frees them once that peer's notice
  /// arrives (looked for whenever a later communicator is made or destroyed). Never throws.
  /// Must run before MPI_Finalize; after it, nothing is freed.
  ~communicator() override {
    stop_progress();
    watchdog_.stop();
    if (!is_active()) {
      (void)data_.release();
      (void)control_.release();
      return;
    }
    bool all_departed = true;
    try {
      all_departed = depart();
    } catch (...) { all_departed = false; }
    if (!abandon(notice_requests_)) {
      std::vector<std::unique_ptr<detail::notice>> none;
      keep_notice_bodies(none);
    }
    if (!all_departed && world_size() > 1) {
      std::vector<char> departed(static_cast<std::size_t>(world_size()), 0);
      for (int p = 0; p < world_size(); ++p)
        departed[static_cast<std::size_t>(p)] = p == rank() || peers_[static_cast<std::size_t>(p)].departed ? 1 : 0;
      try {
        detail::lingering::add(data_.get(), control_.get(), instance_, std::move(departed));
        (void)data_.release();
        (void)control_.release();
      } catch (...) {  // no memory to remember them: free them now
      }
    }
    detail::lingering::collect(serialize_);
  }

  backend_kind backend() const noexcept override { return backend_kind::mpi; }

  /// ring, halving_doubling and native (every collective); not direct (no shared memory), and
  /// not native while sends are paced (communicator_options::link_gbps).
  bool supports(algorithm a, collective_kind k) const noexcept override {
    if (k == collective_kind::send || k == collective_kind::recv) return false;
    return a == algorithm::ring || a == algorithm::halving_doubling || (a == algorithm::native && !pacer_.active());
  }

  /// Cost parameters over MPI point-to-point: `communicator_options::link` when given, else
  /// `default_link(any node oversubscribed)`.
  link_model link() const noexcept override { return link_; }

  /// The tuning table's choice (communicator_options::tuning, RINGZERO_MPI_TUNING) for `k` at
  /// S = `bytes` on this communicator's world size; std::nullopt where no rule applies.
  std::optional<algorithm> tuned_choice(collective_kind k, double bytes) const noexcept override {
    return tuning_.choice(k, world_size(), bytes);
  }
  /// The tuning table in use (empty when none).
  const tuning_table& tuning() const noexcept { return tuning_; }

  /// The default cost parameters, measured with `ringzero-mpi-compare --link` on the
  /// development machine (Open MPI 4.1, shared memory between processes, a 2-core VM shared
  /// with other jobs; docs/mpi.md has the ranges): alpha is the time of one exchange step of
  /// small messages between ring neighbours, beta the inverse bandwidth of exchange steps of
  /// 64 KiB to 1 MiB, gamma the inverse rate of the float32 combine, both in cache, where the
  /// model's choices fall. When any node runs more processes than it has processors
  /// (`oversubscribed`), every step also waits for the peer to be scheduled: alpha is then the
  /// measured 4 us (4 processes on 2 cores, 2.9-4.3 us in two runs) and the byte rates lower
  /// (beta 3.3-4.2e-4 us/B). Open MPI's shared memory sends a message of up to 4 KiB less its
  /// header in one trip (btl_vader_eager_limit 4096); a 4096-byte message waits for a handshake:
  /// one step of 4 KiB took 2.6-2.9 us against 1.3-1.5 us for two steps of 2 KiB (2 processes,
  /// `ringzero-mpi-compare -b 4K`), hence eager_bytes 4032. `direct` does not exist over MPI;
  /// its terms are unused.
  static constexpr link_model default_link(bool oversubscribed) noexcept {
    link_model m;
    m.alpha_us = oversubscribed ? 4.0 : 2.0;
    m.beta_us_per_byte = oversubscribed ? 4e-4 : 1.5e-4;
    m.gamma_us_per_byte = 1e-4;
    m.sync_us = m.alpha_us;
    m.memory_us_per_byte = m.beta_us_per_byte;
    m.eager_bytes = 4032;
    return m;
  }

  /// Splits this communicator like ncclCommSplit / MPI_Comm_split: ranks passing the same
  /// `color` (>= 0) form a new communicator, ordered by `key` then by rank here; a negative
  /// color takes part but gets nullptr. Collective over this communicator (it first
  /// synchronises with a timeout, so a rank that never calls `split` makes the others fail
  /// with errc::timeout instead of hanging). The new communicator inherits the check mode,
  /// timeout, failure policy, slice size, pipeline depth and forced algorithm.
  std::unique_ptr<communicator> split(int color, int key) {
    progress().drain();
    synchronize(nullptr, "split");
    detail::comm_holder sub;
    {
      auto lock = mpi_lock();
      check(nullptr, MPI_Comm_split(data_.get(), color < 0 ? MPI_UNDEFINED : color, key, sub.out()), "MPI_Comm_split");
    }
    if (sub.get() == MPI_COMM_NULL) return nullptr;
    communicator_options o = options_;
    o.check = check_;
    o.timeout = timeout();
    o.on_timeout = policy_;
    o.expected_world_size = 0;
    o.link = link_;
    o.tuning = tuning_;  // the parent's table, not RINGZERO_MPI_TUNING read again
    auto child = std::make_unique<communicator>(sub.get(), o);
    child->set_forced_algorithm(forced_algorithm());
    return child;
  }

  /// True when collectives exchange descriptors before running (check mode).
  bool checking() const noexcept { return check_; }
  /// The reaction to timeouts.
  failure_policy on_timeout() const noexcept { return policy_; }
  /// Sets the reaction to timeouts (on this rank).
  void set_failure_policy(failure_policy p) noexcept { policy_ = p; }
  /// True when more processes share this node than it has processors (the default link model
  /// then counts the wait for a peer to be scheduled into every step: `default_link`).
  bool oversubscribed() const noexcept { return oversubscribed_; }
  /// True once this communicator was aborted (by a failure here or a peer's notice).
  bool aborted() const noexcept { return aborted_; }
  /// Bytes per slice of pipelined transfers.
  std::uint64_t slice_bytes() const noexcept { return slice_bytes_; }
  /// Slices a combining receive keeps posted.
  int pipeline_depth() const noexcept { return pipeline_depth_; }
  /// True when every rank of this communicator runs on this node.
  bool single_node() const noexcept { return single_node_; }
  /// The MPI communicator ringzero's data travels on. For calls that do not communicate on
  /// it (MPI_Comm_rank, attributes, MPI_Abort); messages of your own would be mistaken for
  /// ringzero's.
  MPI_Comm handle() const noexcept { return data_.get(); }

  std::size_t scratch_bytes() const noexcept override {
    return transport::scratch_bytes() + (staging_ ? staging_->capacity_bytes() : 0);
  }

  // ---- the collective layer's interface --------------------------------------------------

  void begin(const collective_descriptor& d) override {
    if (world_size() == 1) {
      if (!d.invalid.empty())
        raise(&d, d.invalid_code, "invalid arguments (rank 0: " + d.invalid + "); no rank ran it");
      return;
    }
    raise_if_unusable(&d);
    poll_notices();  // an abort or departure that already arrived fails here, before anything is sent
    raise_if_unusable(&d);
    if (check_) {
      exchange_descriptors(d);
      return;
    }
    if (!d.invalid.empty()) {
      fail(&d, d.invalid_code,
           "invalid arguments (rank " + std::to_string(rank()) + ": " + d.invalid +
               "); the communicator is aborted so that no peer waits for this rank");
    }
  }

  /// Receives the control notices that arrived during the collective and raises when the
  /// communicator was aborted meanwhile: a rank that arrives late, after its peers gave up, can
  /// complete an exchange with data they sent before they failed (eager messages already
  /// delivered) while the abort notice, sent later on the control communicator, was not yet
  /// received when the collective began; its result would then be wrong without an error.
  void end(const collective_descriptor& d) override {
    if (world_size() == 1) return;
    poll_notices();
    raise_if_unusable(&d);
  }

 protected:
  /// A collective's step, or a point-to-point send/recv/sendrecv (the current operation's kind
  /// is send or recv). In check mode a point-to-point transfer first exchanges records with
  /// its peers (`exchange_transfer_records`), so that a size mismatch raises
  /// errc::size_mismatch on both ranks before any data moves. A point-to-point transfer, like
  /// a collective (`begin`, `end`), looks for an abort notice before it starts and after it
  /// completes: a rank that arrives after its peer gave up (a timeout under throw_error) must
  /// fail, not receive what the peer's abandoned send still points at (MPI may complete a
  /// freed send request later, reading the buffer the caller has since reused) or return from
  /// a send that nobody will take.
  void backend_sendrecv(const collective_descriptor& d, const void* send, std::uint64_t send_bytes, int to, void* recv,
                        std::uint64_t recv_bytes, int from) override {
    const bool p2p = world_size() > 1 && point_to_point(d);
    if (p2p) {
      ringzero::detail::check_peer(*this, d, to, "send to");
      ringzero::detail::check_peer(*this, d, from, "receive from");
      raise_if_unusable(&d);
      poll_notices();
      raise_if_unusable(&d);
      if (check_) exchange_transfer_records(d, send_bytes, to, recv_bytes, from);
    }
    pace(to, send_bytes);
    transfer(d, send, send_bytes, to, recv, recv_bytes, from, nullptr, nullptr, nullptr);
    if (p2p) {
      poll_notices();
      raise_if_unusable(&d);
    }
  }

  void backend_sendrecv_reduce(const collective_descriptor& d, const void* send, std::uint64_t send_bytes, int to,
                               const void* own, void* acc, std::uint64_t bytes, int from,
                               const combine_fn& combine) override {
    pace(to, send_bytes);
    transfer(d, send, send_bytes, to, nullptr, bytes, from, own, acc, &combine);
  }

 public:
  void run_native(const collective_descriptor& d) override;

  /// The paced link's Gb/s (communicator_options::link_gbps, RINGZERO_LINK_GBPS), 0 when sends
  /// are not paced.
  double link_gbps() const noexcept { return pacer_.gbps(); }
  /// Seconds of paced link time this rank's sends were charged so far (0 when not paced).
  double paced_seconds() const noexcept { return pacer_.busy_seconds(); }

  /// Aborts this communicator on every rank: sends an abort notice with `reason` to every peer
  /// (each fails with errc::aborted at its next wait) and makes every later call here fail.
  void abort(const std::string& reason) noexcept override {
    try {
      notify_abort(errc::aborted, "rank " + std::to_string(rank()) + ": " + reason);
    } catch (...) {}
  }

 private:
  using clock = std::chrono::steady_clock;

  /// Holds a send of `bytes` to `to` back as the paced link would (nothing when not paced, for
  /// no peer or oneself).
  void pace(int to, std::uint64_t bytes) {
    if (to >= 0 && to != rank()) pacer_.carry(bytes);
  }

  /// Scratch slots of the backend's own pool.
  enum staging_slot : int { staging_receive = 0, staging_native = 1 };

  /// Plain sends and receives keep at most this many slices posted at once.
  static constexpr std::uint64_t transfer_window = 16;

  communicator(const detail::comm_shape& shape, MPI_Comm comm, const communicator_options& options)
      : backend_communicator(shape.rank, shape.size, true),
        options_(options),
        serialize_(shape.serialize),
        check_(options.check.value_or(check_by_default)),
        policy_(options.on_timeout),
        link_(options.link ? *options.link : default_link(false)),
        data_sent_(static_cast<std::size_t>(shape.size), 0),
        data_received_(static_cast<std::size_t>(shape.size), 0),
        records_sent_(static_cast<std::size_t>(shape.size), 0),
        records_received_(static_cast<std::size_t>(shape.size), 0),
        peers_(static_cast<std::size_t>(shape.size)),
        records_(static_cast<std::size_t>(shape.size)),
        uncaught_at_start_(std::uncaught_exceptions()) {
    if (options.timeout) set_timeout(*options.timeout);
    if (options.slice_bytes % 64 != 0 || options.slice_bytes > (std::uint64_t{1} << 30))
      raise(nullptr, errc::invalid_argument,
            "slice_bytes must be 0 (automatic) or a multiple of 64 up to 1 GiB, got " +
                std::to_string(options.slice_bytes));
    if (options.pipeline_depth < 0 || options.pipeline_depth > 64)
      raise(nullptr, errc::invalid_argument,
            "pipeline_depth must be 0 (automatic) or in [1, 64], got " + std::to_string(options.pipeline_depth));
    if (options.link_gbps && !detail::link_pacer::valid(*options.link_gbps))
      raise(nullptr, errc::invalid_argument,
            "link_gbps must be a number of gigabits per second from 0.001 to 1000000, got " +
                std::to_string(*options.link_gbps));
    // A malformed RINGZERO_* variable is reported in the handshake (join), on every rank: a rank
    // that threw here would leave its peers waiting in theirs until the timeout.
    malformed_environment_ = environment_error();
    std::optional<double> gbps = options.link_gbps;
    try {
      if (!options.check) check_ = env_check(check_by_default);
      if (!gbps) gbps = detail::env_link_gbps();
      if (options.tuning)
        tuning_ = *options.tuning;
      else if (const auto file = ringzero::detail::env_string("RINGZERO_MPI_TUNING"))
        try {
          tuning_ = tuning_table::read(*file);
          if (tuning_.empty())
            throw error(errc::invalid_argument, "the tuning table " + *file +
                                                    " has no rules (only comments or blank lines): name a table that "
                                                    "ringzero-mpi-compare --write-tuning wrote, or unset the variable");
        } catch (const error& e) {
          throw error(e.kind(), "RINGZERO_MPI_TUNING: " + e.message());
        } catch (const std::exception& e) {  // std::bad_alloc: reported in the handshake as the others
          throw error(errc::invalid_argument, "RINGZERO_MPI_TUNING=" + *file + ": " + e.what());
        }
      // A rule for an algorithm this backend never runs would never apply: a mistake, named.
      // (Not `supports()`: native is unavailable only while sends are paced, and one table may
      // serve paced and unpaced runs.)
      for (const tuning_rule& rule : tuning_.rules())
        if (rule.algo != algorithm::ring && rule.algo != algorithm::halving_doubling && rule.algo != algorithm::native)
          throw error(errc::invalid_argument,
                      std::string(options.tuning ? "communicator_options::tuning" : "RINGZERO_MPI_TUNING") +
                          ": the rule '" + tuning_table::rule_text(rule) + "' names " +
                          std::string(algorithm_name(rule.algo)) +
                          ", which the MPI backend does not run (it runs ring, halving_doubling and native)");
    } catch (const error& e) {
      if (malformed_environment_.empty()) malformed_environment_ = e.message();
    }
    if (gbps) pacer_.set_gbps(*gbps);
    if (options.expected_world_size > 0 && options.expected_world_size != shape.size)
      raise(nullptr, errc::invalid_argument,
            "the job has " + std::to_string(shape.size) + " processes in this communicator but " +
                std::to_string(options.expected_world_size) + " were expected (check mpirun -np / srun -n)");
    join(comm);
  }

  // ---- construction (control_channel.hpp) -------------------------------------------------------

  void duplicate_within(const collective_descriptor* op, MPI_Comm from, detail::comm_holder& into,
                        clock::time_point start, clock::time_point deadline, MPI_Comm job);

  void join(MPI_Comm comm);

  // ---- MPI call helpers --------------------------------------------------------------------

  detail::call_lock mpi_lock() const { return detail::call_lock(serialize_); }

  /// The backend's own scratch pool (receive staging, native scratch), made on first use.
  workspace_pool& staging() {
    if (!staging_) staging_ = std::make_unique<workspace_pool>();
    return *staging_;
  }

  /// Throws errc::backend_failure naming `what` when `rc` is not MPI_SUCCESS.
  void check(const collective_descriptor* op, int rc, const char* what) const {
    if (rc != MPI_SUCCESS) raise(op, errc::backend_failure, std::string(what) + " failed: " + detail::error_string(rc));
  }

  bool record_arrived(const collective_descriptor* op, int p, MPI_Request& request, const char* test_what,
                      const char* irecv_what);

  bool send_completed(const collective_descriptor* op, MPI_Request& request, const char* what);

  clock::time_point deadline() const { return clock::now() + std::chrono::duration_cast<clock::duration>(timeout()); }

  /// How an idle wait spends one round (see `backoff`).
  enum class idle_phase { spin, yield, sleep };

  /// The phase of a wait idle for `idle`: spin (the first 50 us), then yield (up to 100 ms),
  /// then sleep, so that a rank waiting long (a progress thread behind a peer's compute) leaves
  /// its processor to others. MPI moves data only inside MPI calls, so a sleeping rank also
  /// stalls the transfers its peers wait for: sleeping starts late.
  ///
  /// Oversubscribed ranks spin too when the MPI library yields by itself inside a poll that
  /// finds nothing to do (`mpi_yields_`: Open MPI's mpi_yield_when_idle, which its launcher
  /// turns on for `--oversubscribe`). Every round of the spin is an MPI_Test, and a message
  /// above the eager limit needs several of them (fragments, handshakes) that our step cannot
  /// see as progress; yielding after each would hand the processor away mid-message. Measured
  /// with 4 processes on 2 cores, 64-256 KiB all_reduce, three runs each: native/best
  /// 1.03-1.50 against 1.00-1.24 when yielding after every idle poll (docs/performance.md).
  /// When MPI does not yield (a hostfile claiming more slots than cores; MPICH), a spinning
  /// rank would keep the processor from the peer it waits for (3-10x slower with 6 processes
  /// on 2 cores), so oversubscribed ranks then yield after every idle poll.
  idle_phase phase_after(clock::duration idle) const noexcept {
    using namespace std::chrono;
    if ((!oversubscribed_ || mpi_yields_) && idle < microseconds(50)) return idle_phase::spin;
    if (idle < milliseconds(100)) return idle_phase::yield;
    return idle_phase::sleep;
  }

  /// One idle round in `phase` (a sleep lasts 200 us).
  static void backoff(idle_phase phase) {
    switch (phase) {
      case idle_phase::spin: ringzero::detail::cpu_relax(); break;
      case idle_phase::yield: std::this_thread::yield(); break;
      case idle_phase::sleep: std::this_thread::sleep_for(std::chrono::microseconds(200)); break;
    }
  }

  // ---- failure handling --------------------------------------------------------------------

  /// Writes `e` to stderr and aborts the job (failure_policy::abort_job).
  [[noreturn]] static void abort_job(const error& e, MPI_Comm comm) {
    std::fprintf(stderr, "%s (aborting the MPI job: failure_policy::abort_job)\n", e.what());
    std::fflush(stderr);
    MPI_Abort(comm, timeout_exit_code);
    std::_Exit(timeout_exit_code);
  }

  void notify_abort(errc code, const std::string& text);

  /// Aborts the communicator with `code` (telling every peer) and throws it.
  [[noreturn]] void fail(const collective_descriptor* op, errc code, const std::string& message) {
    error e(code, context(op), message);
    notify_abort(code, e.what());
    throw e;
  }

  /// A wait timed out: abort the job or throw, per the failure policy.
  [[noreturn]] void timed_out(const collective_descriptor* op, const std::string& message) {
    error e(errc::timeout, context(op), message);
    if (policy_ == failure_policy::abort_job) abort_job(e, data_.get());
    notify_abort(errc::timeout, e.what());
    throw e;
  }

  /// Throws when the communicator was aborted. (A peer that left is not an error by itself: it
  /// may have sent all it had to send, e.g. a non-root rank of a reduce whose sends completed
  /// eagerly. The waits decide from the departure's message counts.)
  void raise_if_unusable(const collective_descriptor* op) const {
    if (aborted_) raise(op, abort_code_, "the communicator was aborted: " + abort_reason_);
  }

  std::string departed_text(int p) const {
    return "rank " + std::to_string(p) + " left the communicator (destroyed it" +
           (peers_[static_cast<std::size_t>(p)].unwinding ? " while unwinding an exception)" : ")");
  }

  void poll_notices();

  bool abandon(std::vector<MPI_Request>& requests) noexcept;

  /// Gives up the staging memory (deliberately leaked: an abandoned receive may still write it).
  void poison_staging() noexcept { (void)staging_.release(); }

  /// After `abandon` freed a notice send that was still active, MPI may read its body later
  /// (a transport that sends from the user's buffer, to a peer that takes it late): the bodies
  /// of `bodies` and of every abort notice (`notices_`) are then never freed (a few KiB, once
  /// per failed communicator), so that the peer cannot receive freed memory as counts or text.
  void keep_notice_bodies(std::vector<std::unique_ptr<detail::notice>>& bodies) noexcept {
    for (auto& b : bodies) (void)b.release();
    for (auto& b : notices_) (void)b.release();
  }

  /// Abandons `requests` unless dismissed (an exception left the wait); with `staging`, a
  /// receive that could not be finished poisons the staging memory.
  class request_guard {
   public:
    request_guard(communicator& c, std::vector<MPI_Request>& r, bool staging = false) noexcept
        : c_(c), r_(r), staging_(staging) {}
    request_guard(const request_guard&) = delete;
    request_guard& operator=(const request_guard&) = delete;
    ~request_guard() {
      if (!dismissed_ && !c_.abandon(r_) && staging_) c_.poison_staging();
    }
    void dismiss() noexcept { dismissed_ = true; }

   private:
    communicator& c_;
    std::vector<MPI_Request>& r_;
    bool staging_;
    bool dismissed_ = false;
  };

  /// Outcome of one polling step.
  enum class step_result { done, progressed, idle };

  template <class Step, class Stalled, class OnTimeout>
  void poll(const collective_descriptor* op, Step&& step, Stalled&& stalled, clock::time_point until,
            OnTimeout&& on_timeout);

  // ---- transfers (transport.hpp) ----------------------------------------------------------------

  /// Tag class of operation `d`: the collective's sequence mod 63, or 63 for send/recv.
  static int tag_class_of(const collective_descriptor& d) noexcept {
    if (d.kind == collective_kind::send || d.kind == collective_kind::recv) return detail::point_to_point_class;
    return static_cast<int>(d.sequence % detail::point_to_point_class);
  }

  /// One sliced, pipelined transfer in flight (transport.hpp).
  class transfer_op;

  void transfer(const collective_descriptor& d, const void* send, std::uint64_t send_bytes, int to, void* recv,
                std::uint64_t recv_bytes, int from, const void* own, void* acc, const combine_fn* combine);

  [[noreturn]] void receive_failed(const collective_descriptor& d, int rc, const MPI_Status& status, int from, int cls,
                                   std::uint64_t expected, std::uint64_t slice_index, std::uint64_t slices);

  [[noreturn]] void class_mismatch(const collective_descriptor& d, int from, int got, int want);

  static bool slice_matches(const MPI_Status& status, int cls, std::uint64_t j, std::uint64_t slices,
                            std::uint64_t len);

  void verify_slice(const collective_descriptor& d, const MPI_Status& status, int from, int cls,
                    std::uint64_t expected_total, std::uint64_t j, std::uint64_t slices, std::uint64_t len);

  // ---- check mode (control_channel.hpp) ---------------------------------------------------------

  void exchange_descriptors(const collective_descriptor& d);

  /// True when `d` is a point-to-point send/recv (not a collective's step).
  static bool point_to_point(const collective_descriptor& d) noexcept {
    return d.kind == collective_kind::send || d.kind == collective_kind::recv;
  }

  void exchange_transfer_records(const collective_descriptor& d, std::uint64_t send_bytes, int to,
                                 std::uint64_t recv_bytes, int from);

  // ---- synchronisation and departure (control_channel.hpp) --------------------------------------

  void synchronize(const collective_descriptor* op, const char* what);

  bool depart();

  // ---- native collectives (native_collectives.hpp) ----------------------------------------------

  std::string describe_native_timeout(const void* context) const;
  void end_job_if_late() noexcept;

  /// Arms the watchdog (backend/protocol/watchdog.hpp; started on first use, looking every
  /// 100 ms) for one blocking MPI call and disarms it when the scope ends.
  class watchdog_scope {
   public:
    watchdog_scope(communicator& c, const collective_descriptor& d) : c_(c) {
      c_.watchdog_.start(std::chrono::milliseconds(100), [&c = c_] { c.end_job_if_late(); });
      c_.watchdog_.arm(c_.deadline(), &d);
    }
    ~watchdog_scope() { c_.watchdog_.disarm(); }
    watchdog_scope(const watchdog_scope&) = delete;
    watchdog_scope& operator=(const watchdog_scope&) = delete;

   private:
    communicator& c_;
  };

  /// Checks a native MPI call's return code (the collective layer then aborts the
  /// communicator, outside the MPI lock).
  void native_check(const collective_descriptor* op, int rc, const char* what) const {
    if (rc != MPI_SUCCESS) raise(op, errc::backend_failure, std::string(what) + " failed: " + detail::error_string(rc));
  }

  template <class Call>
  void chunked(const void* send, void* recv, std::uint64_t count, std::size_t element_size, Call&& call);

  /// One block of `bytes` bytes as (count, datatype) for a byte-moving collective.
  struct block {
    int count = 0;
    MPI_Datatype type = MPI_BYTE;
    detail::owned_datatype owned;
  };
  void describe_block(const collective_descriptor& d, std::uint64_t bytes, block& b);

  communicator_options options_;
  bool serialize_ = false;
  bool check_ = false;
  failure_policy policy_ = failure_policy::abort_job;
  link_model link_;
  tuning_table tuning_;  ///< measured choices (empty: the cost model decides alone)
  detail::link_pacer pacer_;
  std::string malformed_environment_;  ///< why a RINGZERO_* variable was refused here (raised in join)
  bool oversubscribed_ = false;
  bool mpi_yields_ = false;  ///< the MPI library yields inside idle polls (detail::mpi_yields_when_idle)
  bool single_node_ = false;
  std::uint64_t slice_bytes_ = 0;
  int pipeline_depth_ = 1;
  detail::comm_holder data_;
  detail::comm_holder control_;
  std::vector<std::uint64_t> data_sent_;
  std::vector<std::uint64_t> data_received_;
  std::vector<std::uint64_t> records_sent_;
  std::vector<std::uint64_t> records_received_;
  std::vector<detail::peer_state> peers_;
  bool aborted_ = false;
  errc abort_code_ = errc::aborted;
  std::string abort_reason_;
  std::vector<MPI_Request> notice_requests_;
  std::vector<std::unique_ptr<detail::notice>> notices_;
  std::vector<unsigned char> notice_buffer_;
  unsigned char sync_buffer_[64] = {};
  std::vector<MPI_Request> recv_requests_;
  std::vector<MPI_Request> send_requests_;
  ringzero::detail::wire_record transfer_records_[2];   ///< check mode: this rank's records of a send/recv
  std::vector<ringzero::detail::wire_record> records_;  ///< check mode: every rank's record (own one at rank())
  std::vector<collective_descriptor> decoded_;
  std::vector<char> arrived_;
  std::unique_ptr<workspace_pool> staging_;
  int uncaught_at_start_ = 0;
  std::uint64_t instance_ = 0;
  ringzero::detail::watchdog watchdog_;
};

}  // namespace ringzero::mpi

#include "ringzero/backend/mpi/control_channel.hpp"
#include "ringzero/backend/mpi/native_collectives.hpp"
#include "ringzero/backend/mpi/transport.hpp"
