#pragma once
/// @file
/// The `direct` algorithm: shared-memory collectives in which each rank reads its peers' buffers
/// in place (local backend only, between `begin` and `end`).
///
/// all_reduce, reduce_scatter and reduce split the result into n blocks; rank r reduces block r
/// from every input, one cache-resident tile at a time, and writes the tile to every output that
/// needs it, so each input byte is read once and each output byte written once: the minimum
/// memory traffic of the collective (2 S per rank for an all_reduce of S bytes). all_gather,
/// broadcast and all_to_all pull: each rank copies what it needs from its peers into its own
/// output. Large outputs are written with streaming stores; a large all_reduce with op sum of
/// float32 or float64 skips the tile altogether (primitive/sum_broadcast.hpp: the inputs are
/// summed in registers and streamed to every output in one pass, the same bits but for which
/// payload a sum of two NaNs keeps).
/// Determinism: inputs are combined in rank order 0..n-1, so results are identical run to run
/// and bitwise identical on every rank.

#include <algorithm>
#include <array>
#include <cstdint>

#include "ringzero/algorithm/call.hpp"

namespace ringzero::algorithms {

namespace detail {

/// Elements per tile of the direct reductions: 8 KiB, well inside L1 with the inputs streaming.
inline std::uint64_t direct_tile_elements(std::size_t element_size) noexcept {
  return std::max<std::uint64_t>(1, 8192 / element_size);
}

/// Reduces elements [first, first + len) of every rank's input (input of rank q starts at
/// `input_of(q)`) into `tile`, combining in rank order and finishing with the final spec.
template <class InputOf>
void direct_fold(const call& c, void* tile, std::uint64_t first, std::uint64_t len, InputOf&& input_of) {
  const int n = c.n();
  primitive::reduce_spec s = c.spec();
  const bool premul = c.d.op.kind == reduce_kind::premul_sum;
  if (premul) s.kind = reduce_kind::premul_sum;  // spec() maps premul_sum to sum; here the raw inputs need their scalars
  const std::int64_t divisor = c.d.op.kind == reduce_kind::avg ? n : 0;
  s.pre_a = premul;
  s.pre_b = premul;
  s.scalar_a = c.comm.peer_descriptor(0)->op.scalar;
  s.scalar_b = c.comm.peer_descriptor(1)->op.scalar;
  s.divisor = n == 2 ? divisor : 0;
  c.ops.reduce(tile, c.at(input_of(0), first), c.at(input_of(1), first), len, s);
  s.pre_a = false;
  for (int q = 2; q < n; ++q) {
    s.scalar_b = c.comm.peer_descriptor(q)->op.scalar;
    s.divisor = q == n - 1 ? divisor : 0;
    c.ops.reduce(tile, tile, c.at(input_of(q), first), len, s);
  }
}

}  // namespace detail

/// direct all_reduce. Precondition: n >= 2, count > 0, shared memory (peer_descriptor non-null).
inline void direct_all_reduce(const call& c) {
  const int n = c.n(), r = c.rank();
  const std::uint64_t count = c.d.count;
  const range mine = c.blocks_of(count).block(static_cast<std::uint64_t>(r));
  const bool streaming = c.bytes(count) >= primitive::streaming_threshold_bytes;
  auto input_of = [&](int q) { return c.comm.peer_descriptor(q)->send; };
  // Large plain sums: one fused pass from the inputs straight to every output (no tile).
  constexpr int fused_max_ranks = 16;
  if (streaming && c.d.op.kind == reduce_kind::sum && n <= fused_max_ranks && mine.end > mine.begin) {
    std::array<void*, fused_max_ranks> outs{};
    std::array<const void*, fused_max_ranks> ins{};
    for (int q = 0; q < n; ++q) {
      outs[static_cast<std::size_t>(q)] = c.at(c.comm.peer_descriptor((r + q) % n)->recv, mine.begin);
      ins[static_cast<std::size_t>(q)] = c.at(input_of(q), mine.begin);
    }
    if (c.ops.sum_to_all_streaming(outs.data(), n, ins.data(), n, mine.end - mine.begin, c.d.type)) {
      c.ops.fence();
      return;
    }
  }
  const std::uint64_t tile_elems = detail::direct_tile_elements(c.element_size());
  void* tile = c.comm.scratch(scratch_tile, static_cast<std::size_t>(c.bytes(tile_elems)));
  for (std::uint64_t first = mine.begin; first < mine.end; first += tile_elems) {
    const std::uint64_t len = std::min(tile_elems, mine.end - first);
    detail::direct_fold(c, tile, first, len, input_of);
    for (int j = 0; j < n; ++j) {
      const int q = (r + j) % n;
      c.ops.copy(c.at(c.comm.peer_descriptor(q)->recv, first), tile, c.bytes(len), streaming);
    }
  }
  if (streaming) c.ops.fence();
}

/// direct reduce_scatter: rank r reduces block r (count elements at r*count of every send buffer).
inline void direct_reduce_scatter(const call& c) {
  const int r = c.rank();
  const std::uint64_t count = c.d.count;
  const std::uint64_t base = static_cast<std::uint64_t>(r) * count;
  const bool streaming = c.bytes(count) >= primitive::streaming_threshold_bytes;
  const std::uint64_t tile_elems = detail::direct_tile_elements(c.element_size());
  void* tile = c.comm.scratch(scratch_tile, static_cast<std::size_t>(c.bytes(tile_elems)));
  auto input_of = [&](int q) { return c.comm.peer_descriptor(q)->send; };
  for (std::uint64_t first = 0; first < count; first += tile_elems) {
    const std::uint64_t len = std::min(tile_elems, count - first);
    detail::direct_fold(c, tile, base + first, len, input_of);
    c.ops.copy(c.at(c.d.recv, first), tile, c.bytes(len), streaming);
  }
  if (streaming) c.ops.fence();
}

/// direct reduce: rank r reduces block r of the result and writes it into the root's output;
/// non-root outputs are never touched (case C9).
inline void direct_reduce(const call& c) {
  const int r = c.rank();
  const std::uint64_t count = c.d.count;
  const range mine = c.blocks_of(count).block(static_cast<std::uint64_t>(r));
  const bool streaming = c.bytes(count) >= primitive::streaming_threshold_bytes;
  const std::uint64_t tile_elems = detail::direct_tile_elements(c.element_size());
  void* tile = c.comm.scratch(scratch_tile, static_cast<std::size_t>(c.bytes(tile_elems)));
  void* root_out = c.comm.peer_descriptor(c.d.root)->recv;
  auto input_of = [&](int q) { return c.comm.peer_descriptor(q)->send; };
  for (std::uint64_t first = mine.begin; first < mine.end; first += tile_elems) {
    const std::uint64_t len = std::min(tile_elems, mine.end - first);
    detail::direct_fold(c, tile, first, len, input_of);
    c.ops.copy(c.at(root_out, first), tile, c.bytes(len), streaming);
  }
  if (streaming) c.ops.fence();
}

/// direct all_gather: rank r copies every rank's send buffer into its own output.
inline void direct_all_gather(const call& c) {
  const int n = c.n(), r = c.rank();
  const std::uint64_t count = c.d.count;
  const bool streaming = c.bytes(count) * static_cast<std::uint64_t>(n) >= primitive::streaming_threshold_bytes;
  for (int j = 0; j < n; ++j) {
    const int q = (r + j) % n;
    c.ops.copy(c.at(c.d.recv, static_cast<std::uint64_t>(q) * count), c.comm.peer_descriptor(q)->send, c.bytes(count),
               streaming);
  }
  if (streaming) c.ops.fence();
}

/// direct broadcast: every rank copies the root's send buffer into its own output.
inline void direct_broadcast(const call& c) {
  const bool streaming = c.bytes(c.d.count) >= primitive::streaming_threshold_bytes;
  c.ops.copy(c.d.recv, c.comm.peer_descriptor(c.d.root)->send, c.bytes(c.d.count), streaming);
  if (streaming) c.ops.fence();
}

/// direct all_to_all: rank r copies block r of every rank's send buffer into slot q of its output.
inline void direct_all_to_all(const call& c) {
  const int n = c.n(), r = c.rank();
  const std::uint64_t count = c.d.count;
  const bool streaming = c.bytes(count) * static_cast<std::uint64_t>(n) >= primitive::streaming_threshold_bytes;
  for (int j = 0; j < n; ++j) {
    const int q = (r + j) % n;
    c.ops.copy(c.at(c.d.recv, static_cast<std::uint64_t>(q) * count),
               c.at(c.comm.peer_descriptor(q)->send, static_cast<std::uint64_t>(r) * count), c.bytes(count), streaming);
  }
  if (streaming) c.ops.fence();
}

}  // namespace ringzero::algorithms
