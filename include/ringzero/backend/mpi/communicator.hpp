#pragma once
/// @file
/// `mpi::communicator`: one rank per MPI process, over a duplicate of an MPI communicator
/// (MPI_COMM_WORLD or one of the program's). This is how CPU jobs leave one machine.
///
/// Transfers. `sendrecv` and `sendrecv_reduce` use nonblocking point-to-point calls
/// (MPI_Isend / MPI_Irecv) polled with MPI_Test. A transfer larger than `slice_bytes` travels
/// as slices; a combining receive keeps `pipeline_depth` slices posted into scratch memory
/// (allocated once, reused) and combines slice s while slices s+1, s+2, ... are in flight, so
/// large messages overlap transfer and reduction. Every ringzero algorithm that needs only
/// point-to-point transfers runs over it (ring, halving_doubling); MPI's own collectives
/// (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast, MPI_Reduce,
/// MPI_Alltoall, MPI_Barrier) are the algorithm `native` (see backend/mpi/datatype.hpp for
/// the mapping of dtypes and ops, and their documented differences).
///
/// Contract checking. With checking on (`communicator_options::check`, RINGZERO_CHECK=1,
/// default on in debug builds) `begin` sends this rank's descriptor of each collective
/// (collective, sequence number, count, dtype, op, root, algorithm, validity and its reason) to
/// every peer and receives theirs, then every rank runs the same `check_contract` and raises
/// the same error (errc::invalid_argument, errc::contract_mismatch) before any data moves; the
/// communicator stays usable after such an error. Cost: 2(n-1) small messages per collective
/// (docs/mpi.md has the measurements). A point-to-point send/recv exchanges a record with each
/// of its peers the same way (`exchange_transfer_records`): a size mismatch raises
/// errc::size_mismatch on both ranks, naming both amounts, before any data moves.
/// With checking off nothing is exchanged, and still nothing hangs:
/// - a rank whose own arguments are invalid raises errc::invalid_argument and aborts the
///   communicator: a notice on a separate control communicator makes every peer fail with the
///   same code and that rank's reason, at the latest when it next waits;
/// - every data message carries in its tag the collective's sequence number (mod 63) and how
///   many slices follow, so ranks that run different collectives fail with
///   errc::contract_mismatch and transfers of different sizes with errc::size_mismatch (the
///   detecting rank aborts the communicator so that the others fail too). The detecting rank
///   is the receiver: a point-to-point sender whose send MPI already completed returns, and
///   raises the receiver's error at a later call (its next one that waits for a peer, or one that
///   starts or ends after the receiver's abort notice arrived);
/// - mismatches that leave all ranks waiting for each other (e.g. different algorithms) end
///   in a timeout.
/// After an abort every call on the communicator fails with the first error's code.
///
/// Timeouts and departures. Every wait polls against a deadline of `timeout()` from its start.
/// On expiry the error names the collective and the ranks that did not arrive (check mode:
/// whose descriptors never came) or whose transfers did not complete; then, per
/// `failure_policy`, the job is aborted (default: the message goes to stderr, then MPI_Abort,
/// exit code 124) or the error is thrown. Native collectives are blocking MPI calls; a
/// watchdog thread aborts the job when one passes its deadline. Destroying a communicator
/// tells the peers (a departure notice with the counts of messages exchanged): a peer waiting
/// for a message the departed rank never sent fails at once with errc::peer_exited instead of
/// waiting for the timeout. Destruction is collective, like MPI_Comm_free: the destructor
/// waits (up to the timeout) for every peer's departure notice; after an abort only up to
/// `failed_departure_wait` (250 ms), so that a failed communicator is destroyed promptly even
/// when a peer is busy elsewhere (see the destructor). Every collective ends by looking for an
/// abort notice, so a rank that arrives after its peers gave up fails instead of returning a
/// result made of the data they had sent before failing.
///
/// Threads. A communicator is used by one thread at a time (its owner or its progress thread,
/// like every ringzero communicator); MPI must be initialised with MPI_THREAD_SERIALIZED or
/// MPI_THREAD_MULTIPLE (see mpi::environment).

#include "ringzero/backend/mpi/datatype.hpp"
#include "ringzero/backend/mpi/environment.hpp"
#include "ringzero/backend/mpi/options.hpp"
#include "ringzero/backend/mpi/watchdog.hpp"
#include "ringzero/backend/mpi/wire.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/backend/contract.hpp"
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

/// A communicator handle freed (MPI_Comm_free) on destruction unless released.
class comm_holder {
 public:
  comm_holder() = default;
  explicit comm_holder(MPI_Comm c) noexcept : c_(c) {}
  comm_holder(const comm_holder&) = delete;
  comm_holder& operator=(const comm_holder&) = delete;
  ~comm_holder() { reset(); }
  MPI_Comm get() const noexcept { return c_; }
  MPI_Comm* out() noexcept { return &c_; }
  MPI_Comm release() noexcept {
    MPI_Comm c = c_;
    c_ = MPI_COMM_NULL;
    return c;
  }
  void reset() noexcept {
    if (c_ != MPI_COMM_NULL && is_active()) MPI_Comm_free(&c_);
    c_ = MPI_COMM_NULL;
  }

 private:
  MPI_Comm c_ = MPI_COMM_NULL;
};

/// The MPI communicators of destroyed `mpi::communicator`s whose destructor stopped waiting
/// before every peer had departed (after `failed_departure_wait` when aborted, else the timeout). Freeing them at once would let MPI give their
/// context to a later communicator while the late peer's departure notice is still on its way:
/// Open MPI files a message for a context that does not exist yet under that context and
/// delivers it to the next communicator that gets it, out of its message order (a later
/// message of that communicator would then be lost: a hang). So they linger here, and
/// `collect` frees each pair once every late peer's departure notice has arrived on it.
/// Process-wide; `collect` runs when an `mpi::communicator` is made or destroyed. Pairs whose
/// peers never depart (a process that died) stay until MPI_Finalize, which frees them.
class lingering {
 public:
  /// Adds the pair of a destroyed communicator of instance `instance`; `departed[p]` tells
  /// whether rank p's departure notice already arrived.
  static void add(MPI_Comm data, MPI_Comm control, std::uint64_t instance, std::vector<char> departed) {
    std::lock_guard<std::mutex> guard(mutex());
    items().push_back(item{data, control, instance, std::move(departed)});
  }

