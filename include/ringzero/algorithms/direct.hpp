#pragma once
/// @file
/// The `direct` algorithm: shared-memory collectives in which each rank reads its peers' buffers
/// in place (local backend only, between `begin` and `end`).
/// The manual: docs/algorithms.md, "Header notes", `ringzero/algorithms/direct.hpp`.

#include <algorithm>
#include <array>
#include <cstdint>

#include "ringzero/algorithms/call.hpp"
#include "ringzero/algorithms/float32_accumulation.hpp"

namespace ringzero::algorithms {

namespace detail {

/// Elements per tile of the direct reductions: 8 KiB, well inside L1 with the inputs streaming.
inline std::uint64_t direct_tile_elements(std::size_t element_size) noexcept {
  return std::max<std::uint64_t>(1, 8192 / element_size);
}

/// The tile of partial results: `elements` of the collective's dtype, or of float32 with a
/// second float32 tile (`widened`) for each input in turn when the collective accumulates in
/// float32.
struct direct_tile {
  void* acc = nullptr;
  void* widened = nullptr;
  std::uint64_t elements = 0;
};

/// The tile for `c`, in the scratch slot scratch_tile.
inline direct_tile make_direct_tile(const call& c) {
  if (!accumulates_in_float32(c.d, c.n())) {
    const std::uint64_t elements = direct_tile_elements(c.element_size());
    return {c.t.scratch(scratch_tile, static_cast<std::size_t>(c.bytes(elements))), nullptr, elements};
  }
  const std::uint64_t elements = direct_tile_elements(sizeof(float));
  auto* p =
      static_cast<unsigned char*>(c.t.scratch(scratch_tile, static_cast<std::size_t>(2 * elements * sizeof(float))));
  return {p, p + elements * sizeof(float), elements};
}

/// direct_fold for a float16 / bfloat16 sum, avg or premul_sum: every input widened into
/// `t.widened` and combined into `t.acc` in float32 (premul_sum: each input times its scalar in
/// float32; avg: the float32 sum divided by n in float32).
template <class InputOf>
void direct_fold_float32(const call& c, const direct_tile& t, std::uint64_t first, std::uint64_t len,
                         InputOf&& input_of) {
  const int n = c.n();
  const bool premul = c.d.op.kind == reduce_kind::premul_sum;
  primitive::reduce_spec s;
  s.type = dtype::float32;
  s.kind = c.d.op.kind;
  s.pre_b = premul;
  const std::int64_t divisor = c.d.op.kind == reduce_kind::avg ? n : 0;
  c.ops.cast(t.acc, dtype::float32, c.at(input_of(0), first), c.d.type, len);
  if (premul) c.ops.scale(t.acc, t.acc, len, dtype::float32, c.t.peer_descriptor(0)->op.scalar);
  for (int q = 1; q < n; ++q) {
    c.ops.cast(t.widened, dtype::float32, c.at(input_of(q), first), c.d.type, len);
    s.scalar_b = c.t.peer_descriptor(q)->op.scalar;
    s.divisor = q == n - 1 ? divisor : 0;
    c.ops.reduce(t.acc, t.acc, t.widened, len, s);
  }
}

/// The `len` finished elements of `t` in the collective's dtype: `t.acc`, or for a float32
/// tile its one rounding into `t.widened` (free once the fold is done), to copy to the outputs.
inline const void* direct_result(const call& c, const direct_tile& t, std::uint64_t len) {
  if (t.widened == nullptr) return t.acc;
  c.ops.cast(t.widened, c.d.type, t.acc, dtype::float32, len);
  return t.widened;
}

/// Reduces elements [first, first + len) of every rank's input (input of rank q starts at
/// `input_of(q)`) into the tile, combining in rank order and finishing with the final spec.
template <class InputOf>
void direct_fold(const call& c, const direct_tile& t, std::uint64_t first, std::uint64_t len, InputOf&& input_of) {
  if (t.widened != nullptr) return direct_fold_float32(c, t, first, len, input_of);
  void* tile = t.acc;
  const int n = c.n();
  primitive::reduce_spec s = c.spec();
  const bool premul = c.d.op.kind == reduce_kind::premul_sum;
  if (premul)
    s.kind = reduce_kind::premul_sum;  // spec() maps premul_sum to sum; here the raw inputs need their scalars
  const std::int64_t divisor = c.d.op.kind == reduce_kind::avg ? n : 0;
  s.pre_a = premul;
  s.pre_b = premul;
  s.scalar_a = c.t.peer_descriptor(0)->op.scalar;
  s.scalar_b = c.t.peer_descriptor(1)->op.scalar;
  s.divisor = n == 2 ? divisor : 0;
  c.ops.reduce(tile, c.at(input_of(0), first), c.at(input_of(1), first), len, s);
  s.pre_a = false;
  for (int q = 2; q < n; ++q) {
    s.scalar_b = c.t.peer_descriptor(q)->op.scalar;
    s.divisor = q == n - 1 ? divisor : 0;
    c.ops.reduce(tile, tile, c.at(input_of(q), first), len, s);
  }
}

/// Counts what a direct collective moves between ranks (transport::count_peer_traffic): a byte
/// that leaves rank a's buffer for rank b's counts as sent by a and received by b, whichever of
/// them copies it, as a network transfer would.
inline void count_direct(const call& c, std::uint64_t sent_elements, std::uint64_t received_elements) noexcept {
  c.t.count_peer_traffic(c.op, c.bytes(sent_elements), c.bytes(received_elements));
}

/// Copies one block of `count` elements from every rank q's send buffer into slot q of this
/// rank's output, starting with its own: all of q's buffer (all_gather), or block r of it, r
/// being this rank (`own_block`, all_to_all).
inline void direct_gather_blocks(const call& c, bool own_block) {
  const int n = c.n(), r = c.rank();
  const std::uint64_t count = c.d.count;
  const bool streaming = c.bytes(count) * static_cast<std::uint64_t>(n) >= primitive::streaming_threshold_bytes;
  count_direct(c, static_cast<std::uint64_t>(n - 1) * count, static_cast<std::uint64_t>(n - 1) * count);
  const std::uint64_t from = own_block ? static_cast<std::uint64_t>(r) * count : 0;
  for (int j = 0; j < n; ++j) {
    const int q = (r + j) % n;
    c.ops.copy(c.at(c.d.recv, static_cast<std::uint64_t>(q) * count), c.at(c.t.peer_descriptor(q)->send, from),
               c.bytes(count), streaming);
  }
  if (streaming) c.ops.fence();
}
}  // namespace detail

/// direct all_reduce. Precondition: n >= 2, count > 0, shared memory (peer_descriptor non-null).
inline void direct_all_reduce(const call& c) {
  const int n = c.n(), r = c.rank();
  const std::uint64_t count = c.d.count;
  const range mine = c.blocks_of(count).block(static_cast<std::uint64_t>(r));
  const bool streaming = c.bytes(count) >= primitive::streaming_threshold_bytes;
  auto input_of = [&](int q) { return c.t.peer_descriptor(q)->send; };
  // Every peer's part of my block comes in and my result goes out to each; the peers do the
  // same with theirs (count - |mine| elements of my input out, of my output in).
  const std::uint64_t peers = static_cast<std::uint64_t>(n - 1), own = mine.end - mine.begin;
  detail::count_direct(c, peers * own + (count - own), peers * own + (count - own));
  // Large plain sums: one fused pass from the inputs straight to every output (no tile).
  constexpr int fused_max_ranks = 16;
  if (streaming && c.d.op.kind == reduce_kind::sum && n <= fused_max_ranks && mine.end > mine.begin &&
      !accumulates_in_float32(c.d, n)) {
    std::array<void*, fused_max_ranks> outs{};
    std::array<const void*, fused_max_ranks> ins{};
    for (int q = 0; q < n; ++q) {
      outs[static_cast<std::size_t>(q)] = c.at(c.t.peer_descriptor((r + q) % n)->recv, mine.begin);
      ins[static_cast<std::size_t>(q)] = c.at(input_of(q), mine.begin);
    }
    if (c.ops.sum_to_all_streaming(outs.data(), n, ins.data(), n, mine.end - mine.begin, c.d.type)) {
      c.ops.fence();
      return;
    }
  }
  const detail::direct_tile tile = detail::make_direct_tile(c);
  for (std::uint64_t first = mine.begin; first < mine.end; first += tile.elements) {
    const std::uint64_t len = std::min(tile.elements, mine.end - first);
    detail::direct_fold(c, tile, first, len, input_of);
    const void* result = detail::direct_result(c, tile, len);
    for (int j = 0; j < n; ++j) {
      const int q = (r + j) % n;
      c.ops.copy(c.at(c.t.peer_descriptor(q)->recv, first), result, c.bytes(len), streaming);
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
  const detail::direct_tile tile = detail::make_direct_tile(c);
  auto input_of = [&](int q) { return c.t.peer_descriptor(q)->send; };
  const std::uint64_t peers = static_cast<std::uint64_t>(c.n() - 1);
  detail::count_direct(c, peers * count, peers * count);  // my block of each peer in, theirs of mine out
  for (std::uint64_t first = 0; first < count; first += tile.elements) {
    const std::uint64_t len = std::min(tile.elements, count - first);
    detail::direct_fold(c, tile, base + first, len, input_of);
    c.ops.copy(c.at(c.d.recv, first), detail::direct_result(c, tile, len), c.bytes(len), streaming);
  }
  if (streaming) c.ops.fence();
}

/// direct reduce: rank r reduces block r of the result and writes it into the root's output;
/// non-root outputs are never touched.
inline void direct_reduce(const call& c) {
  const int r = c.rank();
  const std::uint64_t count = c.d.count;
  const range mine = c.blocks_of(count).block(static_cast<std::uint64_t>(r));
  const bool streaming = c.bytes(count) >= primitive::streaming_threshold_bytes;
  const detail::direct_tile tile = detail::make_direct_tile(c);
  void* root_out = c.t.peer_descriptor(c.d.root)->recv;
  auto input_of = [&](int q) { return c.t.peer_descriptor(q)->send; };
  // My block of every peer's input in, theirs of mine out; my result to the root, the others'
  // into mine at the root.
  const std::uint64_t peers = static_cast<std::uint64_t>(c.n() - 1), own = mine.end - mine.begin;
  const bool root = r == c.d.root;
  detail::count_direct(c, (count - own) + (root ? 0 : own), peers * own + (root ? count - own : 0));
  for (std::uint64_t first = mine.begin; first < mine.end; first += tile.elements) {
    const std::uint64_t len = std::min(tile.elements, mine.end - first);
    detail::direct_fold(c, tile, first, len, input_of);
    c.ops.copy(c.at(root_out, first), detail::direct_result(c, tile, len), c.bytes(len), streaming);
  }
  if (streaming) c.ops.fence();
}

/// direct all_gather: rank r copies every rank's send buffer into its own output.
inline void direct_all_gather(const call& c) { detail::direct_gather_blocks(c, false); }

/// direct broadcast: every rank copies the root's send buffer into its own output.
inline void direct_broadcast(const call& c) {
  const bool streaming = c.bytes(c.d.count) >= primitive::streaming_threshold_bytes;
  const bool root = c.rank() == c.d.root;
  detail::count_direct(c, root ? static_cast<std::uint64_t>(c.n() - 1) * c.d.count : 0, root ? 0 : c.d.count);
  c.ops.copy(c.d.recv, c.t.peer_descriptor(c.d.root)->send, c.bytes(c.d.count), streaming);
  if (streaming) c.ops.fence();
}

/// direct all_to_all: rank r copies block r of every rank's send buffer into slot q of its output.
inline void direct_all_to_all(const call& c) { detail::direct_gather_blocks(c, true); }

}  // namespace ringzero::algorithms
