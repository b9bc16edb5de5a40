#pragma once
/// @file
/// The transport state machine of `mpi::communicator`: the polling loop, and sliced,
/// pipelined point-to-point transfers whose tags carry the sequence class and the number of
/// slices that follow, checked on arrival (docs/mpi.md).
///
/// Out-of-line members of `mpi::communicator`: backend/mpi/communicator.hpp includes this
/// header after the class; it includes that header back only so that it compiles on its own.

#include <algorithm>
#include <cstdint>
#include <string>

#include "ringzero/backend/mpi/communicator.hpp"

namespace ringzero::mpi {

/// Calls `step` until it returns done. Between idle steps: backs off; every 32 idle steps
/// receives control notices (throwing the abort's error), asks `stalled` whether a departed
/// peer makes completion impossible (a non-empty reason throws errc::peer_exited), and checks
/// the deadline (`on_timeout` must not return).
template <class Step, class Stalled, class OnTimeout>
void communicator::poll(const collective_descriptor* op, Step&& step, Stalled&& stalled, clock::time_point until,
                        OnTimeout&& on_timeout) {
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
      if (aborted_) raise(op, abort_code_, "the communicator was aborted: " + abort_reason_);
      std::string why = stalled();
      if (!why.empty()) fail(op, errc::peer_exited, why);
      const auto now = clock::now();
      if (now >= until) on_timeout();
      phase = phase_after(now - idle_since);
    }
    backoff(phase);
    ++idle;
  }
}

/// One sliced, pipelined transfer in flight: this rank's send of `send_bytes` to `to` and
/// receive of `recv_bytes` from `from` (either may be absent: rank < 0), each cut into slices of
/// the communicator's `slice_bytes` whose tags carry the sequence class and the number of slices
/// still to come. Its run loop has four parts: `post` (the first window of receives and sends),
/// `progress` (one round: receives matched and checked, combined when reducing, sends
/// completed, the next slices posted), `stalled` / `timed_out` (why it cannot finish), and
/// `complete`. `communicator::transfer` drives it through `poll`.
///
/// No receive is ever posted with room for less than a sender may send (a slice is at most
/// `slice_bytes`): Open MPI 4.1 writes the whole of a truncated rendezvous message past the
/// posted count (seen with the shared-memory single-copy path), so a size mismatch must be
/// found before the data lands. Combining receives post full-slice staging buffers; plain
/// receives post full slices into the output, and a shorter final slice is matched with
/// MPI_Improbe, checked, and only then received (MPI_Imrecv). Destroyed before `complete` (an
/// exception left the wait), it abandons its requests (`request_guard`).
class communicator::transfer_op {
 public:
  /// A transfer of operation `d` (combine == nullptr: receive into `recv`; else receive into
  /// staging, then `acc = own (op) received` slice by slice). Nothing is posted yet.
  transfer_op(communicator& c, const collective_descriptor& d, const void* send, std::uint64_t send_bytes, int to,
              void* recv, std::uint64_t recv_bytes, int from, const void* own, void* acc, const combine_fn* combine)
      : c_(c),
        d_(d),
        send_(static_cast<const unsigned char*>(send)),
        recv_(static_cast<unsigned char*>(recv)),
        own_(static_cast<const unsigned char*>(own)),
        acc_(static_cast<unsigned char*>(acc)),
        combine_(combine),
        send_bytes_(send_bytes),
        recv_bytes_(recv_bytes),
        to_(to),
        from_(from),
        slice_(c.slice_bytes_),
        cls_(tag_class_of(d)),
        S_(to >= 0 ? detail::slice_count(send_bytes, slice_) : 0),
        R_(from >= 0 ? detail::slice_count(recv_bytes, slice_) : 0),
        recv_window_(combine != nullptr ? static_cast<std::uint64_t>(c.pipeline_depth_) : transfer_window),
        send_window_(transfer_window),
        // Plain receives whose last slice is short match it by probing (see above).
        probe_tail_(combine == nullptr && R_ > 0 && slice_len(recv_bytes, R_ - 1) < slice_),
        posted_slices_(probe_tail_ ? R_ - 1 : R_),
        recv_base_(from >= 0 ? c.data_received_[static_cast<std::size_t>(from)] : 0),
        send_base_(to >= 0 ? c.data_sent_[static_cast<std::size_t>(to)] : 0),
        stage_(combine != nullptr && R_ > 0
                   ? static_cast<unsigned char*>(c.staging().get(
                         staging_receive, static_cast<std::size_t>(std::min(R_, recv_window_) * slice_)))
                   : nullptr),
        sized_(size_requests()),
        recv_guard_(c, c.recv_requests_, combine != nullptr),
        send_guard_(c, c.send_requests_) {}