  /// Receives the departure notices that arrived on lingering pairs and frees every pair whose
  /// peers have all departed. Never throws; `serialize` as the caller's communicator.
  static void collect(bool serialize) noexcept {
    if (!is_active()) return;
    std::lock_guard<std::mutex> guard(mutex());
    auto& list = items();
    for (std::size_t i = 0; i < list.size();) {
      item& it = list[i];
      bool done = false;
      {
        call_lock lock(serialize);
        receive_departures(it);
        done = std::all_of(it.departed.begin(), it.departed.end(), [](char d) { return d != 0; });
        if (done) {
          MPI_Comm_free(&it.control);
          MPI_Comm_free(&it.data);
        }
      }
      if (done) {
        list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }

  /// Pairs still lingering (tests).
  static std::size_t size() {
    std::lock_guard<std::mutex> guard(mutex());
    return items().size();
  }

 private:
  struct item {
    MPI_Comm data;
    MPI_Comm control;
    std::uint64_t instance;
    std::vector<char> departed;
  };

  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<item>& items() {
    static std::vector<item> v;
    return v;
  }

  static void receive_departures(item& it) noexcept {
    std::vector<unsigned char> buffer;
    for (;;) {
      int flag = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status status;
      if (MPI_Improbe(MPI_ANY_SOURCE, tag_notice, it.control, &flag, &message, &status) != MPI_SUCCESS || !flag) return;
      int bytes = 0;
      MPI_Get_count(&status, MPI_BYTE, &bytes);
      buffer.assign(std::max<std::size_t>(sizeof(notice), static_cast<std::size_t>(std::max(bytes, 0))), 0);
      if (MPI_Mrecv(buffer.data(), bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
      notice n;
      std::memcpy(&n, buffer.data(), std::min(sizeof n, static_cast<std::size_t>(std::max(bytes, 0))));
      const int from = status.MPI_SOURCE;
      if (from >= 0 && static_cast<std::size_t>(from) < it.departed.size() && n.instance == it.instance &&
          n.kind == notice_kind::depart)
        it.departed[static_cast<std::size_t>(from)] = 1;
    }
  }
};

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
      throw error(errc::invalid_argument,
                  "mpi::communicator: MPI is not initialised (or already finalised); create a ringzero::mpi::environment "
                  "or call MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) first");
    const int level = thread_level();
    if (level < MPI_THREAD_SERIALIZED)
      throw error(errc::unsupported, std::string("mpi::communicator: MPI was initialised with ") + thread_level_name(level) +
                                         "; ringzero runs asynchronous collectives on a progress thread and needs "
                                         "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (use ringzero::mpi::environment, or "
                                         "MPI_Init_thread with MPI_THREAD_MULTIPLE)");
    serialize = level < MPI_THREAD_MULTIPLE;
    if (comm == MPI_COMM_NULL) throw error(errc::invalid_argument, "mpi::communicator: the MPI communicator is MPI_COMM_NULL");
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
class communicator final : public ringzero::communicator {
 public:
  /// Makes a communicator over a duplicate of `comm` (collective over `comm`: every rank of it
  /// must construct one). Throws errc::invalid_argument when MPI is not initialised, `comm` is
  /// null or an intercommunicator, the options are invalid, the ranks disagree on the check
  /// mode, slice size, pipeline depth or RINGZERO_ALGO, or the size differs from
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
    } catch (...) {
      all_departed = false;
    }
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

  /// ring, halving_doubling and native (every collective); not direct (no shared memory).
  bool supports(algorithm a, collective_kind k) const noexcept override {
    if (k == collective_kind::send || k == collective_kind::recv) return false;
    return a == algorithm::ring || a == algorithm::halving_doubling || a == algorithm::native;
  }

  /// Cost parameters over MPI point-to-point: `communicator_options::link` when given, else
  /// `default_link(any node oversubscribed)`.
  link_model link() const noexcept override { return link_; }

  /// The default cost parameters, measured with `ringzero-mpi-compare --link` on the
  /// development machine (Open MPI 4.1, shared memory between processes, a 2-core VM shared
  /// with other jobs; docs/mpi.md has the ranges): alpha is the time of one exchange step of
  /// small messages between ring neighbours, beta the inverse bandwidth of exchange steps of
  /// 64 KiB to 1 MiB, gamma the inverse rate of the float32 combine, both in cache, where the
  /// model's choices fall. When any node runs more processes than it has processors
  /// (`oversubscribed`), every step also waits for the peer to be scheduled: alpha is then the
  /// measured 4 us (4 processes on 2 cores, 2.9-4.3 us in two runs) and the byte rates lower
  /// (beta 3.3-4.2e-4 us/B). `direct` does not exist over MPI; its terms are unused.
  static constexpr link_model default_link(bool oversubscribed) noexcept {
    link_model m;
    m.alpha_us = oversubscribed ? 4.0 : 2.0;
    m.beta_us_per_byte = oversubscribed ? 4e-4 : 1.5e-4;
    m.gamma_us_per_byte = 1e-4;
    m.sync_us = m.alpha_us;
    m.memory_us_per_byte = m.beta_us_per_byte;
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
    synchronize("split");
    detail::comm_holder sub;
    {
      auto lock = mpi_lock();
      check(MPI_Comm_split(data_.get(), color < 0 ? MPI_UNDEFINED : color, key, sub.out()), "MPI_Comm_split");
    }
    if (sub.get() == MPI_COMM_NULL) return nullptr;
    communicator_options o = options_;
    o.check = check_;
    o.timeout = timeout();
    o.on_timeout = policy_;
    o.expected_world_size = 0;
    o.link = link_;
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
    return ringzero::communicator::scratch_bytes() + (staging_ ? staging_->capacity_bytes() : 0);
  }

  // ---- the collective layer's interface --------------------------------------------------

  void begin(const collective_descriptor& d) override {
    if (world_size() == 1) {
      if (!d.invalid.empty()) raise(d.invalid_code, "invalid arguments (rank 0: " + d.invalid + "); no rank ran it");
      return;
    }
    raise_if_unusable();
    poll_notices();  // an abort or departure that already arrived fails here, before anything is sent
    raise_if_unusable();
    if (check_) {
      exchange_descriptors(d);
      return;
    }
    if (!d.invalid.empty()) {
      fail(d.invalid_code, "invalid arguments (rank " + std::to_string(rank()) + ": " + d.invalid +
                                       "); the communicator is aborted so that no peer waits for this rank");
    }
  }

  /// Receives the control notices that arrived during the collective and raises when the
  /// communicator was aborted meanwhile: a rank that arrives late, after its peers gave up, can
  /// complete an exchange with data they sent before they failed (eager messages already
  /// delivered) while the abort notice, sent later on the control communicator, was not yet
  /// received when the collective began; its result would then be wrong without an error.
  void end(const collective_descriptor&) override {
    if (world_size() == 1) return;
    poll_notices();
    raise_if_unusable();
  }

  /// A collective's step, or a point-to-point send/recv/sendrecv (the current operation's kind
  /// is send or recv). In check mode a point-to-point transfer first exchanges records with
  /// its peers (`exchange_transfer_records`), so that a size mismatch raises
  /// errc::size_mismatch on both ranks before any data moves. A point-to-point transfer, like
  /// a collective (`begin`, `end`), looks for an abort notice before it starts and after it
  /// completes: a rank that arrives after its peer gave up (a timeout under throw_error) must
  /// fail, not receive what the peer's abandoned send still points at (MPI may complete a
  /// freed send request later, reading the buffer the caller has since reused) or return from
  /// a send that nobody will take.
  void sendrecv(const void* send, std::uint64_t send_bytes, int to, void* recv, std::uint64_t recv_bytes,
                int from) override {
    const bool p2p = world_size() > 1 && point_to_point();
    if (p2p) {
      check_peer(to, "send to");
      check_peer(from, "receive from");
      raise_if_unusable();
      poll_notices();
      raise_if_unusable();
      if (check_) exchange_transfer_records(send_bytes, to, recv_bytes, from);
    }
    transfer(send, send_bytes, to, recv, recv_bytes, from, nullptr, nullptr, nullptr);
    if (p2p) {
      poll_notices();
      raise_if_unusable();
    }
  }

  void sendrecv_reduce(const void* send, std::uint64_t send_bytes, int to, const void* own, void* acc,
                       std::uint64_t bytes, int from, const combine_fn& combine) override {
    transfer(send, send_bytes, to, nullptr, bytes, from, own, acc, &combine);
  }

  void run_native(const collective_descriptor& d) override;

  /// Aborts this communicator on every rank: sends an abort notice with `reason` to every peer
  /// (each fails with errc::aborted at its next wait) and makes every later call here fail.
  void abort(const std::string& reason) noexcept override {
    try {
      notify_abort(errc::aborted, "rank " + std::to_string(rank()) + ": " + reason);
    } catch (...) {
    }
  }

 private:
  using clock = std::chrono::steady_clock;

  /// Scratch slots of the backend's own pool.
  enum staging_slot : int { staging_receive = 0, staging_native = 1 };

  /// Plain sends and receives keep at most this many slices posted at once.
  static constexpr std::uint64_t transfer_window = 16;

  communicator(const detail::comm_shape& shape, MPI_Comm comm, const communicator_options& options)
      : ringzero::communicator(shape.rank, shape.size),
        options_(options),
        serialize_(shape.serialize),
        check_(options.check ? *options.check : env_check(check_by_default)),
        policy_(options.on_timeout),
        link_(options.link ? *options.link : default_link(false)),
        data_sent_(static_cast<std::size_t>(shape.size), 0),
        data_received_(static_cast<std::size_t>(shape.size), 0),
        records_sent_(static_cast<std::size_t>(shape.size), 0),
        records_received_(static_cast<std::size_t>(shape.size), 0),
        peers_(static_cast<std::size_t>(shape.size)),
        records_(static_cast<std::size_t>(shape.size)),
        uncaught_at_start_(std::uncaught_exceptions()),
        watchdog_([this](const void* context) { return describe_native_timeout(context); }, MPI_COMM_NULL,
                  timeout_exit_code) {
    if (options.timeout) set_timeout(*options.timeout);
    if (options.slice_bytes % 64 != 0 || options.slice_bytes > (std::uint64_t{1} << 30))
      raise(errc::invalid_argument, "slice_bytes must be 0 (automatic) or a multiple of 64 up to 1 GiB, got " +
                                        std::to_string(options.slice_bytes));
    if (options.pipeline_depth < 0 || options.pipeline_depth > 64)
      raise(errc::invalid_argument, "pipeline_depth must be 0 (automatic) or in [1, 64], got " +
                                        std::to_string(options.pipeline_depth));
    if (options.expected_world_size > 0 && options.expected_world_size != shape.size)
      raise(errc::invalid_argument, "the job has " + std::to_string(shape.size) + " processes in this communicator but " +
                                        std::to_string(options.expected_world_size) +
                                        " were expected (check mpirun -np / srun -n)");
    join(comm);
    watchdog_.set_comm(data_.get());
  }

  // ---- construction ------------------------------------------------------------------------

  /// MPI_Comm_idup of `from` into `into`, polled until `deadline` (construction's timeout,
  /// counted from `start`). The duplicate lands in storage of its own: when the wait gives up,
  /// the request stays pending (MPI forbids cancelling or freeing a nonblocking collective's
  /// request) and MPI completes it if the late ranks arrive, writing the new handle there; that
  /// storage is then deliberately leaked (on every failure path) instead of being a member of
  /// this object, which is gone by then. On expiry: abort the job or throw errc::timeout, per
  /// the failure policy (`job` is what MPI_Abort ends).
  void duplicate_within(MPI_Comm from, detail::comm_holder& into, clock::time_point start, clock::time_point deadline,
                        MPI_Comm job) {
    auto* target = new MPI_Comm(MPI_COMM_NULL);
    MPI_Request req = MPI_REQUEST_NULL;
    {
      auto lock = mpi_lock();
      check(MPI_Comm_idup(from, target, &req), "MPI_Comm_idup");
    }
    for (unsigned i = 0;; ++i) {
      int flag = 0;
      {
        auto lock = mpi_lock();
        check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test (MPI_Comm_idup)");
      }
      if (flag) break;
      if ((i & 31u) == 0 && clock::now() >= deadline) {
        const std::string msg = "timed out after " + seconds_text() +
                                " s making the communicator: not every rank of the MPI communicator constructed an "
                                "mpi::communicator (construction is collective)";
        if (policy_ == failure_policy::abort_job) abort_job(error(errc::timeout, context(), msg), job);
        raise(errc::timeout, msg);
      }
      backoff(phase_after(clock::now() - start));
    }
    *into.out() = *target;
    delete target;
  }

  /// Duplicates `comm` (nonblocking, polled against the timeout), makes the control
  /// communicator (the same way), agrees on the settings and measures oversubscription.
  void join(MPI_Comm comm) {
    detail::lingering::collect(serialize_);
    const auto start = clock::now();
    const auto deadline = start + std::chrono::duration_cast<clock::duration>(timeout());
    duplicate_within(comm, data_, start, deadline, comm);
    // A rank that arrives after its peers gave up completes their pending duplicate above but
    // finds nobody for this one: it times out here instead of blocking in MPI_Comm_dup.
    try {
      duplicate_within(data_.get(), control_, start, deadline, comm);
    } catch (...) {
      // The abandoned duplicate still refers to the data communicator: freeing it under the
      // pending request corrupted Open MPI's state at MPI_Finalize. It is left to MPI.
      (void)data_.release();
      throw;
    }
    auto lock = mpi_lock();
    check(MPI_Comm_set_errhandler(data_.get(), MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_set_errhandler(control_.get(), MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");

    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(data_.get(), MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    int local = 1;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    const unsigned cpus = std::thread::hardware_concurrency();
    oversubscribed_ = cpus != 0 && static_cast<unsigned>(local) > cpus;
    mpi_yields_ = detail::mpi_yields_when_idle();
    single_node_ = local == world_size();  // the same answer on every rank
    slice_bytes_ = options_.slice_bytes != 0 ? options_.slice_bytes : (single_node_ ? node_slice_bytes : network_slice_bytes);
    pipeline_depth_ = options_.pipeline_depth != 0 ? options_.pipeline_depth
                                                   : (single_node_ ? node_pipeline_depth : network_pipeline_depth);

    detail::hello_record mine;
    {
      std::random_device entropy;
      mine.instance = (std::uint64_t{entropy()} << 32) ^ entropy() ^
                      static_cast<std::uint64_t>(clock::now().time_since_epoch().count());
    }
    mine.version = RINGZERO_VERSION;
    mine.check = check_ ? 1 : 0;
    mine.slice_bytes = slice_bytes_;
    mine.pipeline_depth = pipeline_depth_;
    mine.forced_algorithm = static_cast<std::int32_t>(forced_algorithm());
    mine.oversubscribed = oversubscribed_ ? 1 : 0;
    mine.wire_format = detail::wire_format_version;
    if (options_.link) {  // as given; zeros for the default, resolved below
      mine.link[0] = options_.link->alpha_us;
      mine.link[1] = options_.link->beta_us_per_byte;
      mine.link[2] = options_.link->gamma_us_per_byte;
    }
    std::vector<detail::hello_record> all(static_cast<std::size_t>(world_size()));
    check(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, control_.get()), "MPI_Allgather");
    auto agree = [&](const char* what, auto field, auto text) {
      std::vector<std::string> values;
      for (const auto& h : all) values.push_back(text(h.*field));
      for (const auto& v : values)
        if (v != values.front())
          raise(errc::invalid_argument, std::string(what) + " differs between ranks: " + ringzero::detail::describe_values(values));
    };
    auto number = [](auto v) { return std::to_string(v); };
    instance_ = all.front().instance;
    // Waits pace themselves by this node's load; the link model must be the same everywhere, so
    // the default one is oversubscribed's when any node is.
    bool any_oversubscribed = false;
    for (const auto& h : all) any_oversubscribed = any_oversubscribed || h.oversubscribed != 0;
    if (!options_.link) link_ = default_link(any_oversubscribed);
    agree("the ringzero version", &detail::hello_record::version, number);
    agree("the MPI record layout (ranks from different builds)", &detail::hello_record::wire_format, number);
    agree("the check mode (RINGZERO_CHECK / communicator_options::check)", &detail::hello_record::check, number);
    agree("slice_bytes", &detail::hello_record::slice_bytes, number);
    agree("pipeline_depth", &detail::hello_record::pipeline_depth, number);
    agree("the link model (communicator_options::link)", &detail::hello_record::link,
          [](const double (&m)[3]) {
            if (m[0] == 0 && m[1] == 0 && m[2] == 0) return std::string("the default");
            return "alpha " + std::to_string(m[0]) + " us, beta " + std::to_string(m[1]) + " us/B, gamma " +
                   std::to_string(m[2]) + " us/B";
          });
    agree("RINGZERO_ALGO", &detail::hello_record::forced_algorithm,
          [](std::int32_t a) { return std::string(algorithm_name(static_cast<algorithm>(a))); });

  }

  // ---- MPI call helpers --------------------------------------------------------------------

  detail::call_lock mpi_lock() const { return detail::call_lock(serialize_); }

  /// The backend's own scratch pool (receive staging, native scratch), made on first use.
  workspace_pool& staging() {
    if (!staging_) staging_ = std::make_unique<workspace_pool>();
    return *staging_;
  }

  /// Throws errc::backend_failure naming `what` when `rc` is not MPI_SUCCESS.
  void check(int rc, const char* what) const {
    if (rc != MPI_SUCCESS) raise(errc::backend_failure, std::string(what) + " failed: " + detail::error_string(rc));
  }

  /// Tests the receive of rank `p`'s record (into `records_[p]`) on `request`: true once this
  /// communicator's record has arrived (counted in `records_received_`). A record of an older
  /// communicator on a reused MPI context is dropped and listened for again. `test_what` and
  /// `irecv_what` name the MPI calls in errors. Called under the MPI lock.
  bool record_arrived(int p, MPI_Request& request, const char* test_what, const char* irecv_what) {
    if (request == MPI_REQUEST_NULL) return false;
    int flag = 0;
    check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), test_what);
    if (!flag) return false;
    detail::wire_descriptor& record = records_[static_cast<std::size_t>(p)];
    if (record.instance != instance_) {
      check(MPI_Irecv(&record, static_cast<int>(sizeof(detail::wire_descriptor)), MPI_BYTE, p, detail::tag_descriptor,
                      control_.get(), &request),
            irecv_what);
      return false;
    }
    ++records_received_[static_cast<std::size_t>(p)];
    return true;
  }

  /// Tests the send `request`: true when it completed in this call. Called under the MPI lock.
  bool send_completed(MPI_Request& request, const char* what) {
    if (request == MPI_REQUEST_NULL) return false;
    int flag = 0;
    check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), what);
    return flag != 0;
  }

  std::string seconds_text() const {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", timeout().count());
    return buf;
  }

  std::string operation_name() const {
    const collective_descriptor* d = current();
    if (!d) return "a transfer";
    std::string s(collective_name(d->kind));
    if (d->kind != collective_kind::send && d->kind != collective_kind::recv) s += " #" + std::to_string(d->sequence);
    return s;
  }

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

  /// Marks this communicator aborted with `code` and `text` (the first abort wins) and tells
  /// every peer. Never throws MPI errors (best effort: the job is failing).
  void notify_abort(errc code, const std::string& text) {
    if (aborted_) return;
    aborted_ = true;
    abort_code_ = code;
    abort_reason_ = text;
    if (!is_active()) return;
    auto lock = mpi_lock();
    for (int p = 0; p < world_size(); ++p) {
      if (p == rank() || peers_[static_cast<std::size_t>(p)].departed) continue;
      auto n = std::make_unique<detail::notice>();
      n->instance = instance_;
      n->kind = detail::notice_kind::abort;
      n->code = static_cast<std::int32_t>(code);
      n->set_text(text);
      MPI_Request req = MPI_REQUEST_NULL;
      if (MPI_Isend(n.get(), static_cast<int>(n->wire_bytes()), MPI_BYTE, p, detail::tag_notice, control_.get(), &req) ==
          MPI_SUCCESS) {
        notice_requests_.push_back(req);
        notices_.push_back(std::move(n));
      }
    }
  }

  /// Aborts the communicator with `code` (telling every peer) and throws it.
  [[noreturn]] void fail(errc code, const std::string& message) {
    error e(code, context(), message);
    notify_abort(code, e.what());
    throw e;
  }

  /// A wait timed out: abort the job or throw, per the failure policy.
  [[noreturn]] void timed_out(const std::string& message) {
    error e(errc::timeout, context(), message);
    if (policy_ == failure_policy::abort_job) abort_job(e, data_.get());
    notify_abort(errc::timeout, e.what());
    throw e;
  }

  /// Throws when the communicator was aborted. (A peer that left is not an error by itself: it
  /// may have sent all it had to send, e.g. a non-root rank of a reduce whose sends completed
  /// eagerly. The waits decide from the departure's message counts.)
  void raise_if_unusable() const {
    if (aborted_) raise(abort_code_, "the communicator was aborted: " + abort_reason_);
  }

  std::string departed_text(int p) const {
    return "rank " + std::to_string(p) + " left the communicator (destroyed it" +
           (peers_[static_cast<std::size_t>(p)].unwinding ? " while unwinding an exception)" : ")");
  }

  /// Receives every pending control notice (aborts and departures). Throws nothing itself.
  void poll_notices() {
    auto lock = mpi_lock();
    for (;;) {
      int flag = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status status;
      if (MPI_Improbe(MPI_ANY_SOURCE, detail::tag_notice, control_.get(), &flag, &message, &status) != MPI_SUCCESS || !flag)
        return;
      int bytes = 0;
      MPI_Get_count(&status, MPI_BYTE, &bytes);
      // Received into room for the whole message (never truncated: see `transfer`).
      notice_buffer_.resize(std::max<std::size_t>(sizeof(detail::notice), static_cast<std::size_t>(std::max(bytes, 0))));
      if (MPI_Mrecv(notice_buffer_.data(), bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
      detail::notice n;
      std::memcpy(&n, notice_buffer_.data(), std::min(sizeof n, static_cast<std::size_t>(std::max(bytes, 0))));
      const int from = status.MPI_SOURCE;
      if (from < 0 || from >= world_size() || n.instance != instance_) continue;  // a leftover of an older communicator
      if (n.kind == detail::notice_kind::abort) {
        if (!aborted_) {
          aborted_ = true;
          abort_code_ = static_cast<errc>(n.code);
          abort_reason_ = n.get_text();
        }
      } else if (n.kind == detail::notice_kind::depart) {
        auto& peer = peers_[static_cast<std::size_t>(from)];
        peer.departed = true;
        peer.unwinding = n.unwinding != 0;
        peer.data_sent_to_me = n.data_sent;
        peer.data_received_from_me = n.data_received;
        peer.records_sent_to_me = n.records_sent;
      }
    }
  }

  /// Cancels every active request of `requests` and waits (up to 200 ms) for them to finish;
  /// frees those that do not. Returns false when some request was freed while still active:
  /// MPI may then still write into its buffer later (after a failure, when a peer is slow or
  /// gone), so staging memory of such a receive is never reused (`poison_staging`).
  bool abandon(std::vector<MPI_Request>& requests) noexcept {
    bool all_finished = true;
    if (!is_active()) return true;
    auto lock = mpi_lock();
    for (MPI_Request& r : requests)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    const auto until = clock::now() + std::chrono::milliseconds(200);
    for (MPI_Request& r : requests) {
      while (r != MPI_REQUEST_NULL && clock::now() < until) {
        int flag = 0;
        MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
        if (!flag) std::this_thread::yield();
      }
      if (r != MPI_REQUEST_NULL) {
        MPI_Request_free(&r);
        all_finished = false;
      }
    }
    requests.clear();
    return all_finished;
  }

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
    request_guard(communicator& c, std::vector<MPI_Request>& r, bool staging = false) noexcept : c_(c), r_(r), staging_(staging) {}
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

  /// Calls `step` until it returns done. Between idle steps: backs off; every 32 idle steps
  /// receives control notices (throwing the abort's error), asks `stalled` whether a departed
  /// peer makes completion impossible (a non-empty reason throws errc::peer_exited), and checks
  /// the deadline (`on_timeout` must not return).
  template <class Step, class Stalled, class OnTimeout>
  void poll(Step&& step, Stalled&& stalled, clock::time_point until, OnTimeout&& on_timeout) {
    unsigned idle = 0;
    clock::time_point idle_since{};
    idle_phase phase = idle_phase::spin;
    for (;;) {
      const step_result r = step();
      if (r == step_result::done) return;
      if (r == step_result::progressed) {
        idle = 0;
        continue;
      }
      if (idle == 0) {
        idle_since = clock::now();
        phase = phase_after(clock::duration::zero());
      }
      if ((idle & 31u) == 31u) {  // the clock and the control channel, every 32 idle rounds
        poll_notices();
        if (aborted_) raise(abort_code_, "the communicator was aborted: " + abort_reason_);
        std::string why = stalled();
        if (!why.empty()) fail(errc::peer_exited, why);
        const auto now = clock::now();
        if (now >= until) on_timeout();
        phase = phase_after(now - idle_since);
      }
      backoff(phase);
      ++idle;
    }
  }

  // ---- transfers ---------------------------------------------------------------------------

  /// Tag class of the current operation: the collective's sequence mod 63, or 63 for send/recv.
  int current_tag_class() const noexcept {
    const collective_descriptor* d = current();
    if (!d || d->kind == collective_kind::send || d->kind == collective_kind::recv) return detail::point_to_point_class;
    return static_cast<int>(d->sequence % detail::point_to_point_class);
  }

  void check_peer(int peer, const char* what) const {
    if (peer < -1 || peer >= world_size())
      raise(errc::invalid_argument, std::string("cannot ") + what + " rank " + std::to_string(peer) + ": outside [0, " +
                                        std::to_string(world_size()) + ")");
  }

  /// The body of sendrecv (combine == nullptr: receive into `recv`) and sendrecv_reduce
  /// (receive into staging, then `acc = own (op) received` slice by slice).
  ///
  /// No receive is ever posted with room for less than a sender may send (a slice is at most
  /// `slice_bytes`): Open MPI 4.1 writes the whole of a truncated rendezvous message past the
  /// posted count (seen with the shared-memory single-copy path), so a size mismatch must be
  /// found before the data lands. Combining receives post full-slice staging buffers; plain
  /// receives post full slices into the output, and a shorter final slice is matched with
  /// MPI_Improbe, checked, and only then received (MPI_Imrecv).
  void transfer(const void* send, std::uint64_t send_bytes, int to, void* recv, std::uint64_t recv_bytes, int from,
                const void* own, void* acc, const combine_fn* combine) {
    check_peer(to, "send to");
    check_peer(from, "receive from");
    if (aborted_) raise(abort_code_, "the communicator was aborted: " + abort_reason_);
    if (to < 0 && from < 0) return;
    const std::uint64_t slice = slice_bytes_;
    const int cls = current_tag_class();
    const bool reducing = combine != nullptr;
    const std::uint64_t S = to >= 0 ? detail::slice_count(send_bytes, slice) : 0;
    const std::uint64_t R = from >= 0 ? detail::slice_count(recv_bytes, slice) : 0;
    const std::uint64_t recv_window = reducing ? static_cast<std::uint64_t>(pipeline_depth_) : transfer_window;
    const std::uint64_t send_window = transfer_window;
    auto slice_len = [&](std::uint64_t total, std::uint64_t j) { return std::min(slice, total - std::min(total, j * slice)); };
    // Plain receives whose last slice is short match it by probing (see above).
    const bool probe_tail = !reducing && R > 0 && slice_len(recv_bytes, R - 1) < slice;
    const std::uint64_t posted_slices = probe_tail ? R - 1 : R;
    unsigned char* stage = nullptr;
    if (reducing && R > 0)
      stage = static_cast<unsigned char*>(staging().get(staging_receive, static_cast<std::size_t>(std::min(R, recv_window) * slice)));

    recv_requests_.assign(static_cast<std::size_t>(std::min(R, recv_window)), MPI_REQUEST_NULL);
    send_requests_.assign(static_cast<std::size_t>(std::min(S, send_window)), MPI_REQUEST_NULL);
    request_guard recv_guard(*this, recv_requests_, reducing);
    request_guard send_guard(*this, send_requests_);

    const std::uint64_t recv_base = from >= 0 ? data_received_[static_cast<std::size_t>(from)] : 0;
    const std::uint64_t send_base = to >= 0 ? data_sent_[static_cast<std::size_t>(to)] : 0;
    std::uint64_t posted_recv = 0, done_recv = 0, posted_send = 0, done_send = 0;
    bool tail_matched = false;

    auto post_recv = [&](std::uint64_t j) {
      const std::size_t slot = static_cast<std::size_t>(j % recv_window);
      // Every posted receive has room for a whole slice: full slices of the output, or staging.
      void* dst = reducing ? static_cast<void*>(stage + slot * slice) : static_cast<void*>(static_cast<unsigned char*>(recv) + j * slice);
      check(MPI_Irecv(dst, static_cast<int>(slice), MPI_BYTE, from, MPI_ANY_TAG, data_.get(), &recv_requests_[slot]), "MPI_Irecv");
    };
    auto post_send = [&](std::uint64_t i) {
      const std::size_t slot = static_cast<std::size_t>(i % send_window);
      check(MPI_Isend(static_cast<const unsigned char*>(send) + i * slice, static_cast<int>(slice_len(send_bytes, i)), MPI_BYTE,
                      to, detail::data_tag(cls, S - 1 - i), data_.get(), &send_requests_[slot]),
            "MPI_Isend");
      ++data_sent_[static_cast<std::size_t>(to)];
    };
    {
      auto lock = mpi_lock();
      while (posted_recv < posted_slices && posted_recv < recv_window) post_recv(posted_recv++);
      while (posted_send < S && posted_send < send_window) post_send(posted_send++);
    }

    // Matches the short last slice of a plain receive once every earlier slice arrived: checks
    // its tag and size from the probe, then receives it into the output. False: not there yet.
    auto match_tail = [&]() -> bool {
      const std::uint64_t j = R - 1;
      int flag = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status status;
      {
        auto lock = mpi_lock();
        check(MPI_Improbe(from, MPI_ANY_TAG, data_.get(), &flag, &message, &status), "MPI_Improbe");
      }
      if (!flag) return false;
      if (!slice_matches(status, cls, j, R, slice_len(recv_bytes, j))) {
        // Take the message off the wire into memory of its own size, then report it.
        int count = 0;
        MPI_Get_count(&status, MPI_BYTE, &count);
        std::vector<unsigned char> sink(static_cast<std::size_t>(std::max(count, 1)));
        {
          auto lock = mpi_lock();
          MPI_Mrecv(sink.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE);
        }
        verify_slice(status, from, cls, recv_bytes, j, R, slice_len(recv_bytes, j));
      }
      auto lock = mpi_lock();
      check(MPI_Imrecv(static_cast<unsigned char*>(recv) + j * slice, static_cast<int>(slice_len(recv_bytes, j)), MPI_BYTE,
                       &message, &recv_requests_[static_cast<std::size_t>(j % recv_window)]),
            "MPI_Imrecv");
      return true;
    };

    auto step = [&]() -> step_result {
      bool progressed = false;
      while (done_recv < R) {
        if (probe_tail && done_recv == R - 1 && !tail_matched) {
          if (!match_tail()) break;
          tail_matched = true;
          progressed = true;
        }
        const std::size_t slot = static_cast<std::size_t>(done_recv % recv_window);
        int flag = 0;
        MPI_Status status;
        status.MPI_TAG = -1;
        int rc;
        {
          auto lock = mpi_lock();
          rc = MPI_Test(&recv_requests_[slot], &flag, &status);
        }
        if (rc != MPI_SUCCESS) receive_failed(rc, status, from, cls, recv_bytes, done_recv, R);
        if (!flag) break;
        if (!(probe_tail && done_recv == R - 1))  // the probed tail was checked before it was received
          verify_slice(status, from, cls, recv_bytes, done_recv, R, slice_len(recv_bytes, done_recv));
        ++data_received_[static_cast<std::size_t>(from)];
        if (reducing) {
          const std::uint64_t len = slice_len(recv_bytes, done_recv);
          const std::uint64_t off = done_recv * slice;
          if (len != 0)
            (*combine)(static_cast<unsigned char*>(acc) + off, static_cast<const unsigned char*>(own) + off,
                       stage + slot * slice, len / combine->element_size);
        }
        ++done_recv;
        if (posted_recv < posted_slices) {
          auto lock = mpi_lock();
          post_recv(posted_recv++);
        }
        progressed = true;
      }
      while (done_send < S) {
        const std::size_t slot = static_cast<std::size_t>(done_send % send_window);
        int flag = 0;
        int rc;
        {
          auto lock = mpi_lock();
          rc = MPI_Test(&send_requests_[slot], &flag, MPI_STATUS_IGNORE);
        }
        if (rc != MPI_SUCCESS) check(rc, "MPI_Test (send)");
        if (!flag) break;
        ++done_send;
        if (posted_send < S) {
          auto lock = mpi_lock();
          post_send(posted_send++);
        }
        progressed = true;
      }
      if (done_recv == R && done_send == S) return step_result::done;
      return progressed ? step_result::progressed : step_result::idle;
    };
    auto stalled = [&]() -> std::string {
      if (from >= 0 && done_recv < R) {
        const auto& peer = peers_[static_cast<std::size_t>(from)];
        if (peer.departed && peer.data_sent_to_me < recv_base + done_recv + 1)
          return departed_text(from) + " without sending the data this rank waits for in " + operation_name();
      }
      if (to >= 0 && done_send < S) {
        const auto& peer = peers_[static_cast<std::size_t>(to)];
        if (peer.departed && peer.data_received_from_me < send_base + done_send + 1)
          return departed_text(to) + " without receiving the data this rank sends it in " + operation_name();
      }
      return {};
    };
    auto on_timeout = [&]() {
      std::string what;
      std::vector<int> peers;
      if (from >= 0 && done_recv < R) {
        what += "the receive of " + std::to_string(recv_bytes) + " bytes from rank " + std::to_string(from) + " (" +
                std::to_string(done_recv) + " of " + std::to_string(R) + " slices arrived)";
        peers.push_back(from);
      }
      if (to >= 0 && done_send < S) {
        if (!what.empty()) what += " and ";
        what += "the send of " + std::to_string(send_bytes) + " bytes to rank " + std::to_string(to) + " (" +
                std::to_string(done_send) + " of " + std::to_string(S) + " slices delivered)";
        if (to != from) peers.push_back(to);
      }
      std::sort(peers.begin(), peers.end());
      // Without the check a rank waits only for its neighbours in the schedule: the rank named
      // may itself be waiting for the one that never arrived.
      timed_out("timed out after " + seconds_text() + " s in " + operation_name() + " waiting for " +
                ringzero::detail::describe_ranks(peers) + ": " + what + " did not complete" +
                (check_ ? std::string()
                        : std::string(" (that rank may itself wait for another; RINGZERO_CHECK=1 names the ranks that "
                                      "never started the collective)")));
    };
    poll(step, stalled, deadline(), on_timeout);
    recv_guard.dismiss();
    send_guard.dismiss();
  }

  /// A receive failed inside MPI: a truncation (the sender sent more) is a size mismatch,
  /// unless the message belongs to another collective altogether.
  [[noreturn]] void receive_failed(int rc, const MPI_Status& status, int from, int cls, std::uint64_t expected,
                                   std::uint64_t slice_index, std::uint64_t slices) {
    if (detail::error_class(rc) == MPI_ERR_TRUNCATE) {
      if (status.MPI_TAG >= 0 && detail::tag_class(status.MPI_TAG) != cls) class_mismatch(from, detail::tag_class(status.MPI_TAG), cls);
      fail(errc::size_mismatch, "rank " + std::to_string(from) + " sends more than the " + std::to_string(expected) +
                                    " bytes rank " + std::to_string(rank()) + " expects in " + operation_name() +
                                    (slices > 1 ? " (at slice " + std::to_string(slice_index) + ")" : ""));
    }
    fail(errc::backend_failure, "MPI_Irecv from rank " + std::to_string(from) + " failed: " + detail::error_string(rc));
  }

  /// Rank `from` sent a message of tag class `got` while this rank expects class `want`.
  [[noreturn]] void class_mismatch(int from, int got, int want) {
    auto side = [](int c) {
      return c == detail::point_to_point_class ? std::string("a point-to-point send/recv")
                                               : "a collective with sequence number = " + std::to_string(c) + " (mod 63)";
    };
    fail(errc::contract_mismatch,
         "rank " + std::to_string(from) + " sent data of " + side(got) + " while rank " + std::to_string(rank()) + " runs " +
             operation_name() + " (" + side(want) +
             "): the ranks do not run the same collectives in the same order (RINGZERO_CHECK=1 finds where they diverge)");
  }

  /// True when a message with `status` is slice `j` of `slices` of `len` bytes, class `cls`.
  static bool slice_matches(const MPI_Status& status, int cls, std::uint64_t j, std::uint64_t slices, std::uint64_t len) {
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    return detail::tag_class(status.MPI_TAG) == cls && static_cast<std::uint64_t>(count) == len &&
           detail::tag_remaining(status.MPI_TAG) == detail::tag_remaining(detail::data_tag(0, slices - 1 - j));
  }

  /// Checks that slice `j` of `slices` (expected `len` bytes) is what the sender meant.
  void verify_slice(const MPI_Status& status, int from, int cls, std::uint64_t expected_total, std::uint64_t j,
                    std::uint64_t slices, std::uint64_t len) {
    const int got_class = detail::tag_class(status.MPI_TAG);
    if (got_class != cls) class_mismatch(from, got_class, cls);
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    const std::uint64_t got = static_cast<std::uint64_t>(count);
    const int got_remaining = detail::tag_remaining(status.MPI_TAG);
    const int want_remaining = detail::tag_remaining(detail::data_tag(0, slices - 1 - j));
    if (got == len && got_remaining == want_remaining) return;
    std::string sizes;
    if (j == 0 && got_remaining == 0)
      sizes = "rank " + std::to_string(from) + " sends " + std::to_string(got) + " bytes but rank " + std::to_string(rank()) +
              " expects " + std::to_string(expected_total) + " bytes";
    else
      sizes = "rank " + std::to_string(from) + " sends " +
              (got_remaining > want_remaining || (got_remaining == want_remaining && got > len) ? "more" : "fewer") +
              " than the " + std::to_string(expected_total) + " bytes rank " + std::to_string(rank()) + " expects";
    fail(errc::size_mismatch, sizes + " in " + operation_name());
  }

  // ---- check mode ---------------------------------------------------------------------------

  /// Sends this rank's descriptor of `d` to every peer, receives theirs (polled, with the
  /// timeout naming the ranks that never arrived), and raises the contract's verdict.
  void exchange_descriptors(const collective_descriptor& d) {
    const int n = world_size(), me = rank();
    detail::encode(d, own_record_);
    own_record_.instance = instance_;
    recv_requests_.assign(static_cast<std::size_t>(n), MPI_REQUEST_NULL);
    send_requests_.assign(static_cast<std::size_t>(n), MPI_REQUEST_NULL);
    request_guard recv_guard(*this, recv_requests_);
    request_guard send_guard(*this, send_requests_);
    {
      auto lock = mpi_lock();
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        check(MPI_Irecv(&records_[static_cast<std::size_t>(p)], static_cast<int>(sizeof(detail::wire_descriptor)), MPI_BYTE,
                        p, detail::tag_descriptor, control_.get(), &recv_requests_[static_cast<std::size_t>(p)]),
              "MPI_Irecv (descriptor)");
      }
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        check(MPI_Isend(&own_record_, static_cast<int>(own_record_.wire_bytes()), MPI_BYTE, p, detail::tag_descriptor,
                        control_.get(), &send_requests_[static_cast<std::size_t>(p)]),
              "MPI_Isend (descriptor)");
        ++records_sent_[static_cast<std::size_t>(p)];
      }
    }
    std::vector<char>& arrived = arrived_;
    arrived.assign(static_cast<std::size_t>(n), 0);
    arrived[static_cast<std::size_t>(me)] = 1;
    int pending = n - 1;
    auto step = [&]() -> step_result {
      bool progressed = false;
      auto lock = mpi_lock();
      for (int p = 0; p < n; ++p) {
        if (record_arrived(p, recv_requests_[static_cast<std::size_t>(p)], "MPI_Test (descriptor)", "MPI_Irecv (descriptor)")) {
          arrived[static_cast<std::size_t>(p)] = 1;
          --pending;
          progressed = true;
        }
        if (send_completed(send_requests_[static_cast<std::size_t>(p)], "MPI_Test (descriptor)")) progressed = true;
      }
      if (pending == 0 && std::all_of(send_requests_.begin(), send_requests_.end(), [](MPI_Request r) { return r == MPI_REQUEST_NULL; }))
        return step_result::done;
      return progressed ? step_result::progressed : step_result::idle;
    };
    auto stalled = [&]() -> std::string {
      for (int p = 0; p < n; ++p) {
        const auto& peer = peers_[static_cast<std::size_t>(p)];
        if (!arrived[static_cast<std::size_t>(p)] && peer.departed && peer.records_sent_to_me <= records_received_[static_cast<std::size_t>(p)])
          return departed_text(p) + " and never arrived at " + operation_name();
      }
      return {};
    };
    auto on_timeout = [&]() {
      std::vector<int> missing, present;
      for (int p = 0; p < n; ++p) (arrived[static_cast<std::size_t>(p)] ? present : missing).push_back(p);
      timed_out("timed out after " + seconds_text() + " s: " + ringzero::detail::describe_ranks(missing) +
                " never arrived at " + operation_name() + " (" + ringzero::detail::describe_ranks(present) + " did)");
    };
    poll(step, stalled, deadline(), on_timeout);
    recv_guard.dismiss();
    send_guard.dismiss();

    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      const auto kind = static_cast<collective_kind>(records_[static_cast<std::size_t>(p)].kind);
      if (kind == collective_kind::send || kind == collective_kind::recv)
        fail(errc::contract_mismatch, "rank " + std::to_string(p) + " runs a point-to-point send/recv with rank " +
                                          std::to_string(me) + " while rank " + std::to_string(me) + " runs " +
                                          operation_name() + ": the ranks do not run the same operations in the same order");
    }
    decoded_.resize(static_cast<std::size_t>(n));
    for (int p = 0; p < n; ++p)
      if (p != me) decoded_[static_cast<std::size_t>(p)] = detail::decode(records_[static_cast<std::size_t>(p)]);
    auto get = [&](int r) -> const collective_descriptor& { return r == me ? d : decoded_[static_cast<std::size_t>(r)]; };
    bool same_sequence = true;
    for (int p = 0; p < n; ++p) same_sequence = same_sequence && get(p).sequence == d.sequence;
    if (!same_sequence) {
      std::vector<std::string> values;
      // Appended, not `"#" + std::to_string(...)`: that spelling draws GCC 12's -Wrestrict
      // false positive (GCC bug 105329) into every program that includes this header.
      for (int p = 0; p < n; ++p) values.push_back(std::string(1, '#').append(std::to_string(get(p).sequence)));
      raise(errc::contract_mismatch, "sequence number mismatch (a rank issued collectives that others did not): " +
                                         ringzero::detail::describe_values(values));
    }
    if (auto violation = check_contract(n, get, false)) raise(violation->code, violation->message);
  }

  /// True when the current operation is a point-to-point send/recv (not a collective's step).
  bool point_to_point() const noexcept {
    const collective_descriptor* d = current();
    return d == nullptr || d->kind == collective_kind::send || d->kind == collective_kind::recv;
  }

  /// "3 float32 (12 bytes)" for `bytes` bytes of `type` (the bytes alone when they do not divide).
  static std::string amount_text(std::uint64_t bytes, std::uint8_t type) {
    const auto t = static_cast<dtype>(type);
    const std::size_t es = is_valid(t) ? dtype_size(t) : 0;
    if (es == 0 || bytes % es != 0) return std::to_string(bytes) + " bytes";
    return std::to_string(bytes / es) + " " + std::string(dtype_name(t)) + " (" + std::to_string(bytes) + " bytes)";
  }

  /// Check mode, point-to-point: sends each peer of this transfer (`to`, `from`; not this rank)
  /// a record of what this rank sends to it and receives from it, receives the peer's record,
  /// and compares both directions before any data moves. Both ranks of a pair compare the same
  /// two records and raise the same error: errc::size_mismatch naming both amounts and ranks
  /// when the sizes differ, errc::contract_mismatch when one side does not send (or receive)
  /// what the other receives (or sends), or when the peer runs a collective instead. A transfer
  /// with one peer leaves the communicator usable (nothing moved, both ranks raised); a
  /// sendrecv with two different peers aborts it, so that a third rank waiting for this one's
  /// data fails too instead of timing out. Dtypes are not compared: equal byte sizes of
  /// different dtypes pass, as on the local backend. A peer that never posts its side ends in
  /// errc::timeout naming it.
  void exchange_transfer_records(std::uint64_t send_bytes, int to, std::uint64_t recv_bytes, int from) {
    const int me = rank();
    const collective_descriptor* d = current();
    const std::uint8_t type = static_cast<std::uint8_t>(d ? d->type : dtype::uint8);
    if (to == me && from == me) {
      if (send_bytes != recv_bytes)
        raise(errc::size_mismatch, "rank " + std::to_string(me) + " sends " + amount_text(send_bytes, type) +
                                       " to itself but expects " + amount_text(recv_bytes, type));
    }
    int peers[2] = {-1, -1};
    int count = 0;
    for (int p : {to, from})
      if (p >= 0 && p != me && (count == 0 || peers[0] != p)) peers[count++] = p;
    if (count == 0) return;
    recv_requests_.assign(static_cast<std::size_t>(count), MPI_REQUEST_NULL);
    send_requests_.assign(static_cast<std::size_t>(count), MPI_REQUEST_NULL);
    request_guard recv_guard(*this, recv_requests_);
    request_guard send_guard(*this, send_requests_);
    {
      auto lock = mpi_lock();
      for (int i = 0; i < count; ++i) {
        const int p = peers[i];
        detail::wire_descriptor& w = transfer_records_[i];
        w = detail::wire_descriptor{};
        w.instance = instance_;
        w.kind = static_cast<std::uint8_t>(collective_kind::send);
        w.type = type;
        w.sends = p == to ? 1 : 0;
        w.send_bytes = p == to ? send_bytes : 0;
        w.receives = p == from ? 1 : 0;
        w.recv_bytes = p == from ? recv_bytes : 0;
        check(MPI_Irecv(&records_[static_cast<std::size_t>(p)], static_cast<int>(sizeof(detail::wire_descriptor)), MPI_BYTE, p,
                        detail::tag_descriptor, control_.get(), &recv_requests_[static_cast<std::size_t>(i)]),
              "MPI_Irecv (transfer record)");
        check(MPI_Isend(&w, static_cast<int>(w.wire_bytes()), MPI_BYTE, p, detail::tag_descriptor, control_.get(),
                        &send_requests_[static_cast<std::size_t>(i)]),
              "MPI_Isend (transfer record)");
        ++records_sent_[static_cast<std::size_t>(p)];
      }
    }
    bool arrived[2] = {false, false};
    auto step = [&]() -> step_result {
      bool progressed = false, done = true;
      auto lock = mpi_lock();
      for (int i = 0; i < count; ++i) {
        const int p = peers[i];
        if (record_arrived(p, recv_requests_[static_cast<std::size_t>(i)], "MPI_Test (transfer record)",
                           "MPI_Irecv (transfer record)")) {
          arrived[i] = true;
          progressed = true;
        }
        auto& sr = send_requests_[static_cast<std::size_t>(i)];
        if (send_completed(sr, "MPI_Test (transfer record)")) progressed = true;
        done = done && arrived[i] && sr == MPI_REQUEST_NULL;
      }
      if (done) return step_result::done;
      return progressed ? step_result::progressed : step_result::idle;
    };
    auto stalled = [&]() -> std::string {
      for (int i = 0; i < count; ++i) {
        const int p = peers[i];
        const auto& peer = peers_[static_cast<std::size_t>(p)];
        if (!arrived[i] && peer.departed && peer.records_sent_to_me <= records_received_[static_cast<std::size_t>(p)])
          return departed_text(p) + " and never posted its side of this " + operation_name();
      }
      return {};
    };
    auto on_timeout = [&]() {
      std::vector<int> missing;
      for (int i = 0; i < count; ++i)
        if (!arrived[i]) missing.push_back(peers[i]);
      timed_out("timed out after " + seconds_text() + " s in " + operation_name() + ": " +
                ringzero::detail::describe_ranks(missing) + " never posted the matching side of the transfer (check mode: " +
                "its record never came)");
    };
    poll(step, stalled, deadline(), on_timeout);
    recv_guard.dismiss();
    send_guard.dismiss();

    // Each pair compares the same two records, so both ranks write the same message.
    std::string problem;
    errc code = errc::size_mismatch;
    for (int i = 0; i < count && problem.empty(); ++i) {
      const int p = peers[i];
      const detail::wire_descriptor& theirs = records_[static_cast<std::size_t>(p)];
      const auto kind = static_cast<collective_kind>(theirs.kind);
      if (kind != collective_kind::send && kind != collective_kind::recv) {
        fail(errc::contract_mismatch,
             "rank " + std::to_string(p) + " runs " + std::string(collective_name(kind)) + " #" +
                 std::to_string(theirs.sequence) + " while rank " + std::to_string(me) +
                 " runs a point-to-point " + operation_name() + " with it: the ranks do not run the same operations in "
                 "the same order");
      }
      // The direction sender -> receiver, in the same words on both ranks.
      auto direction = [&](int sender, bool sends, std::uint64_t sent, std::uint8_t sent_type, int receiver, bool receives,
                           std::uint64_t expected, std::uint8_t expected_type) {
        const std::string rs = "rank " + std::to_string(sender), rr = "rank " + std::to_string(receiver);
        if (sends && !receives) {
          code = errc::contract_mismatch;
          problem = rs + " sends " + amount_text(sent, sent_type) + " to " + rr + " but " + rr + " does not receive from " + rs;
        } else if (!sends && receives) {
          code = errc::contract_mismatch;
          problem = rr + " receives " + amount_text(expected, expected_type) + " from " + rs + " but " + rs +
                    " does not send to " + rr;
        } else if (sends && sent != expected) {
          problem = rs + " sends " + amount_text(sent, sent_type) + " to " + rr + " but " + rr + " expects " +
                    amount_text(expected, expected_type);
        }
      };
      auto outgoing = [&] { direction(me, p == to, send_bytes, type, p, theirs.receives != 0, theirs.recv_bytes, theirs.type); };
      auto incoming = [&] { direction(p, theirs.sends != 0, theirs.send_bytes, theirs.type, me, p == from, recv_bytes, type); };
      // The lower rank's sending direction first, on both ranks.
      if (me < p) {
        outgoing();
        if (problem.empty()) incoming();
      } else {
        incoming();
        if (problem.empty()) outgoing();
      }
    }
    if (problem.empty()) return;
    problem += " (check mode: no data moved)";
    if (count > 1) fail(code, problem + "; the communicator is aborted so that no other peer waits for this transfer");
    raise(code, problem);
  }

  // ---- synchronisation and departure --------------------------------------------------------

  /// A dissemination barrier on the control communicator, polled against the timeout.
  void synchronize(const char* what) {
    raise_if_unusable();
    for (int p = 0; p < world_size(); ++p)
      if (peers_[static_cast<std::size_t>(p)].departed) fail(errc::peer_exited, departed_text(p) + " before " + what);
    const int n = world_size(), me = rank();
    const auto until = deadline();
    for (int step = 1; step < n; step *= 2) {
      const int to = (me + step) % n, from = (me - step % n + n) % n;
      recv_requests_.assign(1, MPI_REQUEST_NULL);
      send_requests_.assign(1, MPI_REQUEST_NULL);
      request_guard recv_guard(*this, recv_requests_);
      request_guard send_guard(*this, send_requests_);
      {
        auto lock = mpi_lock();
        check(MPI_Irecv(sync_buffer_, static_cast<int>(sizeof sync_buffer_), MPI_BYTE, from, detail::tag_sync, control_.get(),
                        &recv_requests_[0]),
              "MPI_Irecv (sync)");
        check(MPI_Isend(nullptr, 0, MPI_BYTE, to, detail::tag_sync, control_.get(), &send_requests_[0]), "MPI_Isend (sync)");
      }
      auto step_fn = [&]() -> step_result {
        auto lock = mpi_lock();
        int a = 1, b = 1;
        if (recv_requests_[0] != MPI_REQUEST_NULL) check(MPI_Test(&recv_requests_[0], &a, MPI_STATUS_IGNORE), "MPI_Test (sync)");
        if (send_requests_[0] != MPI_REQUEST_NULL) check(MPI_Test(&send_requests_[0], &b, MPI_STATUS_IGNORE), "MPI_Test (sync)");
        return a && b ? step_result::done : step_result::idle;
      };
      auto stalled = [&]() -> std::string {
        if (peers_[static_cast<std::size_t>(from)].departed) return departed_text(from) + " before " + what;
        return {};
      };
      auto on_timeout = [&]() {
        timed_out(std::string("timed out after ") + seconds_text() + " s in " + what + " waiting for rank " +
                  std::to_string(from) + " (every rank must call " + what + ")");
      };
      poll(step_fn, stalled, until, on_timeout);
      recv_guard.dismiss();
      send_guard.dismiss();
    }
  }

  /// Sends a departure notice to every peer and waits for theirs, so that every notice is
  /// received before the communicators are freed: up to the timeout, or up to
  /// `failed_departure_wait` when the communicator was aborted. Returns true when every peer
  /// departed. Never throws on its own.
  bool depart() {
    const int n = world_size(), me = rank();
    if (n == 1) return true;
    const bool unwinding = std::uncaught_exceptions() > uncaught_at_start_;
    std::vector<MPI_Request> sends;
    std::vector<std::unique_ptr<detail::notice>> bodies;
    {
      auto lock = mpi_lock();
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        auto body = std::make_unique<detail::notice>();
        body->instance = instance_;
        body->kind = detail::notice_kind::depart;
        body->data_sent = data_sent_[static_cast<std::size_t>(p)];
        body->data_received = data_received_[static_cast<std::size_t>(p)];
        body->records_sent = records_sent_[static_cast<std::size_t>(p)];
        body->unwinding = unwinding ? 1 : 0;
        MPI_Request req = MPI_REQUEST_NULL;
        if (MPI_Isend(body.get(), static_cast<int>(body->wire_bytes()), MPI_BYTE, p, detail::tag_notice, control_.get(), &req) ==
            MPI_SUCCESS) {
          sends.push_back(req);
          bodies.push_back(std::move(body));
        }
      }
    }
    const auto start = clock::now();
    const auto until =
        aborted_ ? start + std::min(std::chrono::duration_cast<clock::duration>(timeout()),
                                    std::chrono::duration_cast<clock::duration>(failed_departure_wait))
                 : deadline();
    bool all_departed = false;
    for (;;) {
      poll_notices();
      all_departed = true;
      for (int p = 0; p < n; ++p)
        if (p != me && !peers_[static_cast<std::size_t>(p)].departed) all_departed = false;
      bool all_sent = true;
      {
        auto lock = mpi_lock();
        for (MPI_Request& r : sends) {
          if (r == MPI_REQUEST_NULL) continue;
          int flag = 0;
          MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
          if (!flag) all_sent = false;
        }
        for (MPI_Request& r : notice_requests_) {
          if (r == MPI_REQUEST_NULL) continue;
          int flag = 0;
          MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
          if (!flag) all_sent = false;
        }
      }
      if (all_departed && all_sent) break;
      const auto now = clock::now();
      if (now >= until) break;
      backoff(phase_after(now - start));
    }
    // One abandon for both kinds of notices: a busy peer takes none of them (Open MPI's
    // shared-memory sends complete when the receiver returns the fragment), and each abandon
    // may wait 200 ms.
    sends.insert(sends.end(), notice_requests_.begin(), notice_requests_.end());
    notice_requests_.clear();
    if (!abandon(sends)) keep_notice_bodies(bodies);
    return all_departed;
  }

