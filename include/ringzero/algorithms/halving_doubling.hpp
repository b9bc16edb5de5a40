#pragma once
/// @file
/// The `halving_doubling` algorithm over point-to-point transfers (any backend).
///
/// all_reduce is Rabenseifner's algorithm: a recursive-halving reduce-scatter then a
/// recursive-doubling all-gather, 2 log2(p) steps moving 2(p-1)/p of the buffer (for short
/// messages, where steps cost more than bytes, recursive doubling of the whole buffer: log2(p)
/// steps, as MPICH does; the link model decides), with the
/// standard handling of world sizes that are not a power of two (Thakur, Rabenseifner & Gropp,
/// "Optimization of collective communication operations in MPICH", 2005): with p the largest
/// power of two <= n and rem = n - p, the even ranks below 2*rem first hand their whole input to
/// their odd neighbour and receive the whole result at the end. reduce_scatter and all_gather
/// are the halves (the folded ranks exchange only their own block); reduce is the reduce-scatter
/// followed by a gather at the root (Rabenseifner); broadcast is a scatter from the root followed
/// by the all-gather (van de Geijn). all_to_all has no halving-doubling form here.
/// Determinism: fixed combine order per block; identical run to run and on every rank.

#include <cstdint>

#include "ringzero/algorithms/call.hpp"

