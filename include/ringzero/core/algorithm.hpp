#pragma once
/// @file
/// `algorithm`: which schedule a collective runs, as a value (chosen per call, by
/// `RINGZERO_ALGO`, or by the cost model in collective/selection.hpp), and `collective_kind`.

#include <cstdint>
#include <optional>
#include <string_view>

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
constexpr std::string_view algorithm_name(algorithm a) noexcept {
  switch (a) {
    case algorithm::automatic: return "auto";
    case algorithm::ring: return "ring";
    case algorithm::direct: return "direct";
    case algorithm::halving_doubling: return "halving_doubling";
    case algorithm::native: return "native";
  }
  return "invalid";
}

/// Parses `algorithm_name` output (case-sensitive; also "hd", "rhd" and "automatic");
/// std::nullopt when unknown.
constexpr std::optional<algorithm> parse_algorithm(std::string_view s) noexcept {
  for (algorithm a :
       {algorithm::automatic, algorithm::ring, algorithm::direct, algorithm::halving_doubling, algorithm::native})
    if (s == algorithm_name(a)) return a;
  if (s == "automatic") return algorithm::automatic;
  if (s == "hd" || s == "rhd") return algorithm::halving_doubling;
  return std::nullopt;
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
constexpr std::string_view collective_name(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::all_reduce: return "all_reduce";
    case collective_kind::reduce_scatter: return "reduce_scatter";
    case collective_kind::all_gather: return "all_gather";
    case collective_kind::broadcast: return "broadcast";
    case collective_kind::reduce: return "reduce";
    case collective_kind::all_to_all: return "all_to_all";
    case collective_kind::barrier: return "barrier";
    case collective_kind::send: return "send";
    case collective_kind::recv: return "recv";
  }
  return "invalid";
}

/// Parses `collective_name` output (also "allreduce", "alltoall" etc. without underscores);
/// std::nullopt when unknown.
constexpr std::optional<collective_kind> parse_collective(std::string_view s) noexcept {
  for (int i = 0; i < collective_kind_count; ++i) {
    const auto k = static_cast<collective_kind>(i);
    if (s == collective_name(k)) return k;
  }
  if (s == "allreduce") return collective_kind::all_reduce;
  if (s == "reducescatter") return collective_kind::reduce_scatter;
  if (s == "allgather") return collective_kind::all_gather;
  if (s == "alltoall") return collective_kind::all_to_all;
  return std::nullopt;
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
