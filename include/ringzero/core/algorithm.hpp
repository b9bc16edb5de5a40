#pragma once
/// @file
/// `algorithm`: which schedule a collective runs, as a value (chosen per call, by
/// `RINGZERO_ALGO`, or by the cost model in collective/selection.hpp), and `collective_kind`.

#include <cstdint>
#include <optional>
#include <string_view>

#include "ringzero/core/enum_names.hpp"

namespace ringzero {

/// A collective's schedule. `automatic` asks the cost model (collective/selection.hpp).
/// - `ring`: bandwidth-optimal ring over point-to-point transfers (Patarasuk & Yuan 2009);
///   all_reduce is a ring reduce-scatter then a ring all-gather; broadcast a pipelined chain.
/// - `direct`: every rank reads its peers' buffers in place (local backend only, zero-copy);
///   each rank reduces one block of the result and writes it to every output.
/// - `halving_doubling`: recursive halving reduce-scatter and recursive doubling all-gather
///   (Rabenseifner; Thakur, Rabenseifner & Gropp 2005), with their handling of world sizes that
///   are not powers of two. broadcast is scatter + recursive-doubling all-gather (van de Geijn);
///   reduce is recursive-halving reduce-scatter + gather (Rabenseifner).
/// - `native`: the backend's own collective (MPI_Allreduce, ncclAllReduce), where it has one.
/// The numbering is stable (exchanged between ranks for the contract check).
enum class algorithm : std::uint8_t { automatic = 0, ring = 1, direct = 2, halving_doubling = 3, native = 4 };

/// Name used by `RINGZERO_ALGO`, `--algo` and in messages: "auto", "ring", "direct",
/// "halving_doubling", "native".
inline constexpr enum_names<algorithm, 5> algorithm_names{"auto", "ring", "direct", "halving_doubling", "native"};
/// The name of `a` (`algorithm_names`).
constexpr std::string_view algorithm_name(algorithm a) noexcept { return algorithm_names(a); }

/// Parses `algorithm_name` output (case-sensitive; also "hd", "rhd" and "automatic");
/// std::nullopt when unknown.
constexpr std::optional<algorithm> parse_algorithm(std::string_view s) noexcept {
  if (s == "automatic") return algorithm::automatic;
  if (s == "hd" || s == "rhd") return algorithm::halving_doubling;
  return algorithm_names.parse(s);
}

/// Which collective (or point-to-point operation). Stable numbering.
enum class collective_kind : std::uint8_t {
  all_reduce = 0,
  reduce_scatter = 1,
  all_gather = 2,
  broadcast = 3,
  reduce = 4,
  all_to_all = 5,
  barrier = 6,
  send = 7,
  recv = 8,
};

/// Number of `collective_kind` enumerators.
inline constexpr int collective_kind_count = 9;

/// The collective's name as in NCCL without the prefix: "all_reduce", "reduce_scatter", ...
inline constexpr enum_names<collective_kind, collective_kind_count> collective_names{
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "barrier", "send", "recv"};
/// The name of `k` (`collective_names`).
constexpr std::string_view collective_name(collective_kind k) noexcept { return collective_names(k); }

/// Parses `collective_name` output (also "allreduce", "alltoall" etc. without underscores);
/// std::nullopt when unknown.
constexpr std::optional<collective_kind> parse_collective(std::string_view s) noexcept {
  if (s == "allreduce") return collective_kind::all_reduce;
  if (s == "reducescatter") return collective_kind::reduce_scatter;
  if (s == "allgather") return collective_kind::all_gather;
  if (s == "alltoall") return collective_kind::all_to_all;
  return collective_names.parse(s);
}

/// True when ringzero has algorithm `a`'s schedule for collective `k` on some backend (whether a
/// backend runs it is `transport::supports`): every algorithm has every collective but the
/// point-to-point send and recv, except halving_doubling, which has no all_to_all. `automatic`
/// implements everything (it resolves to one). Kept here, apart from the algorithms, so that
/// light headers (the tuning table) can check a choice; algorithms/algorithm_table.hpp checks at
/// compile time that its descriptors say the same.
constexpr bool algorithm_implements(algorithm a, collective_kind k) noexcept {
  if (a == algorithm::automatic) return true;
  if (k == collective_kind::send || k == collective_kind::recv) return false;
  return !(a == algorithm::halving_doubling && k == collective_kind::all_to_all);
}

/// True for the collectives that combine values with a `reduce_op`.
constexpr bool is_reduction(collective_kind k) noexcept {
  return k == collective_kind::all_reduce || k == collective_kind::reduce_scatter || k == collective_kind::reduce;
}

/// True for the collectives that take a root rank.
constexpr bool has_root(collective_kind k) noexcept {
  return k == collective_kind::broadcast || k == collective_kind::reduce;
}

}  // namespace ringzero