namespace ringzero::algorithms {

namespace detail {

/// Elements of virtual ranks [g0, g1)'s groups of blocks.
inline range hd_groups(const partition& blocks, const hd_layout& layout, int g0, int g1) {
  return blocks.blocks(static_cast<std::uint64_t>(layout.first_block(g0)),
                       static_cast<std::uint64_t>(layout.first_block(g1)));
}

/// Recursive halving among the p virtual ranks. `current` is what this rank contributes (its raw
/// input, or `acc` after a fold); afterwards `acc` holds the final values of virtual rank v's group.
inline void hd_halving(const call& c, const void* current, void* acc, const partition& blocks, const hd_layout& layout,
                       int v) {
  const primitive::reduce_spec partial = c.spec();
  const primitive::reduce_spec last = c.final_spec();
  const combine_fn combine_partial = c.ops.combine(&partial);
  const combine_fn combine_last = c.ops.combine(&last);
  int lo = 0, hi = layout.p;
  for (int d = layout.p / 2; d >= 1; d /= 2) {
    const int partner = layout.real_rank(v ^ d);
    const int mid = lo + (hi - lo) / 2;
    const bool lower = (v & d) == 0;
    const range keep = lower ? hd_groups(blocks, layout, lo, mid) : hd_groups(blocks, layout, mid, hi);
    const range give = lower ? hd_groups(blocks, layout, mid, hi) : hd_groups(blocks, layout, lo, mid);
    c.t.sendrecv_reduce(c.op, c.at(current, give.begin), c.bytes(give.size()), give.empty() ? -1 : partner,
                        c.at(current, keep.begin), c.at(acc, keep.begin), c.bytes(keep.size()),
                        keep.empty() ? -1 : partner, d == 1 ? combine_last : combine_partial);
    current = acc;
    if (lower)
      hi = mid;
    else
      lo = mid;
  }
}

/// Recursive doubling among the p virtual ranks: from virtual rank v's group in `buffer` to all.
inline void hd_doubling(const call& c, void* buffer, const partition& blocks, const hd_layout& layout, int v) {
  for (int d = 1; d < layout.p; d *= 2) {
    const int partner_v = v ^ d;
    const int mine_lo = v & ~(d - 1), theirs_lo = partner_v & ~(d - 1);
    const range mine = hd_groups(blocks, layout, mine_lo, mine_lo + d);
    const range theirs = hd_groups(blocks, layout, theirs_lo, theirs_lo + d);
    const int partner = layout.real_rank(partner_v);
    c.t.sendrecv(c.op, c.at(static_cast<const void*>(buffer), mine.begin), c.bytes(mine.size()),
                 mine.empty() ? -1 : partner, c.at(buffer, theirs.begin), c.bytes(theirs.size()),
                 theirs.empty() ? -1 : partner);
  }
}

/// Reduce-scatter of `input` (layout `blocks`, one block per rank) into `acc` (same layout):
/// afterwards `acc` block r holds the final block r on rank r.
inline void hd_reduce_scatter_blocks(const call& c, const void* input, void* acc, const partition& blocks) {
  const int r = c.rank();
  const hd_layout layout(c.n());
  const std::uint64_t all = blocks.count;
  const range own = blocks.block(static_cast<std::uint64_t>(r));
  if (r < 2 * layout.rem) {
    if (r % 2 == 0) {  // fold into r+1, then receive the own finished block from it
      c.t.sendrecv(c.op, input, c.bytes(all), r + 1, nullptr, 0, -1);
      if (!own.empty()) c.t.sendrecv(c.op, nullptr, 0, -1, c.at(acc, own.begin), c.bytes(own.size()), r + 1);
      return;
    }
    const primitive::reduce_spec partial = c.spec();
    c.t.sendrecv_reduce(c.op, nullptr, 0, -1, input, acc, c.bytes(all), r - 1, c.ops.combine(&partial));
    hd_halving(c, acc, acc, blocks, layout, layout.virtual_rank(r));
    const range theirs = blocks.block(static_cast<std::uint64_t>(r - 1));
    if (!theirs.empty())
      c.t.sendrecv(c.op, c.at(static_cast<const void*>(acc), theirs.begin), c.bytes(theirs.size()), r - 1, nullptr, 0,
                   -1);
    return;
  }
  hd_halving(c, input, acc, blocks, layout, layout.virtual_rank(r));
}

/// All-gather in place on `buffer` whose block r is rank r's contribution.
inline void hd_all_gather_blocks(const call& c, void* buffer, const partition& blocks) {
  const int r = c.rank();
  const hd_layout layout(c.n());
  const std::uint64_t all = blocks.count;
  if (r < 2 * layout.rem) {
    if (r % 2 == 0) {  // hand the own block to r+1, then receive everything from it
      const range own = blocks.block(static_cast<std::uint64_t>(r));
      if (!own.empty())
        c.t.sendrecv(c.op, c.at(static_cast<const void*>(buffer), own.begin), c.bytes(own.size()), r + 1, nullptr, 0,
                     -1);
      c.t.sendrecv(c.op, nullptr, 0, -1, buffer, c.bytes(all), r + 1);
      return;
    }
    const range theirs = blocks.block(static_cast<std::uint64_t>(r - 1));
    if (!theirs.empty()) c.t.sendrecv(c.op, nullptr, 0, -1, c.at(buffer, theirs.begin), c.bytes(theirs.size()), r - 1);
    hd_doubling(c, buffer, blocks, layout, layout.virtual_rank(r));
    c.t.sendrecv(c.op, buffer, c.bytes(all), r - 1, nullptr, 0, -1);
    return;
  }
  hd_doubling(c, buffer, blocks, layout, layout.virtual_rank(r));
}

}  // namespace detail

/// The alpha-beta-gamma estimate (us) of Rabenseifner's all_reduce of `bytes` on `n` ranks
/// (Thakur, Rabenseifner & Gropp 2005): 2 log2(p) steps moving (p-1)/p of the buffer twice,
/// plus the fold and unfold of the ranks beyond the largest power of two p.
/// `eager` (link_model::eager_bytes; 0: none): each step whose message is larger pays one more
/// alpha (the rendezvous handshake); step k of either half moves S / 2^k, the fold and unfold
/// of the ranks beyond p move S.
constexpr double hd_rabenseifner_us(int n, double bytes, double alpha, double beta, double gamma,
                                    double eager = 0) noexcept {
  const hd_layout layout(n);
  const double p = layout.p, S = bytes;
  double handshakes = 0;
  for (int k = 1; k <= layout.steps(); ++k)
    handshakes += past_eager_limit(eager, S / static_cast<double>(std::uint64_t{1} << k)) ? 2 : 0;
  const double fold_alpha = past_eager_limit(eager, S) ? 2 * alpha : alpha;  // the fold and unfold move S
  return (2 * layout.steps() + handshakes) * alpha + (p - 1) / p * S * (2 * beta + gamma) +
         (layout.rem > 0 ? 2 * fold_alpha + 2 * S * beta + S * gamma : 0.0);
}

/// The estimate (us) of the recursive-doubling all_reduce (same paper, short messages):
/// log2(p) steps, each exchanging and combining the whole buffer, plus the same fold and unfold.
/// `eager` as above: every step moves S, as do the fold and unfold.
constexpr double hd_recursive_doubling_us(int n, double bytes, double alpha, double beta, double gamma,
                                          double eager = 0) noexcept {
  const hd_layout layout(n);
  const double S = bytes;
  const double step_alpha = past_eager_limit(eager, S) ? 2 * alpha : alpha;
  return layout.steps() * (step_alpha + S * (beta + gamma)) +
         (layout.rem > 0 ? 2 * step_alpha + 2 * S * beta + S * gamma : 0.0);
}

/// True when halving_doubling runs an all_reduce of `bytes` on `n` ranks as recursive doubling
/// rather than Rabenseifner's algorithm: when the model under `m` says it is faster (half the
/// steps, twice the bytes: short messages). A pure function of its arguments, so every rank
/// decides alike.
constexpr bool hd_prefers_recursive_doubling(int n, double bytes, const link_model& m) noexcept {
  return hd_recursive_doubling_us(n, bytes, m.alpha_us, m.beta_us_per_byte, m.gamma_us_per_byte, m.eager_bytes) <
         hd_rabenseifner_us(n, bytes, m.alpha_us, m.beta_us_per_byte, m.gamma_us_per_byte, m.eager_bytes);
}

namespace detail {

/// `f` with its operands swapped: dst = received (op) own.
struct swapped_combine {
  combine_fn inner;
  combine_fn fn() const noexcept {
    combine_fn f;
    f.fn = [](const void* context, void* dst, const void* a, const void* b, std::uint64_t count) {
      const combine_fn& g = static_cast<const swapped_combine*>(context)->inner;
      g(dst, b, a, count);
    };
    f.context = this;
    f.element_size = inner.element_size;
    return f;
  }
};

}  // namespace detail

/// Recursive-doubling all_reduce (Thakur, Rabenseifner & Gropp 2005, for short messages): in
/// step d every virtual rank v exchanges its whole partial result with v ^ d and combines, the
/// operand of the lower virtual rank first, so partners compute the same bits and every rank
/// ends with identical results. Ranks beyond the largest power of two fold in and out as in
/// Rabenseifner's algorithm. Partial results alternate between the output and a scratch buffer
/// (a buffer being sent is never written). Preconditions: n >= 2, count > 0.
inline void rd_all_reduce(const call& c) {
  const int r = c.rank();
  const hd_layout layout(c.n());
  const std::uint64_t bytes = c.bytes(c.d.count);
  const void* input = c.scaled_input(c.d.send, c.d.count);
  void* out = c.d.recv;
  if (r < 2 * layout.rem && r % 2 == 0) {  // fold the whole input into r+1; receive the whole result back
    c.t.sendrecv(c.op, input, bytes, r + 1, nullptr, 0, -1);
    c.t.sendrecv(c.op, nullptr, 0, -1, out, bytes, r + 1);
    return;
  }
  void* scratch = c.t.scratch(scratch_accumulator, static_cast<std::size_t>(bytes));
  const void* current = input;
  // The next buffer to write: never the one being sent (`current`).
  auto next_buffer = [&]() -> void* { return current == out ? scratch : out; };
  const primitive::reduce_spec partial = c.spec();
  const primitive::reduce_spec last = c.final_spec();
  const combine_fn combine_partial = c.ops.combine(&partial);
  const combine_fn combine_last = c.ops.combine(&last);
  const detail::swapped_combine partial_swapped{combine_partial}, last_swapped{combine_last};
  if (r < 2 * layout.rem) {  // odd: absorb r-1's input (the lower rank's operand first)
    void* dst = next_buffer();
    c.t.sendrecv_reduce(c.op, nullptr, 0, -1, current, dst, bytes, r - 1, partial_swapped.fn());
    current = dst;
  }
  const int v = layout.virtual_rank(r);
  for (int d = 1; d < layout.p; d *= 2) {
    const int partner_v = v ^ d;
    const bool final_step = d * 2 >= layout.p;
    const combine_fn lower_first = v < partner_v ? (final_step ? combine_last : combine_partial)
                                                 : (final_step ? last_swapped.fn() : partial_swapped.fn());
    void* dst = next_buffer();
    const int partner = layout.real_rank(partner_v);
    c.t.sendrecv_reduce(c.op, current, bytes, partner, current, dst, bytes, partner, lower_first);
    current = dst;
  }
  if (current != out) c.ops.copy(out, current, bytes);
  if (r < 2 * layout.rem) c.t.sendrecv(c.op, out, bytes, r - 1, nullptr, 0, -1);
}

inline void hd_rabenseifner_all_reduce(const call& c);

/// halving_doubling all_reduce: recursive doubling for short messages, Rabenseifner's algorithm
/// otherwise, as the transport's link model says (`hd_prefers_recursive_doubling`).
/// Preconditions: n >= 2, count > 0.
inline void hd_all_reduce(const call& c) {
  if (hd_prefers_recursive_doubling(c.n(), static_cast<double>(c.bytes(c.d.count)), c.t.link()))
    return rd_all_reduce(c);
  hd_rabenseifner_all_reduce(c);
}

/// Rabenseifner's all_reduce: recursive-halving reduce-scatter, then recursive-doubling
/// all-gather. Preconditions: n >= 2, count > 0.
inline void hd_rabenseifner_all_reduce(const call& c) {
  const int r = c.rank();
  const hd_layout layout(c.n());
  const std::uint64_t count = c.d.count;
  const partition blocks = c.blocks_of(count);
  const void* input = c.scaled_input(c.d.send, count);
  void* acc = c.d.recv;
  const void* current = input;
  if (r < 2 * layout.rem) {
    if (r % 2 == 0) {  // fold the whole input into r+1; receive the whole result back
      c.t.sendrecv(c.op, input, c.bytes(count), r + 1, nullptr, 0, -1);
      c.t.sendrecv(c.op, nullptr, 0, -1, acc, c.bytes(count), r + 1);
      return;
    }
    const primitive::reduce_spec partial = c.spec();
    c.t.sendrecv_reduce(c.op, nullptr, 0, -1, input, acc, c.bytes(count), r - 1, c.ops.combine(&partial));
    current = acc;
  }
  const int v = layout.virtual_rank(r);
  detail::hd_halving(c, current, acc, blocks, layout, v);
  detail::hd_doubling(c, acc, blocks, layout, v);
  if (r < 2 * layout.rem) c.t.sendrecv(c.op, acc, c.bytes(count), r - 1, nullptr, 0, -1);
}

/// halving_doubling reduce_scatter: recursive halving over the n blocks of `count` elements.
inline void hd_reduce_scatter(const call& c) {
  const int n = c.n(), r = c.rank();
  const std::uint64_t count = c.d.count;
  const std::uint64_t all = count * static_cast<std::uint64_t>(n);
  const partition blocks(all, n, count);
  const void* input = c.scaled_input(c.d.send, all);
  void* acc = c.t.scratch(scratch_accumulator, static_cast<std::size_t>(c.bytes(all)));
  detail::hd_reduce_scatter_blocks(c, input, acc, blocks);
  c.ops.copy(c.d.recv, c.at(static_cast<const void*>(acc), static_cast<std::uint64_t>(r) * count), c.bytes(count));
}

/// halving_doubling all_gather: recursive doubling over the n blocks of `count` elements.
inline void hd_all_gather(const call& c) {
  const int n = c.n(), r = c.rank();
  const std::uint64_t count = c.d.count;
  c.ops.copy(c.at(c.d.recv, static_cast<std::uint64_t>(r) * count), c.d.send, c.bytes(count));
  detail::hd_all_gather_blocks(c, c.d.recv, partition(count * static_cast<std::uint64_t>(n), n, count));
}

/// halving_doubling reduce: recursive-halving reduce-scatter, then a gather of the finished
/// blocks at the root. Non-root outputs are never touched.
inline void hd_reduce(const call& c) {
  const int n = c.n(), r = c.rank(), root = c.d.root;
  const std::uint64_t count = c.d.count;
  const partition blocks = c.blocks_of(count);
  const void* input = c.scaled_input(c.d.send, count);
  void* acc = r == root ? c.d.recv : c.t.scratch(scratch_accumulator, static_cast<std::size_t>(c.bytes(count)));
  detail::hd_reduce_scatter_blocks(c, input, acc, blocks);
  if (r == root) {
    for (int q = 0; q < n; ++q) {
      const range b = blocks.block(static_cast<std::uint64_t>(q));
      if (q != root && !b.empty()) c.t.sendrecv(c.op, nullptr, 0, -1, c.at(acc, b.begin), c.bytes(b.size()), q);
    }
  } else {
    const range b = blocks.block(static_cast<std::uint64_t>(r));
    if (!b.empty())
      c.t.sendrecv(c.op, c.at(static_cast<const void*>(acc), b.begin), c.bytes(b.size()), root, nullptr, 0, -1);
  }
}

/// halving_doubling broadcast: the root scatters block q to rank q, then a recursive-doubling
/// all-gather (van de Geijn).
inline void hd_broadcast(const call& c) {
  const int n = c.n(), r = c.rank(), root = c.d.root;
  const std::uint64_t count = c.d.count;
  const partition blocks = c.blocks_of(count);
  if (r == root) {
    c.ops.copy(c.d.recv, c.d.send, c.bytes(count));
    for (int q = 0; q < n; ++q) {
      const range b = blocks.block(static_cast<std::uint64_t>(q));
      if (q != root && !b.empty())
        c.t.sendrecv(c.op, c.at(static_cast<const void*>(c.d.recv), b.begin), c.bytes(b.size()), q, nullptr, 0, -1);
    }
  } else {
    const range b = blocks.block(static_cast<std::uint64_t>(r));
    if (!b.empty()) c.t.sendrecv(c.op, nullptr, 0, -1, c.at(c.d.recv, b.begin), c.bytes(b.size()), root);
  }
  detail::hd_all_gather_blocks(c, c.d.recv, blocks);
}

}  // namespace ringzero::algorithms
