#pragma once
/// @file
/// The control channel of `mpi::communicator`: joining (duplicating the MPI communicator
/// and agreeing on the settings), abort and departure notices, the check mode's descriptor and
/// transfer-record exchanges, the barrier and the departure at destruction (docs/mpi.md).
///
/// Out-of-line members of `mpi::communicator`: backend/mpi/communicator.hpp includes this
/// header after the class; it includes that header back only so that it compiles on its own.

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ringzero/backend/mpi/communicator.hpp"

namespace ringzero::mpi {

/// MPI_Comm_idup of `from` into `into`, polled until `deadline` (construction's timeout,
/// counted from `start`). The duplicate lands in storage of its own: when the wait gives up,
/// the request stays pending (MPI forbids cancelling or freeing a nonblocking collective's
/// request) and MPI completes it if the late ranks arrive, writing the new handle there; that
/// storage is then deliberately leaked (on every failure path) instead of being a member of
/// this object, which is gone by then. On expiry: abort the job or throw errc::timeout, per
/// the failure policy (`job` is what MPI_Abort ends).
inline void communicator::duplicate_within(const collective_descriptor* op, MPI_Comm from, detail::comm_holder& into,
                                           clock::time_point start, clock::time_point deadline, MPI_Comm job) {
  auto* target = new MPI_Comm(MPI_COMM_NULL);
  MPI_Request req = MPI_REQUEST_NULL;
  {
    auto lock = mpi_lock();
    check(op, MPI_Comm_idup(from, target, &req), "MPI_Comm_idup");
  }
  for (unsigned i = 0;; ++i) {
    int flag = 0;
    {
      auto lock = mpi_lock();
      check(op, MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test (MPI_Comm_idup)");
    }
    if (flag) break;
    if ((i & 31u) == 0 && clock::now() >= deadline) {
      const std::string msg = "timed out after " + ringzero::detail::seconds_text(timeout()) +
                              " s making the communicator: not every rank of the MPI communicator constructed an "
                              "mpi::communicator (construction is collective)";
      if (policy_ == failure_policy::abort_job) abort_job(error(errc::timeout, context(op), msg), job);
      raise(op, errc::timeout, msg);
    }
    backoff(phase_after(clock::now() - start));
  }
  *into.out() = *target;
  delete target;
}

/// Duplicates `comm` (nonblocking, polled against the timeout), makes the control
/// communicator (the same way), agrees on the settings and measures oversubscription.
inline void communicator::join(MPI_Comm comm) {
  detail::lingering::collect(serialize_);
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration_cast<clock::duration>(timeout());
  duplicate_within(nullptr, comm, data_, start, deadline, comm);
  // A rank that arrives after its peers gave up completes their pending duplicate above but
  // finds nobody for this one: it times out here instead of blocking in MPI_Comm_dup.
  try {
    duplicate_within(nullptr, data_.get(), control_, start, deadline, comm);
  } catch (...) {
    // The abandoned duplicate still refers to the data communicator: freeing it under the
    // pending request corrupted Open MPI's state at MPI_Finalize. It is left to MPI.
    (void)data_.release();
    throw;
  }
  auto lock = mpi_lock();
  check(nullptr, MPI_Comm_set_errhandler(data_.get(), MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check(nullptr, MPI_Comm_set_errhandler(control_.get(), MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");

  MPI_Comm node = MPI_COMM_NULL;
  check(nullptr, MPI_Comm_split_type(data_.get(), MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &node),
        "MPI_Comm_split_type");
  int local = 1;
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  const unsigned cpus = std::thread::hardware_concurrency();
  oversubscribed_ = cpus != 0 && static_cast<unsigned>(local) > cpus;
  mpi_yields_ = detail::mpi_yields_when_idle();
  single_node_ = local == world_size();  // the same answer on every rank
  slice_bytes_ =
      options_.slice_bytes != 0 ? options_.slice_bytes : (single_node_ ? node_slice_bytes : network_slice_bytes);
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
  mine.wire_format = static_cast<std::int32_t>(ringzero::detail::wire_format_version);
  if (options_.link) {  // as given; zeros for the default, resolved below
    mine.link[0] = options_.link->alpha_us;
    mine.link[1] = options_.link->beta_us_per_byte;
    mine.link[2] = options_.link->gamma_us_per_byte;
    mine.link[3] = options_.link->eager_bytes;
  }
  mine.link_gbps = pacer_.gbps();
  mine.malformed_environment = malformed_environment_.empty() ? 0 : 1;
  mine.tuning = tuning_.fingerprint();
  std::vector<detail::hello_record> all(static_cast<std::size_t>(world_size()));
  check(nullptr, MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, control_.get()),
        "MPI_Allgather");
  // Before comparing settings: a rank with a malformed variable runs on defaults.
  std::string malformed;
  for (int r = 0; r < world_size(); ++r)
    if (all[static_cast<std::size_t>(r)].malformed_environment != 0)
      malformed += (malformed.empty() ? "" : ", ") + std::to_string(r);
  if (!malformed.empty())
    raise(nullptr, errc::invalid_argument,
          (malformed_environment_.empty()
               ? "a RINGZERO_* environment variable or the tuning table is malformed on rank(s) " + malformed +
                     " (see that rank's error)"
               : malformed_environment_ + " (malformed on rank(s) " + malformed + ")") +
              "; no rank made the communicator");
  auto agree = [&](const char* what, auto field, auto text) {
    std::vector<std::string> values;
    for (const auto& h : all) values.push_back(text(h.*field));
    for (const auto& v : values)
      if (v != values.front())
        raise(nullptr, errc::invalid_argument,
              std::string(what) + " differs between ranks: " + ringzero::detail::describe_values(values));
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
  agree("the link model (communicator_options::link)", &detail::hello_record::link, [](const double(&m)[4]) {
    if (m[0] == 0 && m[1] == 0 && m[2] == 0 && m[3] == 0) return std::string("the default");
    auto exact = [](double v) {  // the shortest decimal that reads back as v: values one bit apart differ
      char text[32];
      return std::string(text, std::to_chars(text, text + sizeof text, v).ptr);
    };
    return "alpha " + exact(m[0]) + " us, beta " + exact(m[1]) + " us/B, gamma " + exact(m[2]) + " us/B, eager " +
           exact(m[3]) + " B";
  });
  agree("the paced link (communicator_options::link_gbps / RINGZERO_LINK_GBPS)", &detail::hello_record::link_gbps,
        [](double g) {
          if (!(g > 0)) return std::string("none");
          char text[32];  // the shortest decimal that reads back as g: values one bit apart differ
          return std::string(text, std::to_chars(text, text + sizeof text, g).ptr) + " Gb/s";
        });
  // A paced link is slower than shared memory: the cost model sees at least its throughput.
  if (pacer_.active()) link_.beta_us_per_byte = std::max(link_.beta_us_per_byte, 8.0 / (1e3 * pacer_.gbps()));
  agree("RINGZERO_ALGO", &detail::hello_record::forced_algorithm,
        [](std::int32_t a) { return std::string(algorithm_name(static_cast<algorithm>(a))); });
  // Ranks with different rules would run different algorithms in one collective.
  agree("the tuning table (communicator_options::tuning / RINGZERO_MPI_TUNING)", &detail::hello_record::tuning,
        [](std::uint32_t h) { return h == 0 ? std::string("none") : "rules with fingerprint " + std::to_string(h); });
  // Equal fingerprints may still hide different rules (32 bits): rank 0's rules go to every
  // rank, which compares them with its own, exactly.
  if (tuning_.empty()) return;
  const std::string text = tuning_.text();
  unsigned long long length = text.size();  // <= the file limit's rules: fits an int
  check(nullptr, MPI_Bcast(&length, 1, MPI_UNSIGNED_LONG_LONG, 0, control_.get()), "MPI_Bcast");
  std::string root(static_cast<std::size_t>(length), '\0');
  if (rank() == 0) root = text;
  check(nullptr, MPI_Bcast(root.data(), static_cast<int>(length), MPI_CHAR, 0, control_.get()), "MPI_Bcast");
  const int differs = root != text ? 1 : 0;
  std::vector<int> differ(static_cast<std::size_t>(world_size()));
  check(nullptr, MPI_Allgather(&differs, 1, MPI_INT, differ.data(), 1, MPI_INT, control_.get()), "MPI_Allgather");
  std::string ranks;
  for (int r = 0; r < world_size(); ++r)
    if (differ[static_cast<std::size_t>(r)] != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (!ranks.empty())
    raise(nullptr, errc::invalid_argument,
          "the tuning table (communicator_options::tuning / RINGZERO_MPI_TUNING) differs between ranks: rank(s) " +
              ranks + " have other rules than rank 0 (with the same 32-bit fingerprint)");
}

/// Tests the receive of rank `p`'s record (into `records_[p]`) on `request`: true once this
/// communicator's record has arrived (counted in `records_received_`). A record of an older
/// communicator on a reused MPI context is dropped and listened for again. `test_what` and
/// `irecv_what` name the MPI calls in errors. Called under the MPI lock.
inline bool communicator::record_arrived(const collective_descriptor* op, int p, MPI_Request& request,
                                         const char* test_what, const char* irecv_what) {
  if (request == MPI_REQUEST_NULL) return false;
  int flag = 0;
  check(op, MPI_Test(&request, &flag, MPI_STATUS_IGNORE), test_what);
  if (!flag) return false;
  ringzero::detail::wire_record& record = records_[static_cast<std::size_t>(p)];
  if (record.instance != instance_) {
    check(op,
          MPI_Irecv(&record, static_cast<int>(sizeof(ringzero::detail::wire_record)), MPI_BYTE, p,
                    detail::tag_descriptor, control_.get(), &request),
          irecv_what);
    return false;
  }
  ++records_received_[static_cast<std::size_t>(p)];
  return true;
}

/// Tests the send `request`: true when it completed in this call. Called under the MPI lock.
inline bool communicator::send_completed(const collective_descriptor* op, MPI_Request& request, const char* what) {
  if (request == MPI_REQUEST_NULL) return false;
  int flag = 0;
  check(op, MPI_Test(&request, &flag, MPI_STATUS_IGNORE), what);
  return flag != 0;
}

/// Marks this communicator aborted with `code` and `text` (the first abort wins) and tells
/// every peer. Never throws MPI errors (best effort: the job is failing).
inline void communicator::notify_abort(errc code, const std::string& text) {
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

/// Receives every pending control notice (aborts and departures). Throws nothing itself.
inline void communicator::poll_notices() {
  auto lock = mpi_lock();
  for (;;) {
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, detail::tag_notice, control_.get(), &flag, &message, &status) != MPI_SUCCESS ||
        !flag)
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
inline bool communicator::abandon(std::vector<MPI_Request>& requests) noexcept {
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

/// The check mode's contract exchange (backend/protocol/contract_exchange.hpp) over the control
/// communicator: sends this rank's record of `d` to every peer, receives theirs (polled, with
/// the timeout naming the ranks that never arrived), and raises the verdict.
inline void communicator::exchange_descriptors(const collective_descriptor& d) {
  const int n = world_size(), me = rank();
  auto all_gather = [&](std::vector<ringzero::detail::wire_record>& records) {
    recv_requests_.assign(static_cast<std::size_t>(n), MPI_REQUEST_NULL);
    send_requests_.assign(static_cast<std::size_t>(n), MPI_REQUEST_NULL);
    request_guard recv_guard(*this, recv_requests_);
    request_guard send_guard(*this, send_requests_);
    const ringzero::detail::wire_record& own = records[static_cast<std::size_t>(me)];
    {
      auto lock = mpi_lock();
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        check(&d,
              MPI_Irecv(&records[static_cast<std::size_t>(p)], static_cast<int>(sizeof(ringzero::detail::wire_record)),
                        MPI_BYTE, p, detail::tag_descriptor, control_.get(),
                        &recv_requests_[static_cast<std::size_t>(p)]),
              "MPI_Irecv (descriptor)");
      }
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        check(&d,
              MPI_Isend(&own, static_cast<int>(own.wire_bytes()), MPI_BYTE, p, detail::tag_descriptor, control_.get(),
                        &send_requests_[static_cast<std::size_t>(p)]),
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
        if (record_arrived(&d, p, recv_requests_[static_cast<std::size_t>(p)], "MPI_Test (descriptor)",
                           "MPI_Irecv (descriptor)")) {
          arrived[static_cast<std::size_t>(p)] = 1;
          --pending;
          progressed = true;
        }
        if (send_completed(&d, send_requests_[static_cast<std::size_t>(p)], "MPI_Test (descriptor)")) progressed = true;
      }
      if (pending == 0 && std::all_of(send_requests_.begin(), send_requests_.end(),
                                      [](MPI_Request r) { return r == MPI_REQUEST_NULL; }))
        return step_result::done;
      return progressed ? step_result::progressed : step_result::idle;
    };
    auto stalled = [&]() -> std::string {
      for (int p = 0; p < n; ++p) {
        const auto& peer = peers_[static_cast<std::size_t>(p)];
        if (!arrived[static_cast<std::size_t>(p)] && peer.departed &&
            peer.records_sent_to_me <= records_received_[static_cast<std::size_t>(p)])
          return departed_text(p) + " and never arrived at " + ringzero::detail::operation_name(&d);
      }
      return {};
    };
    auto on_timeout = [&]() {
      std::vector<int> missing, present;
      for (int p = 0; p < n; ++p) (arrived[static_cast<std::size_t>(p)] ? present : missing).push_back(p);
      timed_out(&d, "timed out after " + ringzero::detail::seconds_text(timeout()) +
                        " s: " + ringzero::detail::describe_ranks(missing) + " never arrived at " +
                        ringzero::detail::operation_name(&d) + " (" + ringzero::detail::describe_ranks(present) +
                        " did)");
    };
    poll(&d, step, stalled, deadline(), on_timeout);
    recv_guard.dismiss();
    send_guard.dismiss();
  };
  const auto verdict = ringzero::detail::exchange_contract(n, me, d, instance_, records_, decoded_, all_gather);
  if (!verdict) return;
  if (verdict->abort) fail(&d, verdict->code, verdict->message);
  raise(&d, verdict->code, verdict->message);
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
inline void communicator::exchange_transfer_records(const collective_descriptor& d, std::uint64_t send_bytes, int to,
                                                    std::uint64_t recv_bytes, int from) {
  const int me = rank();
  const std::uint8_t type = static_cast<std::uint8_t>(d.type);
  if (to == me && from == me) {
    if (send_bytes != recv_bytes)
      raise(&d, errc::size_mismatch,
            "rank " + std::to_string(me) + " sends " + ringzero::detail::amount_text(send_bytes, type) +
                " to itself but expects " + ringzero::detail::amount_text(recv_bytes, type));
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
      ringzero::detail::wire_record& w = transfer_records_[i];
      w = ringzero::detail::wire_record{};
      w.instance = instance_;
      w.kind = static_cast<std::uint8_t>(collective_kind::send);
      w.type = type;
      w.sends = p == to ? 1 : 0;
      w.send_bytes = p == to ? send_bytes : 0;
      w.receives = p == from ? 1 : 0;
      w.recv_bytes = p == from ? recv_bytes : 0;
      check(
          &d,
          MPI_Irecv(&records_[static_cast<std::size_t>(p)], static_cast<int>(sizeof(ringzero::detail::wire_record)),
                    MPI_BYTE, p, detail::tag_descriptor, control_.get(), &recv_requests_[static_cast<std::size_t>(i)]),
          "MPI_Irecv (transfer record)");
      check(&d,
            MPI_Isend(&w, static_cast<int>(w.wire_bytes()), MPI_BYTE, p, detail::tag_descriptor, control_.get(),
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
      if (record_arrived(&d, p, recv_requests_[static_cast<std::size_t>(i)], "MPI_Test (transfer record)",
                         "MPI_Irecv (transfer record)")) {
        arrived[i] = true;
        progressed = true;
      }
      auto& sr = send_requests_[static_cast<std::size_t>(i)];
      if (send_completed(&d, sr, "MPI_Test (transfer record)")) progressed = true;
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
        return departed_text(p) + " and never posted its side of this " + ringzero::detail::operation_name(&d);
    }
    return {};
  };
  auto on_timeout = [&]() {
    std::vector<int> missing;
    for (int i = 0; i < count; ++i)
      if (!arrived[i]) missing.push_back(peers[i]);
    timed_out(&d, "timed out after " + ringzero::detail::seconds_text(timeout()) + " s in " +
                      ringzero::detail::operation_name(&d) + ": " + ringzero::detail::describe_ranks(missing) +
                      " never posted the matching side of the transfer (check mode: " + "its record never came)");
  };
  poll(&d, step, stalled, deadline(), on_timeout);
  recv_guard.dismiss();
  send_guard.dismiss();

  // Each pair compares the same two records, so both ranks write the same message.
  std::string problem;
  errc code = errc::size_mismatch;
  for (int i = 0; i < count && problem.empty(); ++i) {
    const int p = peers[i];
    const ringzero::detail::wire_record& theirs = records_[static_cast<std::size_t>(p)];
    const auto kind = static_cast<collective_kind>(theirs.kind);
    if (kind != collective_kind::send && kind != collective_kind::recv) {
      fail(&d, errc::contract_mismatch,
           "rank " + std::to_string(p) + " runs " + std::string(collective_name(kind)) + " #" +
               std::to_string(theirs.sequence) + " while rank " + std::to_string(me) + " runs a point-to-point " +
               ringzero::detail::operation_name(&d) +
               " with it: the ranks do not run the same operations in "
               "the same order");
    }
    // The direction sender -> receiver, in the same words on both ranks.
    auto direction = [&](int sender, bool sends, std::uint64_t sent, std::uint8_t sent_type, int receiver,
                         bool receives, std::uint64_t expected, std::uint8_t expected_type) {
      const std::string rs = "rank " + std::to_string(sender), rr = "rank " + std::to_string(receiver);
      if (sends && !receives) {
        code = errc::contract_mismatch;
        problem = rs + " sends " + ringzero::detail::amount_text(sent, sent_type) + " to " + rr + " but " + rr +
                  " does not receive from " + rs;
      } else if (!sends && receives) {
        code = errc::contract_mismatch;
        problem = rr + " receives " + ringzero::detail::amount_text(expected, expected_type) + " from " + rs + " but " +
                  rs + " does not send to " + rr;
      } else if (sends && sent != expected) {
        problem = rs + " sends " + ringzero::detail::amount_text(sent, sent_type) + " to " + rr + " but " + rr +
                  " expects " + ringzero::detail::amount_text(expected, expected_type);
      }
    };
    auto outgoing = [&] {
      direction(me, p == to, send_bytes, type, p, theirs.receives != 0, theirs.recv_bytes, theirs.type);
    };
    auto incoming = [&] {
      direction(p, theirs.sends != 0, theirs.send_bytes, theirs.type, me, p == from, recv_bytes, type);
    };
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
  if (count > 1)
    fail(&d, code, problem + "; the communicator is aborted so that no other peer waits for this transfer");
  raise(&d, code, problem);
}

/// A dissemination barrier on the control communicator, polled against the timeout.
inline void communicator::synchronize(const collective_descriptor* op, const char* what) {
  raise_if_unusable(op);
  for (int p = 0; p < world_size(); ++p)
    if (peers_[static_cast<std::size_t>(p)].departed) fail(op, errc::peer_exited, departed_text(p) + " before " + what);
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
      check(op,
            MPI_Irecv(sync_buffer_, static_cast<int>(sizeof sync_buffer_), MPI_BYTE, from, detail::tag_sync,
                      control_.get(), &recv_requests_[0]),
            "MPI_Irecv (sync)");
      check(op, MPI_Isend(nullptr, 0, MPI_BYTE, to, detail::tag_sync, control_.get(), &send_requests_[0]),
            "MPI_Isend (sync)");
    }
    auto step_fn = [&]() -> step_result {
      auto lock = mpi_lock();
      int a = 1, b = 1;
      if (recv_requests_[0] != MPI_REQUEST_NULL)
        check(op, MPI_Test(&recv_requests_[0], &a, MPI_STATUS_IGNORE), "MPI_Test (sync)");
      if (send_requests_[0] != MPI_REQUEST_NULL)
        check(op, MPI_Test(&send_requests_[0], &b, MPI_STATUS_IGNORE), "MPI_Test (sync)");
      return a && b ? step_result::done : step_result::idle;
    };
    auto stalled = [&]() -> std::string {
      if (peers_[static_cast<std::size_t>(from)].departed) return departed_text(from) + " before " + what;
      return {};
    };
    auto on_timeout = [&]() {
      timed_out(op, std::string("timed out after ") + ringzero::detail::seconds_text(timeout()) + " s in " + what +
                        " waiting for rank " + std::to_string(from) + " (every rank must call " + what + ")");
    };
    poll(op, step_fn, stalled, until, on_timeout);
    recv_guard.dismiss();
    send_guard.dismiss();
  }
}

/// Sends a departure notice to every peer and waits for theirs, so that every notice is
/// received before the communicators are freed: up to the timeout, or up to
/// `failed_departure_wait` when the communicator was aborted. Returns true when every peer
/// departed. Never throws on its own.
inline bool communicator::depart() {
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
      if (MPI_Isend(body.get(), static_cast<int>(body->wire_bytes()), MPI_BYTE, p, detail::tag_notice, control_.get(),
                    &req) == MPI_SUCCESS) {
        sends.push_back(req);
        bodies.push_back(std::move(body));
      }
    }
  }
  const auto start = clock::now();
  const auto until = aborted_ ? start + std::min(std::chrono::duration_cast<clock::duration>(timeout()),
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

}  // namespace ringzero::mpi