  /// Posts the first window of receives and sends.
  void post() {
    auto lock = c_.mpi_lock();
    while (posted_recv_ < posted_slices_ && posted_recv_ < recv_window_) post_recv(posted_recv_++);
    while (posted_send_ < S_ && posted_send_ < send_window_) post_send(posted_send_++);
  }

  /// One round of the run loop: done when every slice arrived and left.
  step_result progress() {
    const bool received = progress_receives();
    const bool sent = progress_sends();
    if (done_recv_ == R_ && done_send_ == S_) return step_result::done;
    return received || sent ? step_result::progressed : step_result::idle;
  }

  /// Why the transfer can never complete (a peer departed before sending or receiving what it
  /// still owes), or empty.
  std::string stalled() const {
    if (from_ >= 0 && done_recv_ < R_) {
      const auto& peer = c_.peers_[static_cast<std::size_t>(from_)];
      if (peer.departed && peer.data_sent_to_me < recv_base_ + done_recv_ + 1)
        return c_.departed_text(from_) + " without sending the data this rank waits for in " +
               ringzero::detail::operation_name(&d_);
    }
    if (to_ >= 0 && done_send_ < S_) {
      const auto& peer = c_.peers_[static_cast<std::size_t>(to_)];
      if (peer.departed && peer.data_received_from_me < send_base_ + done_send_ + 1)
        return c_.departed_text(to_) + " without receiving the data this rank sends it in " +
               ringzero::detail::operation_name(&d_);
    }
    return {};
  }

  /// Raises the timeout, naming the slices that did not arrive or leave and the peers.
  [[noreturn]] void timed_out() const {
    std::string what;
    std::vector<int> peers;
    if (from_ >= 0 && done_recv_ < R_) {
      what += "the receive of " + std::to_string(recv_bytes_) + " bytes from rank " + std::to_string(from_) + " (" +
              std::to_string(done_recv_) + " of " + std::to_string(R_) + " slices arrived)";
      peers.push_back(from_);
    }
    if (to_ >= 0 && done_send_ < S_) {
      if (!what.empty()) what += " and ";
      what += "the send of " + std::to_string(send_bytes_) + " bytes to rank " + std::to_string(to_) + " (" +
              std::to_string(done_send_) + " of " + std::to_string(S_) + " slices delivered)";
      if (to_ != from_) peers.push_back(to_);
    }
    std::sort(peers.begin(), peers.end());
    // Without the check a rank waits only for its neighbours in the schedule: the rank named
    // may itself be waiting for the one that never arrived.
    c_.timed_out(&d_,
                 "timed out after " + ringzero::detail::seconds_text(c_.timeout()) + " s in " +
                     ringzero::detail::operation_name(&d_) + " waiting for " + ringzero::detail::describe_ranks(peers) +
                     ": " + what + " did not complete" +
                     (c_.check_ ? std::string()
                                : std::string(" (that rank may itself wait for another; RINGZERO_CHECK=1 names the "
                                              "ranks that never started the collective)")));
  }

