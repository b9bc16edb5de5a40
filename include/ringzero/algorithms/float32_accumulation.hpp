#pragma once
/// @file
/// float32 accumulation of float16 and bfloat16 sum, avg and premul_sum (all_reduce,
/// reduce_scatter, reduce on two or more ranks): the result is the float32 reduction rounded
/// once to the 16-bit type, whatever the algorithm or backend (docs/numerics.md).
///
/// `run_in_float32` serves the schedules that move partial results between ranks (ring,
/// halving_doubling) and the backends' native collectives (MPI_Allreduce, ncclAllReduce...):
/// this rank's input is widened into float32 scratch, the same schedule runs in place on a
/// derived float32 descriptor whose buffers are that scratch, and the result is narrowed once
/// into the caller's output. The contract check has already seen the caller's descriptor.
/// `direct` reads its peers' inputs and accumulates its tile in float32 itself (direct.hpp).
/// Cost: the partial results move twice the bytes of the 16-bit type, plus one widening and one
/// narrowing pass (measured in docs/performance.md). A ring all_reduce moves only its partial
/// results in float32: each rank narrows its finished block once and the all-gather moves 16-bit
/// values (`ring_all_reduce_in_float32`: 3/4 of the widened ring's bytes, the same bits). Casts
/// go through `data_ops`, so device memory works too.

#include <cstdint>

#include "ringzero/algorithms/call.hpp"
#include "ringzero/algorithms/ring.hpp"

namespace ringzero::algorithms {

/// True when collective `d` on `world_size` ranks accumulates in float32: a float16 or bfloat16
/// all_reduce, reduce_scatter or reduce with sum, avg or premul_sum, world_size >= 2, count > 0.
/// (A world of one returns its input, or for premul_sum the input times the scalar in float32
/// rounded once: already the float32 result.)
inline bool accumulates_in_float32(const collective_descriptor& d, int world_size) noexcept {
  if (world_size < 2 || d.count == 0 || !is_reduction(d.kind)) return false;
  if (d.type != dtype::float16 && d.type != dtype::bfloat16) return false;
  switch (d.op.kind) {
    case reduce_kind::sum:
    case reduce_kind::avg:
    case reduce_kind::premul_sum: return true;
    case reduce_kind::prod:
    case reduce_kind::min:
    case reduce_kind::max: return false;
  }
  return false;
}

namespace detail {

/// `c.d`'s input widened into float32 scratch (slot scratch_widened), and the in-place float32
/// descriptor over it: the output is the scratch itself (reduce_scatter: NCCL's in-place layout,
/// at rank * count; reduce: none off the root).
inline collective_descriptor widen_input(const call& c) {
  const collective_descriptor& d = c.d;
  constexpr std::uint64_t wide_size = 4;  // bytes of a float32
  const bool scatter = d.kind == collective_kind::reduce_scatter;
  const std::uint64_t in_count = scatter ? d.count * static_cast<std::uint64_t>(c.n()) : d.count;
  const bool writes = d.kind != collective_kind::reduce || c.rank() == d.root;
  auto* wide =
      static_cast<unsigned char*>(c.t.scratch(scratch_widened, static_cast<std::size_t>(in_count * wide_size)));
  c.ops.cast(wide, dtype::float32, d.send, d.type, in_count);
  collective_descriptor w = d;
  w.type = dtype::float32;
  w.send = wide;
  w.recv = writes ? wide + (scatter ? static_cast<std::uint64_t>(c.rank()) * d.count * wide_size : 0) : nullptr;
  w.send_bytes = in_count * wide_size;
  w.recv_bytes = writes ? d.count * wide_size : 0;
  w.in_place = writes;
  return w;
}

}  // namespace detail

/// Runs `c` (for which accumulates_in_float32 holds) as `run(call)` on a float32 copy of its
/// input (detail::widen_input), then narrows the result into `c.d.recv` (on the root only for
/// reduce; other outputs stay untouched). `run` is the schedule or the backend's native
/// collective; it sees an in-place float32 descriptor. Errors: those of `run` and of the scratch
/// pool.
template <class Run>
void run_in_float32(const call& c, Run&& run) {
  const collective_descriptor w = detail::widen_input(c);
  run(call{c.t, c.op, w, c.ops});
  if (w.recv != nullptr) c.ops.cast(c.d.recv, c.d.type, w.recv, dtype::float32, c.d.count);
}

/// The ring all_reduce of `c` (for which accumulates_in_float32 holds): the reduce-scatter runs
/// on a float32 copy of the input (scratch slot scratch_widened), each rank rounds its finished
/// block once into `c.d.recv`, and the all-gather moves those 16-bit values. The result is the
/// bits of `run_in_float32` with the whole ring (every element is the float32 sum rounded once,
/// by its block's owner); the all-gather sends half the bytes. Blocks are the float32
/// partition's, so both phases cover the same elements. Preconditions: n >= 2, count > 0.
inline void ring_all_reduce_in_float32(const call& c) {
  const collective_descriptor& d = c.d;
  const collective_descriptor w = detail::widen_input(c);
  const call wc{c.t, c.op, w, c.ops};
  const partition blocks = wc.blocks_of(d.count);  // float32 blocks: the 16-bit all-gather uses them too
  detail::ring_reduce_scatter_blocks(wc, wc.scaled_input(w.send, d.count), w.recv, blocks);
  const range mine = blocks.block(static_cast<std::uint64_t>(c.rank()));
  if (!mine.empty())
    c.ops.cast(c.at(d.recv, mine.begin), d.type, wc.at(w.recv, mine.begin), dtype::float32, mine.size());
  detail::ring_all_gather_blocks(c, d.recv, blocks);
}

}  // namespace ringzero::algorithms
