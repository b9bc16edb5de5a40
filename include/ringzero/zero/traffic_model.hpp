#pragma once
/// @file
/// Per-step communication of a ZeRO plan by collective (`zero::traffic_entry`) and the ZeRO
/// paper's communication-volume model (`zero::paper_communication_volume`).
///
/// Definitions (the paper's, section 7, and nccl-tests'):
/// - The *size* S of a collective is the element count of its full buffer: the per-rank count of
///   an all_reduce, the whole (world_size * per-rank count) buffer of a reduce_scatter or
///   all_gather.
/// - Its *volume* is the data each rank moves in the paper's accounting, which ignores the
///   (n-1)/n factor: S for a reduce_scatter or an all_gather, 2S for an all_reduce (a
///   reduce_scatter followed by an all_gather).
/// - The bytes a rank really *sends* with the bandwidth-optimal ring algorithm are
///   volume * (n-1)/n (Patarasuk & Yuan 2009).
/// The paper's per-step volume for Psi parameters: 2 Psi at stages 0, 1 and 2 (an all_reduce, or
/// a reduce_scatter of gradients plus an all_gather of parameters), 3 Psi at stage 3 (an
/// all_gather before forward, another before backward, a reduce_scatter of gradients).

#include <cstdint>
#include <string>
#include <string_view>

#include "ringzero/core/algorithm.hpp"
#include "ringzero/core/enum_names.hpp"
#include "ringzero/zero/quantization.hpp"

namespace ringzero::zero {

/// The paper's per-step communication volume of one rank, in parameter elements:
/// 2 psi for stages 0-2, 3 psi for stage 3. Pure.
constexpr double paper_communication_volume(double psi, int stage) noexcept { return (stage >= 3 ? 3.0 : 2.0) * psi; }

/// Which ranks take part in a collective of a plan.
enum class rank_group : std::uint8_t {
  world = 0,    ///< every rank (stage 0's all_reduce)
  shard = 1,    ///< the ranks of one replica group, which together hold one copy of the state
  replica = 2,  ///< the ranks holding the same shard in different replica groups (hybrid sharding)
};

/// "world", "shard group" or "replica group".
inline constexpr enum_names<rank_group, 3> rank_group_names{"world", "shard group", "replica group"};
/// The name of `g` (`rank_group_names`).
constexpr std::string_view rank_group_name(rank_group g) noexcept { return rank_group_names(g); }

/// One kind of collective a plan issues per optimizer step, summed over its calls. The volumes
/// below are unchecked; a `shard_plan` refuses any request for which its entries' calls,
/// elements, bytes or volumes would overflow 64 bits, so for a plan's entries they are exact.
struct traffic_entry {
  /// all_reduce, reduce_scatter or all_gather; all_to_all for quantized gradients (each rank
  /// sends every other rank its quantized segment, the owner adds them up).
  collective_kind collective = collective_kind::all_reduce;
  rank_group group = rank_group::shard;  ///< which ranks take part
  int ranks = 1;                         ///< ranks in that group
  std::string purpose;                   ///< e.g. "gradients", "parameters before forward"
  std::uint64_t calls = 0;               ///< collectives per step (per buffer and micro-batch)
  std::uint64_t elements = 0;            ///< sum of their sizes S in elements (see the file comment)
  std::uint64_t bytes = 0;               ///< the same in bytes, as sent (quantized: the segments' bytes)
  /// The bytes without quantization (equal to `bytes` when `quantized` is none).
  std::uint64_t unquantized_bytes = 0;
  /// The width the entry's collectives send (zero/quantization.hpp; none: the element type).
  quantized_bits quantized = quantized_bits::none;

  /// The paper's volume in elements: 2S for all_reduce, S otherwise.
  constexpr std::uint64_t volume_elements() const noexcept {
    return collective == collective_kind::all_reduce ? 2 * elements : elements;
  }
  /// The paper's volume in bytes.
  constexpr std::uint64_t volume_bytes() const noexcept {
    return collective == collective_kind::all_reduce ? 2 * bytes : bytes;
  }
  /// Bytes one rank sends with the ring algorithm: volume * (ranks-1)/ranks (0 for one rank).
  constexpr double ring_bytes_sent() const noexcept {
    return ranks <= 1 ? 0.0 : static_cast<double>(volume_bytes()) * (ranks - 1) / ranks;
  }
};

}  // namespace ringzero::zero