  /// Ends a transfer whose every request completed: nothing is left to abandon.
  void complete() noexcept {
    recv_guard_.dismiss();
    send_guard_.dismiss();
  }

 private:
  /// Makes room for one window of requests each way (before the guards watch them).
  bool size_requests() {
    c_.recv_requests_.assign(static_cast<std::size_t>(std::min(R_, recv_window_)), MPI_REQUEST_NULL);
    c_.send_requests_.assign(static_cast<std::size_t>(std::min(S_, send_window_)), MPI_REQUEST_NULL);
    return true;
  }
  std::uint64_t slice_len(std::uint64_t total, std::uint64_t j) const noexcept {
    return std::min(slice_, total - std::min(total, j * slice_));
  }
  void post_recv(std::uint64_t j) {
    const std::size_t slot = static_cast<std::size_t>(j % recv_window_);
    // Every posted receive has room for a whole slice: full slices of the output, or staging.
    void* dst =
        combine_ != nullptr ? static_cast<void*>(stage_ + slot * slice_) : static_cast<void*>(recv_ + j * slice_);
    c_.check(&d_,
             MPI_Irecv(dst, static_cast<int>(slice_), MPI_BYTE, from_, MPI_ANY_TAG, c_.data_.get(),
                       &c_.recv_requests_[slot]),
             "MPI_Irecv");
  }
  void post_send(std::uint64_t i) {
    const std::size_t slot = static_cast<std::size_t>(i % send_window_);
    c_.check(&d_,
             MPI_Isend(send_ + i * slice_, static_cast<int>(slice_len(send_bytes_, i)), MPI_BYTE, to_,
                       detail::data_tag(cls_, S_ - 1 - i), c_.data_.get(), &c_.send_requests_[slot]),
             "MPI_Isend");
    ++c_.data_sent_[static_cast<std::size_t>(to_)];
  }
  /// Matches the short last slice of a plain receive once every earlier slice arrived: checks
  /// its tag and size from the probe, then receives it into the output. False: not there yet.
  bool match_tail() {
    const std::uint64_t j = R_ - 1;
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    {
      auto lock = c_.mpi_lock();
      c_.check(&d_, MPI_Improbe(from_, MPI_ANY_TAG, c_.data_.get(), &flag, &message, &status), "MPI_Improbe");
    }
    if (!flag) return false;
    if (!slice_matches(status, cls_, j, R_, slice_len(recv_bytes_, j))) {
      // Take the message off the wire into memory of its own size, then report it.
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      std::vector<unsigned char> sink(static_cast<std::size_t>(std::max(count, 1)));
      {
        auto lock = c_.mpi_lock();
        MPI_Mrecv(sink.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE);
      }
      c_.verify_slice(d_, status, from_, cls_, recv_bytes_, j, R_, slice_len(recv_bytes_, j));
    }
    auto lock = c_.mpi_lock();
    c_.check(&d_,
             MPI_Imrecv(recv_ + j * slice_, static_cast<int>(slice_len(recv_bytes_, j)), MPI_BYTE, &message,
                        &c_.recv_requests_[static_cast<std::size_t>(j % recv_window_)]),
             "MPI_Imrecv");
    return true;
  }
  /// Completes the receives that arrived, in order: checks each slice's tag and size, combines
  /// it when reducing, posts the next. True when any completed.
  bool progress_receives() {
    bool progressed = false;
    while (done_recv_ < R_) {
      if (probe_tail_ && done_recv_ == R_ - 1 && !tail_matched_) {
        if (!match_tail()) break;
        tail_matched_ = true;
        progressed = true;
      }
      const std::size_t slot = static_cast<std::size_t>(done_recv_ % recv_window_);
      int flag = 0;
      MPI_Status status;
      status.MPI_TAG = -1;
      int rc;
      {
        auto lock = c_.mpi_lock();
        rc = MPI_Test(&c_.recv_requests_[slot], &flag, &status);
      }
      if (rc != MPI_SUCCESS) c_.receive_failed(d_, rc, status, from_, cls_, recv_bytes_, done_recv_, R_);
      if (!flag) break;
      if (!(probe_tail_ && done_recv_ == R_ - 1))  // the probed tail was checked before it was received
        c_.verify_slice(d_, status, from_, cls_, recv_bytes_, done_recv_, R_, slice_len(recv_bytes_, done_recv_));
      ++c_.data_received_[static_cast<std::size_t>(from_)];
      if (combine_ != nullptr) {
        const std::uint64_t len = slice_len(recv_bytes_, done_recv_);
        const std::uint64_t off = done_recv_ * slice_;
        if (len != 0) (*combine_)(acc_ + off, own_ + off, stage_ + slot * slice_, len / combine_->element_size);
      }
      ++done_recv_;
      if (posted_recv_ < posted_slices_) {
        auto lock = c_.mpi_lock();
        post_recv(posted_recv_++);
      }
      progressed = true;
    }
    return progressed;
  }
  /// Completes the sends that left, in order, and posts the next. True when any completed.
  bool progress_sends() {
    bool progressed = false;
    while (done_send_ < S_) {
      const std::size_t slot = static_cast<std::size_t>(done_send_ % send_window_);
      int flag = 0;
      int rc;
      {
        auto lock = c_.mpi_lock();
        rc = MPI_Test(&c_.send_requests_[slot], &flag, MPI_STATUS_IGNORE);
      }
      if (rc != MPI_SUCCESS) c_.check(&d_, rc, "MPI_Test (send)");
      if (!flag) break;
      ++done_send_;
      if (posted_send_ < S_) {
        auto lock = c_.mpi_lock();
        post_send(posted_send_++);
      }
      progressed = true;
    }
    return progressed;
  }