  // ---- native collectives -----------------------------------------------------------------

  /// The watchdog's report for a native collective that passed its deadline.
  std::string describe_native_timeout(const void* context) const {
    const auto* d = static_cast<const collective_descriptor*>(context);
    error_context c;
    c.backend = "mpi";
    c.rank = rank();
    c.world_size = world_size();
    if (d) {
      c.collective = std::string(collective_name(d->kind));
      c.sequence = static_cast<std::int64_t>(d->sequence);
    }
    const error e(errc::timeout, c,
                  "timed out after " + seconds_text() +
                      " s in a native MPI collective; a blocking MPI call cannot be interrupted, so the job is aborted "
                      "(MPI_Abort). Which ranks did not arrive is unknown to a blocking call: " +
                      (check_ ? std::string("every rank passed the check-mode exchange, so a rank stopped inside MPI")
                              : std::string("run with RINGZERO_CHECK=1 to name them")));
    return e.what();
  }

  /// Arms the watchdog for one blocking MPI call and disarms it when the scope ends.
  class watchdog_scope {
   public:
    watchdog_scope(communicator& c, const collective_descriptor& d) : c_(c) { c_.watchdog_.arm(c_.deadline(), &d); }
    ~watchdog_scope() { c_.watchdog_.disarm(); }
    watchdog_scope(const watchdog_scope&) = delete;
    watchdog_scope& operator=(const watchdog_scope&) = delete;

