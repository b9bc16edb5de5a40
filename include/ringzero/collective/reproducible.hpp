#pragma once
/// @file
/// Running a reduction in reproducible mode (docs/numerics.md; the format is
/// primitive/reproducible_sum.hpp). `direct` fuses everything per tile: the max top bin over
/// every rank's input, the truncated words summed in int64, the conversion, the writes (plain
/// float32 inputs: one loop per block, primitive::reproducible_sum_f32). Every
/// other algorithm runs two schedules inside the same collective (one begin/end, one sequence
/// number, so their transfers match in issue order on every backend): an all_reduce (max) of
/// the per-element top bins, then the collective's own schedule (sum, int64) of the truncated
/// words, both on derived descriptors over communicator scratch, then the conversion into recv.
/// Accumulator collectives also sum the contribution counts (a one-element all_reduce).
/// Host memory only (describe.hpp refuses device memory).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ringzero/algorithms/call.hpp"
#include "ringzero/primitive/reproducible_arrays.hpp"
#include "ringzero/primitive/reproducible_sum.hpp"

namespace ringzero::detail {

/// One rank's contributions to a reproducible reduction: its input (scaled by premul_sum's
/// scalar) or its accumulator.
struct reproducible_source {
  const collective_descriptor* d = nullptr;
  const algorithms::data_ops* ops = nullptr;
  void* scaled = nullptr;  ///< premul_sum: room for `len` scaled elements

  /// tops[i] = max(tops[i], top bin of element first + i), i < len.
  void fold_tops(std::uint8_t* tops, std::uint64_t first, std::uint64_t len) const {
    if (d->binned != nullptr) return primitive::fold_accumulator_tops(*d->binned, tops, first, len);
    primitive::fold_top_bins(tops, values(first, len), len, d->type);
  }
  /// words[i*w..] += the words of element first + i at global top bin tops[i], i < len.
  void add_words(std::int64_t* words, const std::uint8_t* tops, std::uint64_t first, std::uint64_t len) const {
    if (d->binned != nullptr) return primitive::add_accumulator_words(*d->binned, words, tops, first, len);
    primitive::add_truncated_words(words, values(first, len), tops, len, d->type);
  }
  /// Contributions deposited by this rank.
  std::uint64_t contributions() const noexcept { return d->binned != nullptr ? d->binned->contributions : 1; }