  communicator& c_;
  const collective_descriptor& d_;
  const unsigned char* send_;
  unsigned char* recv_;
  const unsigned char* own_;
  unsigned char* acc_;
  const combine_fn* combine_;
  std::uint64_t send_bytes_, recv_bytes_;
  int to_, from_;
  std::uint64_t slice_;
  int cls_;
  std::uint64_t S_, R_;  ///< slices to send and to receive
  std::uint64_t recv_window_, send_window_;
  bool probe_tail_;
  std::uint64_t posted_slices_;          ///< receives posted ahead (all but a probed tail)
  std::uint64_t recv_base_, send_base_;  ///< data messages exchanged with the peers before this transfer
  unsigned char* stage_;                 ///< a combining receive's staging (full slices)
  bool sized_;                           ///< the request vectors have one window each (set before the guards)
  request_guard recv_guard_, send_guard_;
  std::uint64_t posted_recv_ = 0, done_recv_ = 0, posted_send_ = 0, done_send_ = 0;
  bool tail_matched_ = false;
};

/// The body of sendrecv (combine == nullptr: receive into `recv`) and sendrecv_reduce
/// (receive into staging, then `acc = own (op) received` slice by slice): checks the peers,
/// then runs one `transfer_op` to completion.
inline void communicator::transfer(const collective_descriptor& d, const void* send, std::uint64_t send_bytes, int to,
                                   void* recv, std::uint64_t recv_bytes, int from, const void* own, void* acc,
                                   const combine_fn* combine) {
  ringzero::detail::check_peer(*this, d, to, "send to");
  ringzero::detail::check_peer(*this, d, from, "receive from");
  if (aborted_) raise(&d, abort_code_, "the communicator was aborted: " + abort_reason_);
  if (to < 0 && from < 0) return;
  transfer_op t(*this, d, send, send_bytes, to, recv, recv_bytes, from, own, acc, combine);
  t.post();
  poll(
      &d, [&] { return t.progress(); }, [&] { return t.stalled(); }, deadline(), [&] { t.timed_out(); });
  t.complete();
}