   private:
    communicator& c_;
  };

  /// Checks a native MPI call's return code (the collective layer then aborts the
  /// communicator, outside the MPI lock).
  void native_check(int rc, const char* what) const {
    if (rc != MPI_SUCCESS) raise(errc::backend_failure, std::string(what) + " failed: " + detail::error_string(rc));
  }

  /// Runs `call(sendbuf, recvbuf, count)` over chunks of at most 2^30 elements.
  template <class Call>
  void chunked(const void* send, void* recv, std::uint64_t count, std::size_t element_size, Call&& call) {
    constexpr std::uint64_t chunk = std::uint64_t{1} << 30;
    for (std::uint64_t first = 0; first < count; first += chunk) {
      const std::uint64_t len = std::min(chunk, count - first);
      const void* s = send == MPI_IN_PLACE || send == nullptr ? send : static_cast<const unsigned char*>(send) + first * element_size;
      void* r = recv == nullptr ? nullptr : static_cast<unsigned char*>(recv) + first * element_size;
      call(s, r, static_cast<int>(len));
    }
  }

  /// One block of `bytes` bytes as (count, datatype) for a byte-moving collective.
  struct block {
    int count = 0;
    MPI_Datatype type = MPI_BYTE;
    detail::owned_datatype owned;
  };
  void describe_block(std::uint64_t bytes, block& b) {
    if (bytes <= static_cast<std::uint64_t>(INT_MAX)) {
      b.count = static_cast<int>(bytes);
      b.type = MPI_BYTE;
      return;
    }
    MPI_Datatype t = MPI_DATATYPE_NULL;
    native_check(detail::make_block_type(bytes, &t), "MPI_Type_create_struct");
    b.owned.reset(t);
    b.count = 1;
    b.type = t;
  }

