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

/// The body of sendrecv (combine == nullptr: receive into `recv`) and sendrecv_reduce
/// (receive into staging, then `acc = own (op) received` slice by slice).
///
/// No receive is ever posted with room for less than a sender may send (a slice is at most
/// `slice_bytes`): Open MPI 4.1 writes the whole of a truncated rendezvous message past the
/// posted count (seen with the shared-memory single-copy path), so a size mismatch must be
/// found before the data lands. Combining receives post full-slice staging buffers; plain
/// receives post full slices into the output, and a shorter final slice is matched with
/// MPI_Improbe, checked, and only then received (MPI_Imrecv).
inline void communicator::transfer(const collective_descriptor& d, const void* send, std::uint64_t send_bytes, int to,
                                   void* recv, std::uint64_t recv_bytes, int from, const void* own, void* acc,
                                   const combine_fn* combine) {
  ringzero::detail::check_peer(*this, d, to, "send to");
  ringzero::detail::check_peer(*this, d, from, "receive from");
  if (aborted_) raise(&d, abort_code_, "the communicator was aborted: " + abort_reason_);
  if (to < 0 && from < 0) return;
  const std::uint64_t slice = slice_bytes_;
  const int cls = tag_class_of(d);
  const bool reducing = combine != nullptr;
  const std::uint64_t S = to >= 0 ? detail::slice_count(send_bytes, slice) : 0;
  const std::uint64_t R = from >= 0 ? detail::slice_count(recv_bytes, slice) : 0;
  const std::uint64_t recv_window = reducing ? static_cast<std::uint64_t>(pipeline_depth_) : transfer_window;
  const std::uint64_t send_window = transfer_window;
  auto slice_len = [&](std::uint64_t total, std::uint64_t j) {
    return std::min(slice, total - std::min(total, j * slice));
  };
  // Plain receives whose last slice is short match it by probing (see above).
  const bool probe_tail = !reducing && R > 0 && slice_len(recv_bytes, R - 1) < slice;
  const std::uint64_t posted_slices = probe_tail ? R - 1 : R;
  unsigned char* stage = nullptr;
  if (reducing && R > 0)
    stage = static_cast<unsigned char*>(
        staging().get(staging_receive, static_cast<std::size_t>(std::min(R, recv_window) * slice)));

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
    void* dst = reducing ? static_cast<void*>(stage + slot * slice)
                         : static_cast<void*>(static_cast<unsigned char*>(recv) + j * slice);
    check(&d, MPI_Irecv(dst, static_cast<int>(slice), MPI_BYTE, from, MPI_ANY_TAG, data_.get(), &recv_requests_[slot]),
          "MPI_Irecv");
  };
  auto post_send = [&](std::uint64_t i) {
    const std::size_t slot = static_cast<std::size_t>(i % send_window);
    check(&d,
          MPI_Isend(static_cast<const unsigned char*>(send) + i * slice, static_cast<int>(slice_len(send_bytes, i)),
                    MPI_BYTE, to, detail::data_tag(cls, S - 1 - i), data_.get(), &send_requests_[slot]),
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
      check(&d, MPI_Improbe(from, MPI_ANY_TAG, data_.get(), &flag, &message, &status), "MPI_Improbe");
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
      verify_slice(d, status, from, cls, recv_bytes, j, R, slice_len(recv_bytes, j));
    }
    auto lock = mpi_lock();
    check(&d,
          MPI_Imrecv(static_cast<unsigned char*>(recv) + j * slice, static_cast<int>(slice_len(recv_bytes, j)),
                     MPI_BYTE, &message, &recv_requests_[static_cast<std::size_t>(j % recv_window)]),
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
      if (rc != MPI_SUCCESS) receive_failed(d, rc, status, from, cls, recv_bytes, done_recv, R);
      if (!flag) break;
      if (!(probe_tail && done_recv == R - 1))  // the probed tail was checked before it was received
        verify_slice(d, status, from, cls, recv_bytes, done_recv, R, slice_len(recv_bytes, done_recv));
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
      if (rc != MPI_SUCCESS) check(&d, rc, "MPI_Test (send)");
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
        return departed_text(from) + " without sending the data this rank waits for in " +
               ringzero::detail::operation_name(&d);
    }
    if (to >= 0 && done_send < S) {
      const auto& peer = peers_[static_cast<std::size_t>(to)];
      if (peer.departed && peer.data_received_from_me < send_base + done_send + 1)
        return departed_text(to) + " without receiving the data this rank sends it in " +
               ringzero::detail::operation_name(&d);
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
    timed_out(
        &d, "timed out after " + ringzero::detail::seconds_text(timeout()) + " s in " +
                ringzero::detail::operation_name(&d) + " waiting for " + ringzero::detail::describe_ranks(peers) +
                ": " + what + " did not complete" +
                (check_ ? std::string()
                        : std::string(" (that rank may itself wait for another; RINGZERO_CHECK=1 names the ranks that "
                                      "never started the collective)")));
  };
  poll(&d, step, stalled, deadline(), on_timeout);
  recv_guard.dismiss();
  send_guard.dismiss();
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
