#pragma once
/// @file
/// How ringzero's errors describe ranks, values, timeouts and operations ("ranks 1-3: 5120",
/// "all_reduce #7", "3 float32 (12 bytes)"): one text for every backend (local, MPI, NCCL) and
/// for the cross-rank checks of ddp/ and zero/, so that the same failure reads the same
/// everywhere. Pure functions of their arguments; any thread.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "ringzero/backend/descriptor.hpp"
#include "ringzero/core/dtype.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::detail {

/// "rank 3", "ranks 1-3", "ranks 0, 2, 5-7" for a sorted list of ranks.
inline std::string describe_ranks(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i != 0) s.append(", ");
    s.append(std::to_string(ranks[i]));
    if (j > i) s.append("-").append(std::to_string(ranks[j]));
    i = j + 1;
  }
  return s;
}

/// The ranks grouped by value (`value_of_rank[r]` is rank r's), each group's ranks ascending,
/// groups ordered by their first rank.
inline std::vector<std::pair<std::string, std::vector<int>>> group_ranks(
    const std::vector<std::string>& value_of_rank) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(value_of_rank.size()); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == value_of_rank[static_cast<std::size_t>(r)]; });
    if (it == groups.end())
      groups.push_back({value_of_rank[static_cast<std::size_t>(r)], {r}});
    else
      it->second.push_back(r);
  }
  return groups;
}

/// Groups ranks by value: "rank 0: 2560; ranks 1-3: 5120", groups ordered by their first rank.
inline std::string describe_values(const std::vector<std::string>& value_of_rank) {
  std::string s;
  for (const auto& g : group_ranks(value_of_rank)) {
    if (!s.empty()) s += "; ";
    s += describe_ranks(g.second) + ": " + g.first;
  }
  return s;
}

/// "[0x7f.., +4096 B)" for a byte range.
inline std::string describe_range(const void* p, std::uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "[%p, +%llu B)", p, static_cast<unsigned long long>(bytes));
  return buf;
}

/// A timeout in seconds as errors print it ("%g": "300", "0.25").
inline std::string seconds_text(std::chrono::duration<double> timeout) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", timeout.count());
  return buf;
}

/// Operation `kind` with sequence number `sequence` as errors name it: "all_reduce #7", or
/// "send" (point-to-point operations carry no sequence number).
inline std::string operation_name(collective_kind kind, std::uint64_t sequence) {
  std::string s(collective_name(kind));
  if (kind != collective_kind::send && kind != collective_kind::recv) s += " #" + std::to_string(sequence);
  return s;
}

/// The operation `d` as errors name it (as above), or "a transfer" when there is none (nullptr).
inline std::string operation_name(const collective_descriptor* d) {
  return d ? operation_name(d->kind, d->sequence) : std::string("a transfer");
}

/// "3 float32 (12 bytes)" for `bytes` bytes of `type` (the bytes alone when they do not divide).
inline std::string amount_text(std::uint64_t bytes, std::uint8_t type) {
  const auto t = static_cast<dtype>(type);
  const std::size_t es = is_valid(t) ? dtype_size(t) : 0;
  if (es == 0 || bytes % es != 0) return std::to_string(bytes) + " bytes";
  return std::to_string(bytes / es) + " " + std::string(dtype_name(t)) + " (" + std::to_string(bytes) + " bytes)";
}

/// Raises errc::invalid_argument within `op` through `t.raise` (any ringzero transport) unless
/// `peer` is -1 (no peer) or a rank of `t`: "cannot <what> rank 5: outside [0, 4)".
template <class Transport>
void check_peer(const Transport& t, const collective_descriptor& op, int peer, const char* what) {
  if (peer < -1 || peer >= t.world_size())
    t.raise(&op, errc::invalid_argument,
            std::string("cannot ") + what + " rank " + std::to_string(peer) + ": outside [0, " +
                std::to_string(t.world_size()) + ")");
}

}  // namespace ringzero::detail