  communicator_options options_;
  bool serialize_ = false;
  bool check_ = false;
  failure_policy policy_ = failure_policy::abort_job;
  link_model link_;
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
  detail::wire_descriptor own_record_;
  detail::wire_descriptor transfer_records_[2];  ///< check mode: this rank's records of a send/recv
  std::vector<detail::wire_descriptor> records_;
  std::vector<collective_descriptor> decoded_;
  std::vector<char> arrived_;
  std::unique_ptr<workspace_pool> staging_;
  int uncaught_at_start_ = 0;
  std::uint64_t instance_ = 0;
  detail::watchdog watchdog_;
};

// ---------------------------------------------------------------- native collectives

inline void communicator::run_native(const collective_descriptor& d) {
  const int n = world_size(), r = rank();
  const std::uint64_t count = d.count;
  const std::size_t es = dtype_size(d.type);
  const MPI_Datatype type = datatype_of(d.type);
  const bool premul = is_reduction(d.kind) && d.op.kind == reduce_kind::premul_sum;
  const bool avg = is_reduction(d.kind) && d.op.kind == reduce_kind::avg;
  const MPI_Op op = is_reduction(d.kind) ? operation_of(d.type, d.op.kind) : MPI_OP_NULL;
  MPI_Comm comm = data_.get();
  // premul_sum: this rank's input times its scalar, in scratch, then a plain sum.
  auto input_of = [&](std::uint64_t elements) -> const void* {
    if (!premul) return d.send;
    void* scaled = staging().get(staging_native, static_cast<std::size_t>(elements * es));
    primitive::scale_into(scaled, d.send, elements, d.type, d.op.scalar);
    return scaled;
  };
  watchdog_scope watch(*this, d);
  auto lock = mpi_lock();
  switch (d.kind) {
    case collective_kind::all_reduce: {
      const void* in = input_of(count);
      const void* sendbuf = in == d.recv ? MPI_IN_PLACE : in;
      chunked(sendbuf, d.recv, count, es, [&](const void* s, void* v, int len) {
        native_check(MPI_Allreduce(s, v, len, type, op, comm), "MPI_Allreduce");
      });
      if (avg) primitive::divide_into(d.recv, d.recv, count, d.type, n);
      return;
    }
    case collective_kind::reduce_scatter: {
      const void* in = input_of(count * static_cast<std::uint64_t>(n));
      // MPI_IN_PLACE would leave the result at the start of the buffer, not at rank*count
      // (NCCL's convention): an in-place call reduces into scratch and copies.
      const bool aliased = in == d.send && d.in_place;
      void* out = aliased ? staging().get(staging_native, static_cast<std::size_t>(count * es)) : d.recv;
      if (count <= static_cast<std::uint64_t>(INT_MAX)) {
        native_check(MPI_Reduce_scatter_block(in, out, static_cast<int>(count), type, op, comm), "MPI_Reduce_scatter_block");
      } else {
        for (int q = 0; q < n; ++q)
          chunked(static_cast<const unsigned char*>(in) + static_cast<std::uint64_t>(q) * count * es, q == r ? out : nullptr,
                  count, es, [&](const void* s, void* v, int len) {
                    native_check(MPI_Reduce(s, v, len, type, op, q, comm), "MPI_Reduce");
                  });
      }
      if (aliased) primitive::copy_bytes(d.recv, out, static_cast<std::size_t>(count * es));
      if (avg) primitive::divide_into(d.recv, d.recv, count, d.type, n);
      return;
    }
    case collective_kind::all_gather: {
      block b;
      describe_block(count * es, b);
      native_check(MPI_Allgather(d.in_place ? MPI_IN_PLACE : d.send, b.count, b.type, d.recv, b.count, b.type, comm),
                   "MPI_Allgather");
      return;
    }
    case collective_kind::broadcast: {
      if (r == d.root && d.send != d.recv) primitive::copy_bytes(d.recv, d.send, static_cast<std::size_t>(count * es));
      chunked(nullptr, d.recv, count * es, 1, [&](const void*, void* v, int len) {
        native_check(MPI_Bcast(v, len, MPI_BYTE, d.root, comm), "MPI_Bcast");
      });
      return;
    }
    case collective_kind::reduce: {
      const void* in = input_of(count);
      if (r == d.root) {
        const void* sendbuf = in == d.recv ? MPI_IN_PLACE : in;
        chunked(sendbuf, d.recv, count, es, [&](const void* s, void* v, int len) {
          native_check(MPI_Reduce(s, v, len, type, op, d.root, comm), "MPI_Reduce");
        });
        if (avg) primitive::divide_into(d.recv, d.recv, count, d.type, n);
      } else {
        chunked(in, nullptr, count, es, [&](const void* s, void*, int len) {
          native_check(MPI_Reduce(s, nullptr, len, type, op, d.root, comm), "MPI_Reduce");
        });
      }
      return;
    }
    case collective_kind::all_to_all: {
      block b;
      describe_block(count * es, b);
      native_check(MPI_Alltoall(d.send, b.count, b.type, d.recv, b.count, b.type, comm), "MPI_Alltoall");
      return;
    }
    case collective_kind::barrier: native_check(MPI_Barrier(comm), "MPI_Barrier"); return;
    default: break;
  }
  raise(errc::unsupported, "no native MPI collective for " + std::string(collective_name(d.kind)));
}

}  // namespace ringzero::mpi