/// A receive failed inside MPI: a truncation (the sender sent more) is a size mismatch,
/// unless the message belongs to another collective altogether.
[[noreturn]] inline void communicator::receive_failed(const collective_descriptor& d, int rc, const MPI_Status& status,
                                                      int from, int cls, std::uint64_t expected,
                                                      std::uint64_t slice_index, std::uint64_t slices) {
  if (detail::error_class(rc) == MPI_ERR_TRUNCATE) {
    if (status.MPI_TAG >= 0 && detail::tag_class(status.MPI_TAG) != cls)
      class_mismatch(d, from, detail::tag_class(status.MPI_TAG), cls);
    fail(&d, errc::size_mismatch,
         "rank " + std::to_string(from) + " sends more than the " + std::to_string(expected) + " bytes rank " +
             std::to_string(rank()) + " expects in " + ringzero::detail::operation_name(&d) +
             (slices > 1 ? " (at slice " + std::to_string(slice_index) + ")" : ""));
  }
  fail(&d, errc::backend_failure,
       "MPI_Irecv from rank " + std::to_string(from) + " failed: " + detail::error_string(rc));
}

/// Rank `from` sent a message of tag class `got` while this rank expects class `want`.
[[noreturn]] inline void communicator::class_mismatch(const collective_descriptor& d, int from, int got, int want) {
  auto side = [](int c) {
    return c == detail::point_to_point_class ? std::string("a point-to-point send/recv")
                                             : "a collective with sequence number = " + std::to_string(c) + " (mod 63)";
  };
  fail(
      &d, errc::contract_mismatch,
      "rank " + std::to_string(from) + " sent data of " + side(got) + " while rank " + std::to_string(rank()) +
          " runs " + ringzero::detail::operation_name(&d) + " (" + side(want) +
          "): the ranks do not run the same collectives in the same order (RINGZERO_CHECK=1 finds where they diverge)");
}

/// True when a message with `status` is slice `j` of `slices` of `len` bytes, class `cls`.
inline bool communicator::slice_matches(const MPI_Status& status, int cls, std::uint64_t j, std::uint64_t slices,
                                        std::uint64_t len) {
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  return detail::tag_class(status.MPI_TAG) == cls && static_cast<std::uint64_t>(count) == len &&
         detail::tag_remaining(status.MPI_TAG) == detail::tag_remaining(detail::data_tag(0, slices - 1 - j));
}

/// Checks that slice `j` of `slices` (expected `len` bytes) is what the sender meant.
inline void communicator::verify_slice(const collective_descriptor& d, const MPI_Status& status, int from, int cls,
                                       std::uint64_t expected_total, std::uint64_t j, std::uint64_t slices,
                                       std::uint64_t len) {
  const int got_class = detail::tag_class(status.MPI_TAG);
  if (got_class != cls) class_mismatch(d, from, got_class, cls);
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  const std::uint64_t got = static_cast<std::uint64_t>(count);
  const int got_remaining = detail::tag_remaining(status.MPI_TAG);
  const int want_remaining = detail::tag_remaining(detail::data_tag(0, slices - 1 - j));
  if (got == len && got_remaining == want_remaining) return;
  std::string sizes;
  if (j == 0 && got_remaining == 0)
    sizes = "rank " + std::to_string(from) + " sends " + std::to_string(got) + " bytes but rank " +
            std::to_string(rank()) + " expects " + std::to_string(expected_total) + " bytes";
  else
    sizes = "rank " + std::to_string(from) + " sends " +
            (got_remaining > want_remaining || (got_remaining == want_remaining && got > len) ? "more" : "fewer") +
            " than the " + std::to_string(expected_total) + " bytes rank " + std::to_string(rank()) + " expects";
  fail(&d, errc::size_mismatch, sizes + " in " + ringzero::detail::operation_name(&d));
}

}  // namespace ringzero::mpi
