#pragma once
/// @file
/// The check mode's contract exchange, written once for the backends whose ranks do not share
/// memory (MPI, NCCL): every rank encodes its descriptor of a collective as a `wire_record`, the
/// backend's byte exchange gives every rank every rank's record, and every rank judges the same
/// records the same way (the build's record layout, ranks out of step, sequence numbers, then
/// `check_contract`), so all of them raise the same error or none does (docs/mpi.md, docs/gpu.md).
/// Pure functions apart from the byte exchange; the caller's thread.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/backend/contract.hpp"
#include "ringzero/backend/descriptor.hpp"
#include "ringzero/backend/protocol/failure_text.hpp"
#include "ringzero/backend/protocol/wire_record.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::detail {

/// A failed exchange: what to raise, and whether the communicator must be aborted first (the
/// ranks are out of step: a peer runs a point-to-point transfer where this rank runs a
/// collective, and would otherwise wait for data that never comes).
struct contract_verdict {
  errc code = errc::contract_mismatch;
  std::string message;
  bool abort = false;
};

/// Judges rank `me`'s descriptor `d` against `records` (records[r]: rank r's record, as the
/// byte exchange delivered it; records[me] is not read) and leaves the decoded descriptors in
/// `decoded` (decoded[me] untouched). std::nullopt when the collective may run.
inline std::optional<contract_verdict> judge_records(int me, const collective_descriptor& d,
                                                     const std::vector<wire_record>& records,
                                                     std::vector<collective_descriptor>& decoded) {
  const int n = static_cast<int>(records.size());
  for (int p = 0; p < n; ++p) {
    const std::uint32_t layout = records[static_cast<std::size_t>(p)].layout;
    if (p != me && layout != wire_layout)
      return contract_verdict{errc::contract_mismatch,
                              "rank " + std::to_string(p) + " writes contract records of layout " +
                                  layout_text(layout) + " (this rank: " + layout_text(wire_layout) +
                                  "): the ranks run different ringzero builds; rebuild every rank from one version",
                              false};
  }
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    const auto kind = static_cast<collective_kind>(records[static_cast<std::size_t>(p)].kind);
    if (kind == collective_kind::send || kind == collective_kind::recv)
      return contract_verdict{errc::contract_mismatch,
                              "rank " + std::to_string(p) + " runs a point-to-point send/recv with rank " +
                                  std::to_string(me) + " while rank " + std::to_string(me) + " runs " +
                                  operation_name(&d) + ": the ranks do not run the same operations in the same order",
                              true};
  }
  decoded.resize(records.size());
  for (int p = 0; p < n; ++p)
    if (p != me) decoded[static_cast<std::size_t>(p)] = decode(records[static_cast<std::size_t>(p)]);
  auto get = [&](int r) -> const collective_descriptor& { return r == me ? d : decoded[static_cast<std::size_t>(r)]; };
  bool same_sequence = true;
  for (int p = 0; p < n; ++p) same_sequence = same_sequence && get(p).sequence == d.sequence;
  if (!same_sequence) {
    std::vector<std::string> values;
    // Appended, not `"#" + std::to_string(...)`: that spelling draws GCC 12's -Wrestrict
    // false positive (GCC bug 105329) into every program that includes this header.
    for (int p = 0; p < n; ++p) values.push_back(std::string(1, '#').append(std::to_string(get(p).sequence)));
    return contract_verdict{
        errc::contract_mismatch,
        "sequence number mismatch (a rank issued collectives that others did not): " + describe_values(values), false};
  }
  if (auto violation = check_contract(n, get, false, d.tag_name))
    return contract_verdict{violation->code, std::move(violation->message), false};
  return std::nullopt;
}

/// The whole exchange for rank `me` of `n`: records[me] = encode(d, instance), then
/// `all_gather(records)` (the backend's byte exchange; it fills every other rank's record and
/// raises its own errors: timeouts, departed peers), then `judge_records`. `records` and
/// `decoded` are the caller's, reused between calls.
template <class AllGather>
std::optional<contract_verdict> exchange_contract(int n, int me, const collective_descriptor& d, std::uint64_t instance,
                                                  std::vector<wire_record>& records,
                                                  std::vector<collective_descriptor>& decoded, AllGather&& all_gather) {
  records.resize(static_cast<std::size_t>(n));
  records[static_cast<std::size_t>(me)] = encode(d, instance);
  all_gather(records);
  return judge_records(me, d, records, decoded);
}

}  // namespace ringzero::detail