 private:
  const void* values(std::uint64_t first, std::uint64_t len) const {
    const void* p = static_cast<const unsigned char*>(d->send) + first * dtype_size(d->type);
    if (d->op.kind != reduce_kind::premul_sum) return p;
    ops->scale(scaled, p, len, d->type, d->op.scalar);
    return scaled;
  }
};

/// "the reproducible sum would combine N contributions, more than 2^26" when `total` is too
/// many, else "".
inline std::string reproducible_headroom(std::uint64_t total) {
  if (total <= primitive::reproducible_max_contributions) return {};
  return "the reproducible sum would combine " + std::to_string(total) +
         " contributions over all ranks, more than its limit of 2^26 = " +
         std::to_string(primitive::reproducible_max_contributions);
}

/// The divisor of the final conversion: the total contributions for avg, else 1.
inline std::uint64_t reproducible_divisor(const collective_descriptor& d, std::uint64_t total) noexcept {
  return d.op.kind == reduce_kind::avg ? total : 1;
}

/// Elements of the send side of `d` (count, or count * n for reduce_scatter).
inline std::uint64_t reproducible_elements(const collective_descriptor& d, int n) noexcept {
  return d.kind == collective_kind::reduce_scatter ? d.count * static_cast<std::uint64_t>(n) : d.count;
}

/// direct_reproducible's float32 form for plain inputs (no premul_sum scalar) and accumulators
/// that hold staged contributions only (nothing deposited): primitive::reproducible_sum_f32
/// block by block over every rank's input or staged copies (the sum is a function of the
/// multiset, so their order does not matter), the result copied to each output. Returns false,
/// having done nothing, where it does not apply.
inline bool direct_reproducible_f32(const algorithms::call& c, std::uint64_t begin, std::uint64_t end,
                                    std::uint64_t divisor, bool streaming) {
  const collective_descriptor& d = c.d;
  const int n = c.n(), r = c.rank();
  if (d.type != dtype::float32 || d.op.kind == reduce_kind::premul_sum) return false;
  std::vector<const float*> ins;
  ins.reserve(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    const collective_descriptor* p = c.t.peer_descriptor(q);
    if (p->binned == nullptr) {
      ins.push_back(static_cast<const float*>(p->send));
      continue;
    }
    if (p->binned->deposited() != 0) return false;
    for (std::uint64_t j = 0; j < p->binned->staged_count; ++j)
      ins.push_back(static_cast<const float*>(p->binned->staged_array(j)));
  }
  if (ins.empty()) return false;  // no contribution anywhere: the general form's NaN average
  const int inputs = static_cast<int>(ins.size());
  constexpr std::uint64_t block = primitive::detail::reproducible_fused_block;
  alignas(64) float result[block];
  for (std::uint64_t first = begin; first < end; first += block) {
    const std::uint64_t len = std::min(block, end - first);
    primitive::reproducible_sum_f32(result, ins.data(), inputs, first, len, divisor);
    // In place is safe: only this rank reads these elements of any input, and it has read them.
    switch (d.kind) {
      case collective_kind::all_reduce:
        for (int j = 0; j < n; ++j)
          c.ops.copy(c.at(c.t.peer_descriptor((r + j) % n)->recv, first), result, len * 4, streaming);
        break;
      case collective_kind::reduce_scatter: c.ops.copy(c.at(d.recv, first - begin), result, len * 4, streaming); break;
      case collective_kind::reduce:
        c.ops.copy(c.at(c.t.peer_descriptor(d.root)->recv, first), result, len * 4, streaming);
        break;
      default: c.t.raise(&c.op, errc::internal, "reproducible mode reached a collective that is not a reduction");
    }
  }
  if (streaming) c.ops.fence();
  return true;
}

/// The fused direct form (shared memory): rank r handles its block of the result tile by tile,
/// reading every rank's contributions in place. Returns a refusal (identical on every rank) or "".
inline std::string direct_reproducible(const algorithms::call& c) {
  const collective_descriptor& d = c.d;
  const int n = c.n(), r = c.rank();
  const dtype t = d.type;
  const std::uint64_t w = static_cast<std::uint64_t>(primitive::reproducible_words(t)), es = dtype_size(t);
  std::uint64_t total = 0;
  for (int q = 0; q < n; ++q) {
    const collective_descriptor* p = c.t.peer_descriptor(q);
    total += p->binned != nullptr ? p->binned->contributions : 1;
  }
  if (std::string refusal = reproducible_headroom(total); !refusal.empty()) return refusal;
  const std::uint64_t divisor = reproducible_divisor(d, total);

  // This rank's elements of the result and where they go.
  std::uint64_t begin = 0, end = 0;
  if (d.kind == collective_kind::reduce_scatter) {
    begin = static_cast<std::uint64_t>(r) * d.count;
    end = begin + d.count;
  } else {
    const algorithms::range mine = c.blocks_of(d.count).block(static_cast<std::uint64_t>(r));
    begin = mine.begin;
    end = mine.end;
  }
  const bool streaming = c.bytes(d.count) >= primitive::streaming_threshold_bytes;  // peers' outputs: not read soon
  if (direct_reproducible_f32(c, begin, end, divisor, streaming)) return {};
  constexpr std::uint64_t tile = 2048;
  auto* base = static_cast<unsigned char*>(
      c.t.scratch(algorithms::scratch_tile, static_cast<std::size_t>(tile * (1 + 8 * w + es))));
  auto* tops = base;
  auto* words = reinterpret_cast<std::int64_t*>(base + tile);  // 8-byte aligned: tile is a multiple of 8
  void* scaled = base + tile * (1 + 8 * w);                    // premul_sum: one rank's tile times its scalar
  for (std::uint64_t first = begin; first < end; first += tile) {
    const std::uint64_t len = std::min(tile, end - first);
    std::memset(tops, 0, len);
    std::memset(words, 0, len * w * 8);
    for (int q = 0; q < n; ++q) reproducible_source{c.t.peer_descriptor(q), &c.ops, scaled}.fold_tops(tops, first, len);
    for (int q = 0; q < n; ++q)
      reproducible_source{c.t.peer_descriptor(q), &c.ops, scaled}.add_words(words, tops, first, len);
    switch (d.kind) {
      case collective_kind::all_reduce: {
        // Into this rank's output, then copied to the others. In place is safe: only this rank
        // reads these elements of any input, and it has read them for this tile already.
        void* mine = c.at(d.recv, first);
        primitive::convert_to(mine, words, tops, len, t, divisor);
        for (int j = 0; j < n; ++j) {
          void* dst = c.at(c.t.peer_descriptor((r + j) % n)->recv, first);
          if (dst != mine) c.ops.copy(dst, mine, len * es, streaming);
        }
        break;
      }
      case collective_kind::reduce_scatter:
        primitive::convert_to(c.at(d.recv, first - begin), words, tops, len, t, divisor);
        break;
      case collective_kind::reduce:
        primitive::convert_to(c.at(c.t.peer_descriptor(d.root)->recv, first), words, tops, len, t, divisor);
        break;
      default: c.t.raise(&c.op, errc::internal, "reproducible mode reached a collective that is not a reduction");
    }
  }
  if (streaming) c.ops.fence();
  return {};
}

/// A descriptor like `d` for one of the reproducible mode's inner schedules, over `buffer`
/// (in place, per NCCL's convention for `kind`), of `count` elements of `type` with `op`.
inline collective_descriptor inner_descriptor(const collective_descriptor& d, collective_kind kind, void* buffer,
                                              std::uint64_t count, dtype type, reduce_kind op, int rank, int n) {
  collective_descriptor inner = d;
  inner.kind = kind;
  inner.count = count;
  inner.type = type;
  inner.op = reduce_op(op);
  inner.reproducible = reproducible_mode::off;
  inner.binned = nullptr;
  inner.in_place = true;
  const std::uint64_t es = dtype_size(type);
  const std::uint64_t whole = kind == collective_kind::reduce_scatter ? count * static_cast<std::uint64_t>(n) : count;
  inner.send = buffer;
  inner.send_bytes = whole * es;
  inner.recv = kind == collective_kind::reduce_scatter
                   ? static_cast<unsigned char*>(buffer) + static_cast<std::uint64_t>(rank) * count * es
                   : buffer;
  inner.recv_bytes = count * es;
  return inner;
}

/// Runs `d` (reproducible mode on, host memory, count > 0) with `run_schedule(call)` running an
/// inner schedule of the resolved algorithm. Returns a refusal (identical on every rank, raised
/// by the caller after `end`) or "".
template <class RunSchedule>
std::string run_reproducible(transport& comm, const collective_descriptor& d, const algorithms::data_ops& ops,
                             RunSchedule&& run_schedule) {
  const int n = comm.world_size(), r = comm.rank();
  if (n > 1 && d.algo == algorithm::direct) return direct_reproducible(algorithms::call{comm, d, d, ops});

  const dtype t = d.type;
  const std::uint64_t elements = reproducible_elements(d, n);
  const std::uint64_t w = static_cast<std::uint64_t>(primitive::reproducible_words(t));
  void* scaled = d.op.kind == reduce_kind::premul_sum
                     ? comm.scratch(algorithms::scratch_scaled, static_cast<std::size_t>(elements * dtype_size(t)))
                     : nullptr;
  const reproducible_source source{&d, &ops, scaled};

  // The total number of contributions (a one-element all_reduce for accumulators).
  std::uint64_t total = static_cast<std::uint64_t>(n);
  if (d.binned != nullptr) {
    std::int64_t mine = static_cast<std::int64_t>(source.contributions());
    if (n > 1) {
      const collective_descriptor inner =
          inner_descriptor(d, collective_kind::all_reduce, &mine, 1, dtype::int64, reduce_kind::sum, r, n);
      run_schedule(algorithms::call{comm, d, inner, ops});
    }
    total = static_cast<std::uint64_t>(mine);
  }
  if (std::string refusal = reproducible_headroom(total); !refusal.empty()) return refusal;

  // Phase 1: the global top bin of every element.
  auto* tops = static_cast<std::uint8_t*>(
      comm.scratch(algorithms::scratch_reproducible_tops, static_cast<std::size_t>(elements)));
  std::memset(tops, 0, static_cast<std::size_t>(elements));
  source.fold_tops(tops, 0, elements);
  if (n > 1) {
    const collective_descriptor inner =
        inner_descriptor(d, collective_kind::all_reduce, tops, elements, dtype::uint8, reduce_kind::max, r, n);
    run_schedule(algorithms::call{comm, d, inner, ops});
  }

  // Phase 2: the exact sums of the truncated words.
  auto* words = static_cast<std::int64_t*>(
      comm.scratch(algorithms::scratch_reproducible_words, static_cast<std::size_t>(elements * w * 8)));
  std::memset(words, 0, static_cast<std::size_t>(elements * w * 8));
  source.add_words(words, tops, 0, elements);
  if (n > 1) {
    const collective_descriptor inner =
        inner_descriptor(d, d.kind, words, d.count * w, dtype::int64, reduce_kind::sum, r, n);
    run_schedule(algorithms::call{comm, d, inner, ops});
  }

  // The single rounding into this rank's output.
  const std::uint64_t divisor = reproducible_divisor(d, total);
  switch (d.kind) {
    case collective_kind::all_reduce: primitive::convert_to(d.recv, words, tops, d.count, t, divisor); break;
    case collective_kind::reduce_scatter: {
      const std::uint64_t first = static_cast<std::uint64_t>(r) * d.count;
      primitive::convert_to(d.recv, words + first * w, tops + first, d.count, t, divisor);
      break;
    }
    case collective_kind::reduce:
      if (r == d.root) primitive::convert_to(d.recv, words, tops, d.count, t, divisor);
      break;
    default: comm.raise(&d, errc::internal, "reproducible mode reached a collective that is not a reduction");
  }
  return {};
}

}  // namespace ringzero::detail
