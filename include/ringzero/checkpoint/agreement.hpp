#pragma once
/// @file
/// `checkpoint::detail::gather_records` and `agree`: the one small collective a save or a load
/// makes. Every rank contributes a record of the same number of 64-bit words (a status, the
/// checksums of its file, a problem text); an all_gather over the shard communicator, then over
/// the replica communicator of hybrid sharding, gives every rank every rank's record, ordered
/// by global rank (replica rank * shard group size + shard rank). So a failure anywhere is
/// raised on every rank, naming the rank that failed and its reason. A communicator of device
/// memory (NCCL) exchanges the records through one device buffer on its stream.
/// Thread semantics: a collective; the training thread of every rank, in the same order.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ringzero/backend/communicator.hpp"
#include "ringzero/collective/agreement.hpp"
#include "ringzero/collective/all_gather.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"
#include "ringzero/zero/model_agreement.hpp"

namespace ringzero::checkpoint::detail {

/// Words of a record that carry a problem text (at most 8 * 63 - 1 bytes of it).
inline constexpr std::size_t text_words = 64;

/// The tag of the checkpoint layer's collectives (collective_options::tag).
inline constexpr std::uint64_t agreement_tag = 0x636b707400000000ull;  // "ckpt"

/// Every rank's record (each `mine.size()` words, equal on every rank), by global rank.
inline std::vector<std::uint64_t> gather_records(communicator& comm, communicator* replica,
                                                 const std::vector<std::uint64_t>& mine) {
  collective_options o;
  o.tag = agreement_tag;
  const std::size_t n = mine.size();
  std::vector<std::uint64_t> group(n * static_cast<std::size_t>(comm.world_size()));
  if (comm.world_size() == 1)
    group = mine;
  else
    zero::detail::gather_values(comm, mine.data(), group.data(), n, o, nullptr, "checkpoint agreement");
  if (replica == nullptr || replica->world_size() == 1) return group;
  std::vector<std::uint64_t> all(group.size() * static_cast<std::size_t>(replica->world_size()));
  zero::detail::gather_values(*replica, group.data(), all.data(), group.size(), o, nullptr, "checkpoint agreement");
  return all;
}

/// `text` packed into `text_words` words (truncated).
inline void pack_text(const std::string& text, std::uint64_t* words) {
  std::memset(words, 0, text_words * 8);
  const std::size_t n = std::min(text.size(), text_words * 8 - 9);
  words[0] = n;
  std::memcpy(words + 1, text.data(), n);
}

/// The text `pack_text` packed.
inline std::string unpack_text(const std::uint64_t* words) {
  const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(words[0]), text_words * 8 - 9);
  return std::string(reinterpret_cast<const char*>(words + 1), n);
}

/// The verdict of a list of (rank, problem): "" when empty, else the first two named.
inline std::string describe_failures(const std::vector<std::pair<int, std::string>>& failed) {
  std::string s;
  for (std::size_t i = 0; i < failed.size() && i < 2; ++i)
    s += (i ? "; " : "") + std::string("rank ") + std::to_string(failed[i].first) + ": " + failed[i].second;
  if (failed.size() > 2) s += "; and " + std::to_string(failed.size() - 2) + " more rank(s)";
  return s;
}

/// What every rank learns from `agree`: the first failing rank's error code and the failures.
struct verdict {
  errc code = errc::io_error;
  std::string text;  ///< "" when no rank had a problem
};

/// The verdict of gathered records (collective/agreement.hpp's table, one row per rank): field 0
/// is a rank's error code (0: no problem), its problem text packed from field `text_at` on.
inline verdict verdict_of(const ringzero::detail::agreement_table& records, std::size_t text_at) {
  verdict v;
  const std::vector<int> failing = records.ranks_where_not(0, 0);
  if (!failing.empty()) v.code = static_cast<errc>(records.at(static_cast<std::size_t>(failing[0]), 0));
  std::vector<std::pair<int, std::string>> failed;
  for (int r : failing) failed.emplace_back(r, unpack_text(records.row(static_cast<std::size_t>(r)).data() + text_at));
  v.text = describe_failures(failed);
  return v;
}

/// Every rank learns every rank's `problem` ("" for none) and its code; returns the verdict all
/// ranks share.
inline verdict agree(communicator& comm, communicator* replica, const std::string& problem,
                     errc code = errc::io_error) {
  std::vector<std::uint64_t> mine(1 + text_words, 0);
  mine[0] = problem.empty() ? 0 : static_cast<std::uint64_t>(code);
  pack_text(problem, mine.data() + 1);
  return verdict_of(ringzero::detail::agreement_table(gather_records(comm, replica, mine), mine.size()), 1);
}

}  // namespace ringzero::checkpoint::detail
