#pragma once
/// @file
/// What MPI ranks send each other besides data and the check mode's records (those are every
/// backend's `wire_record`, backend/protocol/wire_record.hpp): the notices of the control
/// channel (`notice`: a rank aborted the communicator, or left it), the hello record exchanged
/// when a communicator is made, and the tag layout of data messages.
///
/// Records are plain bytes in the sender's layout: all ranks of a job must share one ABI
/// (the same build of ringzero on machines of the same architecture), as MPI_BYTE transfers do.
/// Notices and records carry the communicator's instance id (chosen by rank 0 when it is
/// made): a message left over from a destroyed communicator whose MPI context was reused is
/// recognised and dropped instead of being taken for the new communicator's.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace ringzero::mpi::detail {

// ---------------------------------------------------------------- tags

/// Tags of the control communicator.
enum control_tag : int {
  tag_notice = 1,      ///< an abort or departure notice (probed for while waiting)
  tag_descriptor = 2,  ///< a check-mode record (ringzero::detail::wire_record)
  tag_sync = 3,        ///< a synchronisation message (split)
};

/// Data-message tags encode (class, remaining): class = collective sequence mod 63, or 63 for
/// point-to-point send/recv; remaining = slices of the same transfer that follow this one,
/// capped at 511. 64 * 512 - 1 = 32767 = the smallest MPI_TAG_UB the standard allows.
/// A receiver checks both: another class means the ranks are not in the same collective;
/// another `remaining` (or byte count) means the transfer sizes differ.
inline constexpr int tag_classes = 64;
inline constexpr int point_to_point_class = 63;
inline constexpr int tag_remaining_cap = 511;

/// The data tag of a slice of class `cls` followed by `remaining` more slices.
constexpr int data_tag(int cls, std::uint64_t remaining) noexcept {
  return cls * (tag_remaining_cap + 1) + static_cast<int>(std::min<std::uint64_t>(remaining, tag_remaining_cap));
}
/// The class of a data tag.
constexpr int tag_class(int tag) noexcept { return tag / (tag_remaining_cap + 1); }
/// The `remaining` field of a data tag.
constexpr int tag_remaining(int tag) noexcept { return tag % (tag_remaining_cap + 1); }

// ---------------------------------------------------------------- control notices

/// What a notice announces.
enum class notice_kind : std::uint32_t {
  abort = 1,   ///< the sender aborted the communicator; `code` and `text` say why
  depart = 2,  ///< the sender destroyed its communicator; the counts say what it had exchanged
};

/// A control-channel message. `data_sent` / `data_received` count the data slices the sender
/// had sent to / received from the addressee, `records_sent` its check-mode descriptors sent to
/// it: a rank waiting for message k from a departed peer knows it will never come when the
/// peer sent fewer than k.
struct notice {
  static constexpr std::size_t max_text = 1024;
  std::uint64_t instance = 0;
  notice_kind kind = notice_kind::abort;
  std::int32_t code = 0;  ///< an errc value (abort)
  std::uint64_t data_sent = 0;
  std::uint64_t data_received = 0;
  std::uint64_t records_sent = 0;
  std::uint32_t unwinding = 0;  ///< depart: 1 when the communicator was destroyed by an exception
  std::uint32_t text_length = 0;
  char text[max_text] = {};

  std::size_t wire_bytes() const noexcept { return offsetof(notice, text) + text_length; }
  void set_text(const std::string& s) {
    const std::size_t n = std::min(s.size(), max_text);
    std::memcpy(text, s.data(), n);
    text_length = static_cast<std::uint32_t>(n);
  }
  std::string get_text() const { return std::string(text, std::min<std::size_t>(text_length, max_text)); }
};

// ---------------------------------------------------------------- hello

/// What every rank states when a communicator is made; ranks must agree on all of it.
struct hello_record {
  std::uint64_t instance = 0;  ///< rank 0's becomes the communicator's instance id
  std::uint32_t version = 0;
  std::uint32_t check = 0;
  std::uint64_t slice_bytes = 0;
  std::int32_t pipeline_depth = 0;
  std::int32_t forced_algorithm = 0;
  std::int32_t oversubscribed = 0;  ///< this rank's node runs more processes than processors
  std::int32_t wire_format = 0;     ///< ringzero::detail::wire_format_version of the rank's build
  double link[4] = {0, 0, 0, 0};    ///< alpha, beta, gamma, eager bytes of the link model (as given; 0: default)
  double link_gbps = 0;             ///< the paced link's Gb/s (communicator_options::link_gbps; 0: none)
  std::uint32_t malformed_environment = 0;  ///< 1: a RINGZERO_* variable was refused on this rank
  std::uint32_t tuning = 0;                 ///< the tuning table's fingerprint (tuning_table::fingerprint; 0: none)
};

}  // namespace ringzero::mpi::detail
