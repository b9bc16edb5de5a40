#pragma once
/// @file
/// `call`: what every algorithm receives (the transport, the collective being run, this rank's
/// descriptor of the schedule, the data operations for its memory space) and helpers shared by the schedules: byte
/// offsets, the reduction spec of a descriptor, and premul_sum's pre-scaled input.

#include <cstdint>

#include "ringzero/algorithms/data_ops.hpp"
#include "ringzero/algorithms/partition.hpp"
#include "ringzero/backend/transport.hpp"

namespace ringzero::algorithms {

/// Scratch slots of the transport's pool, by purpose.
enum scratch_slot : int {
  scratch_tile = 0,                ///< direct: one tile of partial results
  scratch_accumulator = 1,         ///< ring / halving-doubling: partial sums that are not the output
  scratch_scaled = 2,              ///< premul_sum: this rank's input multiplied by its scalar
  scratch_widened = 3,             ///< 16-bit sums: the float32 copy of the input (float32_accumulation.hpp)
  scratch_reproducible_tops = 4,   ///< reproducible mode: per-element top bins (uint8)
  scratch_reproducible_words = 5,  ///< reproducible mode: per-element truncated words (int64)
};

/// One collective as an algorithm sees it.
struct call {
  transport& t;
  const collective_descriptor& op;  ///< the collective being run: every transfer passes it (its tag)
  const collective_descriptor& d;   ///< what this schedule computes (op, or a float32 or reproducible stage of it)
  const data_ops& ops;

  int rank() const noexcept { return t.rank(); }
  int n() const noexcept { return t.world_size(); }
  std::size_t element_size() const noexcept { return dtype_size(d.type); }
  /// Bytes of `elements` elements.
  std::uint64_t bytes(std::uint64_t elements) const noexcept { return elements * element_size(); }
  /// `base` advanced by `elements` elements.
  const unsigned char* at(const void* base, std::uint64_t elements) const noexcept {
    return static_cast<const unsigned char*>(base) + bytes(elements);
  }
  unsigned char* at(void* base, std::uint64_t elements) const noexcept {
    return static_cast<unsigned char*>(base) + bytes(elements);
  }
  /// The partition of `count` elements into n() cache-line-granular blocks.
  partition blocks_of(std::uint64_t count) const noexcept {
    return partition(count, n(), cache_line_granule(element_size()));
  }
  /// The spec of a plain combine of two partial results (no pre-scaling, no final division).
  primitive::reduce_spec spec() const noexcept {
    primitive::reduce_spec s;
    s.type = d.type;
    s.kind = d.op.kind == reduce_kind::premul_sum ? reduce_kind::sum : d.op.kind;
    return s;
  }
  /// The spec of the combine that produces a final value: divides by n() for avg.
  primitive::reduce_spec final_spec() const noexcept {
    primitive::reduce_spec s = spec();
    if (d.op.kind == reduce_kind::avg) s.divisor = n();
    return s;
  }
  /// This rank's input of `count` elements as the schedules must read it: the send buffer, or
  /// for premul_sum a scratch copy multiplied by this rank's scalar (so that every value on the
  /// wire is already scaled and combines are plain sums).
  const void* scaled_input(const void* input, std::uint64_t count) const {
    if (d.op.kind != reduce_kind::premul_sum || count == 0) return input;
    void* scaled = t.scratch(scratch_scaled, static_cast<std::size_t>(bytes(count)));
    ops.scale(scaled, input, count, d.type, d.op.scalar);
    return scaled;
  }
};

}  // namespace ringzero::algorithms
