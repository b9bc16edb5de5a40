#pragma once
/// @file
/// `wire_record`: one rank's collective descriptor as the check mode sends it to its peers, the
/// same fixed-size record on every backend (MPI sends it point to point, NCCL all-gathers it).
/// It carries the fields the contract compares, the reason an invalid call was refused (cut to
/// fit) and, for an MPI point-to-point transfer, what the sender sends to and receives from the
/// addressee. Records are plain bytes in the sender's layout (one ringzero build, one ABI, as
/// MPI_BYTE transfers need); `layout` names the build's record version so that ranks of
/// different builds are refused by name instead of misreading each other. Pure data; any thread.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include "ringzero/backend/descriptor.hpp"

namespace ringzero::detail {

/// The version of `wire_record` this build writes, raised whenever a field is added, moved or
/// reinterpreted (MPI's hello compares it when a communicator is made; every record carries it
/// in `layout`). 5: one record for MPI and NCCL (MPI's were 2-4, NCCL's "RZ" 2-3). 6: MPI's
/// hello carries the link model's eager limit (mpi::detail::hello_record::link[3]).
inline constexpr std::uint32_t wire_format_version = 6;
/// "RZ" and the version: the `layout` word of every record this build writes.
inline constexpr std::uint32_t wire_layout = 0x525A0000u | wire_format_version;

/// See the file comment. 512 bytes; `wire_bytes()` of them carry information.
struct wire_record {
  static constexpr std::size_t max_reason = 440;
  std::uint32_t layout = wire_layout;  ///< `wire_layout` of the writing rank's build
  std::int32_t root = -1;
  std::uint64_t instance = 0;  ///< the communicator's instance id (MPI: drops leftovers of older ones)
  std::uint64_t sequence = 0;
  std::uint64_t count = 0;
  std::uint64_t tag = 0;
  std::uint64_t send_bytes = 0;  ///< point-to-point: bytes the sender sends to the addressee
  std::uint64_t recv_bytes = 0;  ///< point-to-point: bytes the sender expects from the addressee
  std::uint8_t kind = 0;
  std::uint8_t type = 0;
  std::uint8_t op = 0;
  std::uint8_t algo = 0;
  std::uint8_t reproducible = 0;  ///< the reproducible_mode
  std::uint8_t sends = 0;         ///< point-to-point: 1 when it sends to the addressee
  std::uint8_t receives = 0;      ///< point-to-point: 1 when it receives from the addressee
  std::uint8_t pad = 0;
  std::int32_t invalid_code = 0;  ///< the errc that `reason` raises
  std::uint32_t reason_length = 0;
  char reason[max_reason] = {};

  /// Bytes that carry information (the header plus the reason).
  std::size_t wire_bytes() const noexcept { return offsetof(wire_record, reason) + reason_length; }
};
static_assert(sizeof(wire_record) == 512 && std::is_trivially_copyable_v<wire_record>);

/// The record of `d` for communicator instance `instance` (its invalid reason cut to
/// max_reason bytes, ending in "...").
inline wire_record encode(const collective_descriptor& d, std::uint64_t instance) {
  wire_record w;
  w.instance = instance;
  w.sequence = d.sequence;
  w.count = d.count;
  w.tag = d.tag;
  w.root = d.root;
  w.kind = static_cast<std::uint8_t>(d.kind);
  w.type = static_cast<std::uint8_t>(d.type);
  w.op = static_cast<std::uint8_t>(d.op.kind);
  w.algo = static_cast<std::uint8_t>(d.algo);
  w.reproducible = static_cast<std::uint8_t>(d.reproducible);
  w.invalid_code = static_cast<std::int32_t>(d.invalid_code);
  std::string reason = d.invalid;
  if (reason.size() > wire_record::max_reason) reason = reason.substr(0, wire_record::max_reason - 3) + "...";
  w.reason_length = static_cast<std::uint32_t>(reason.size());
  std::memcpy(w.reason, reason.data(), reason.size());
  return w;
}

/// The descriptor a received record describes (buffers unknown: null, sizes zero).
inline collective_descriptor decode(const wire_record& w) {
  collective_descriptor d;
  d.sequence = w.sequence;
  d.count = w.count;
  d.tag = w.tag;
  d.root = w.root;
  d.kind = static_cast<collective_kind>(w.kind);
  d.type = static_cast<dtype>(w.type);
  d.op.kind = static_cast<reduce_kind>(w.op);
  d.algo = static_cast<algorithm>(w.algo);
  d.reproducible = static_cast<reproducible_mode>(w.reproducible);
  d.invalid_code = static_cast<errc>(w.invalid_code);
  d.invalid.assign(w.reason, std::min<std::size_t>(w.reason_length, wire_record::max_reason));
  return d;
}

/// "0x525A0006" for a layout word.
inline std::string layout_text(std::uint32_t layout) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08X", static_cast<unsigned>(layout));
  return text;
}

}  // namespace ringzero::detail
