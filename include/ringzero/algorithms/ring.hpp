#pragma once
/// @file
/// The `ring` algorithm over point-to-point transfers (any backend).
///
/// all_reduce is a ring reduce-scatter followed by a ring all-gather (Patarasuk & Yuan,
/// "Bandwidth optimal all-reduce algorithms for clusters of workstations", 2009): 2(n-1) steps,
/// each rank sends 2(n-1)/n of the buffer, the bandwidth optimum. reduce_scatter and all_gather
/// are the two halves; reduce is a ring reduce-scatter and a gather of the blocks at the root;
/// broadcast is a pipelined chain from the root in slices; all_to_all is the pairwise exchange
/// (step k: send to r+k, receive from r-k). Blocks are the cache-line-granular partition of
/// algorithm/partition.hpp; empty blocks are skipped identically on both sides of a transfer.
/// Determinism: the combine order of each block is fixed by the ring, so results are identical
/// run to run, and every rank receives the same bits.

#include <algorithm>
#include <cstdint>

#include "ringzero/algorithms/call.hpp"

namespace ringzero::algorithms {

/// Bytes per slice of the pipelined ring broadcast.
inline constexpr std::uint64_t ring_broadcast_slice_bytes = 512 * 1024;

namespace detail {

/// Ring reduce-scatter over the blocks `blocks` of `input` into `acc` (same layout as input).
/// Afterwards `acc` holds the final block r on rank r (other blocks hold partial sums).
/// `final_spec` is applied by the combine that completes block r (avg's division).
inline void ring_reduce_scatter_blocks(const call& c, const void* input, void* acc, const partition& blocks) {
  const int n = c.n(), r = c.rank();
  const int next = ring_mod(r + 1, n), prev = ring_mod(r - 1, n);
  const primitive::reduce_spec partial = c.spec();
  const primitive::reduce_spec last = c.final_spec();
  const combine_fn combine_partial = c.ops.combine(&partial);
  const combine_fn combine_last = c.ops.combine(&last);
  for (int k = 0; k < n - 1; ++k) {
    const range sb = blocks.block(static_cast<std::uint64_t>(ring_rs_send_block(r, k, n)));
    const range rb = blocks.block(static_cast<std::uint64_t>(ring_rs_recv_block(r, k, n)));
    const void* send = k == 0 ? c.at(input, sb.begin) : c.at(static_cast<const void*>(acc), sb.begin);
    c.t.sendrecv_reduce(c.op, send, c.bytes(sb.size()), sb.empty() ? -1 : next, c.at(input, rb.begin),
                        c.at(acc, rb.begin), c.bytes(rb.size()), rb.empty() ? -1 : prev,
                        k == n - 2 ? combine_last : combine_partial);
  }
}

/// Ring all-gather in place on `buffer` whose block r is rank r's contribution.
inline void ring_all_gather_blocks(const call& c, void* buffer, const partition& blocks) {
  const int n = c.n(), r = c.rank();
  const int next = ring_mod(r + 1, n), prev = ring_mod(r - 1, n);
  for (int k = 0; k < n - 1; ++k) {
    const range sb = blocks.block(static_cast<std::uint64_t>(ring_ag_send_block(r, k, n)));
    const range rb = blocks.block(static_cast<std::uint64_t>(ring_ag_recv_block(r, k, n)));
    c.t.sendrecv(c.op, c.at(static_cast<const void*>(buffer), sb.begin), c.bytes(sb.size()), sb.empty() ? -1 : next,
                 c.at(buffer, rb.begin), c.bytes(rb.size()), rb.empty() ? -1 : prev);
  }
}

}  // namespace detail

/// ring all_reduce. Preconditions: n >= 2, count > 0.
inline void ring_all_reduce(const call& c) {
  const partition blocks = c.blocks_of(c.d.count);
  const void* input = c.scaled_input(c.d.send, c.d.count);
  detail::ring_reduce_scatter_blocks(c, input, c.d.recv, blocks);
  detail::ring_all_gather_blocks(c, c.d.recv, blocks);
}

/// ring reduce_scatter: block q is elements [q*count, (q+1)*count) of every send buffer.
/// Partial sums live in two scratch blocks; the last step writes the output.
inline void ring_reduce_scatter(const call& c) {
  const int n = c.n(), r = c.rank();
  const int next = ring_mod(r + 1, n), prev = ring_mod(r - 1, n);
  const std::uint64_t count = c.d.count;
  const void* input = c.scaled_input(c.d.send, count * static_cast<std::uint64_t>(n));
  auto* tmp =
      static_cast<unsigned char*>(c.t.scratch(scratch_accumulator, static_cast<std::size_t>(2 * c.bytes(count))));
  void* tmp_half[2] = {tmp, tmp + c.bytes(count)};
  const primitive::reduce_spec partial = c.spec();
  const primitive::reduce_spec last = c.final_spec();
  const combine_fn combine_partial = c.ops.combine(&partial);
  const combine_fn combine_last = c.ops.combine(&last);
  for (int k = 0; k < n - 1; ++k) {
    const std::uint64_t sb = static_cast<std::uint64_t>(ring_rs_send_block(r, k, n));
    const std::uint64_t rb = static_cast<std::uint64_t>(ring_rs_recv_block(r, k, n));
    const void* send = k == 0 ? c.at(input, sb * count) : tmp_half[(k - 1) % 2];
    void* dst = k == n - 2 ? c.d.recv : tmp_half[k % 2];
    c.t.sendrecv_reduce(c.op, send, c.bytes(count), next, c.at(input, rb * count), dst, c.bytes(count), prev,
                        k == n - 2 ? combine_last : combine_partial);
  }
}

/// ring all_gather: own block into the output, then the ring all-gather on the output.
inline void ring_all_gather(const call& c) {
  const std::uint64_t count = c.d.count;
  const int n = c.n(), r = c.rank();
  c.ops.copy(c.at(c.d.recv, static_cast<std::uint64_t>(r) * count), c.d.send, c.bytes(count));
  // The output holds n blocks of exactly `count` elements: a partition with granule `count`.
  detail::ring_all_gather_blocks(c, c.d.recv, partition(count * static_cast<std::uint64_t>(n), n, count));
}

/// ring reduce: ring reduce-scatter into the root's output (scratch elsewhere), then every rank
/// sends its finished block to the root. Non-root outputs are never touched.
inline void ring_reduce(const call& c) {
  const int n = c.n(), r = c.rank(), root = c.d.root;
  const std::uint64_t count = c.d.count;
  const partition blocks = c.blocks_of(count);
  const void* input = c.scaled_input(c.d.send, count);
  void* acc = r == root ? c.d.recv : c.t.scratch(scratch_accumulator, static_cast<std::size_t>(c.bytes(count)));
  detail::ring_reduce_scatter_blocks(c, input, acc, blocks);
  if (r == root) {
    for (int q = 0; q < n; ++q) {
      const range b = blocks.block(static_cast<std::uint64_t>(q));
      if (q == root || b.empty()) continue;
      c.t.sendrecv(c.op, nullptr, 0, -1, c.at(acc, b.begin), c.bytes(b.size()), q);
    }
  } else {
    const range b = blocks.block(static_cast<std::uint64_t>(r));
    if (!b.empty())
      c.t.sendrecv(c.op, c.at(static_cast<const void*>(acc), b.begin), c.bytes(b.size()), root, nullptr, 0, -1);
  }
}

/// ring broadcast: a chain root -> root+1 -> ... in slices of ring_broadcast_slice_bytes, each
/// rank forwarding slice s while the next slices are still arriving (pipelining).
inline void ring_broadcast(const call& c) {
  const int n = c.n(), r = c.rank(), root = c.d.root;
  const int position = ring_mod(r - root, n);
  const int next = ring_mod(r + 1, n), prev = ring_mod(r - 1, n);
  const std::uint64_t total = c.bytes(c.d.count);
  if (r == root) c.ops.copy(c.d.recv, c.d.send, total);
  const std::uint64_t slice = ring_broadcast_slice_bytes;
  auto* out = static_cast<unsigned char*>(c.d.recv);
  for (std::uint64_t offset = 0; offset < total; offset += slice) {
    const std::uint64_t len = std::min(slice, total - offset);
    if (position > 0) c.t.sendrecv(c.op, nullptr, 0, -1, out + offset, len, prev);
    if (position < n - 1) c.t.sendrecv(c.op, out + offset, len, next, nullptr, 0, -1);
  }
}

/// ring (pairwise-exchange) all_to_all: step k sends block r+k and receives from rank r-k.
inline void ring_all_to_all(const call& c) {
  const int n = c.n(), r = c.rank();
  const std::uint64_t count = c.d.count;
  c.ops.copy(c.at(c.d.recv, static_cast<std::uint64_t>(r) * count),
             c.at(c.d.send, static_cast<std::uint64_t>(r) * count), c.bytes(count));
  for (int k = 1; k < n; ++k) {
    const int to = ring_mod(r + k, n), from = ring_mod(r - k, n);
    c.t.sendrecv(c.op, c.at(c.d.send, static_cast<std::uint64_t>(to) * count), c.bytes(count), to,
                 c.at(c.d.recv, static_cast<std::uint64_t>(from) * count), c.bytes(count), from);
  }
}

/// Dissemination barrier (Hensgen, Finkel & Manber 1988): in round k every rank exchanges an
/// empty message with ranks r + 2^k and r - 2^k; after ceil(log2 n) rounds every rank has heard,
/// directly or not, from every other. Used for barrier by the point-to-point algorithms.
inline void dissemination_barrier(const call& c) {
  const int n = c.n(), r = c.rank();
  for (int step = 1; step < n; step *= 2)
    c.t.sendrecv(c.op, nullptr, 0, ring_mod(r + step, n), nullptr, 0, ring_mod(r - step, n));
}

}  // namespace ringzero::algorithms
