#pragma once
// The benchmarks' one descriptor per collective (ringzero-bench, ringzero-mpi-compare,
// ringzero-gpu-bench): how a size becomes the call's count and buffers, the call out of place and
// in place, the bus-bandwidth factor, the least memory traffic behind %peak, and the exact check
// of the result against exact_values.hpp. Bus factors are nccl-tests' (its doc/PERFORMANCE.md):
// all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n; broadcast, reduce 1.
// Sizes are nccl-tests' too: `size` is the larger of a rank's send and receive buffers; where a
// buffer holds one block per rank the count is size / (element size * n), rounded down to a
// multiple of 4 elements. Uses only the standard library and ringzero (the GPU bench builds bare).

#include <cstdint>
#include <cstring>
#include <string>

#include "exact_values.hpp"
#include "ringzero/collective/all_gather.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/collective/all_to_all.hpp"
#include "ringzero/collective/barrier.hpp"
#include "ringzero/collective/broadcast.hpp"
#include "ringzero/collective/reduce.hpp"
#include "ringzero/collective/reduce_scatter.hpp"
#include "ringzero/core/algorithm.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::bench {

/// One rank's buffers and counts for one row (elements of the row's dtype).
struct row_shape {
  std::uint64_t count = 0;       ///< the collective's count argument
  std::uint64_t send_elems = 0;  ///< elements of the send buffer
  std::uint64_t recv_elems = 0;  ///< elements of the receive buffer
  std::uint64_t size_bytes = 0;  ///< nccl-tests' size: max(send, recv) bytes of one rank
};

/// The arguments of one call on one rank. In place, the input sits inside `recv` (see
/// collective_descriptor::input_offset) and `send` is not read.
struct call_args {
  unsigned char* send = nullptr;
  unsigned char* recv = nullptr;
  row_shape shape;
  dtype type = dtype::float32;
  reduce_kind op = reduce_kind::sum;  ///< premul_sum runs with the scalar premul_scalar
  int root = 0;
  bool in_place = false;
  collective_options options;
};

/// What the benchmarks need to know of one collective. Thread semantics: immutable.
struct collective_descriptor {
  collective_kind kind;
  bool send_per_rank;  ///< the send buffer holds one block of `count` per rank
  bool recv_per_rank;  ///< the receive buffer holds one block of `count` per rank
  bool has_in_place;   ///< false: in-place cells are N/A (all_to_all, as nccl-tests' sendrecv)
  bool moves_data;     ///< false for barrier: no bandwidth
  /// nccl-tests' bus-bandwidth factor for a world of n ranks.
  double (*bus_factor)(int n);
  /// Least bytes read + written, summed over ranks, by any shared-memory algorithm for an
  /// S-byte row (every input byte read once, every output byte written once; docs/performance.md).
  double (*least_bytes)(int n, double S);
  /// Runs the collective once on `comm` (rank r of n).
  void (*call)(communicator& comm, const call_args& a, int r, int n);
  /// Element offset within the receive buffer where rank r's input goes in place, and where
  /// its output starts (reduce_scatter: its own block; all_gather: its block holds the input).
  std::uint64_t (*input_offset)(std::uint64_t count, int r);
  std::uint64_t (*output_offset)(std::uint64_t count, int r);
  /// Elements of rank r's output that differ bitwise from the exact expected values; `out` is
  /// the receive buffer (host memory) after the call.
  std::int64_t (*verify)(const unsigned char* out, const row_shape& s, dtype t, reduce_kind op, int root, int r, int n,
                         bool in_place);

  /// The row's shape for a size of `bytes` with elements of `element_size` on n ranks.
  row_shape shape(std::uint64_t bytes, std::size_t element_size, int n) const {
    row_shape s;
    const std::uint64_t elems = bytes / element_size, nn = static_cast<std::uint64_t>(n);
    s.count = send_per_rank || recv_per_rank ? elems / (4u * nn) * 4u : elems;
    if (!moves_data) s.count = 0;
    s.send_elems = send_per_rank ? s.count * nn : s.count;
    s.recv_elems = recv_per_rank ? s.count * nn : s.count;
    s.size_bytes = (s.send_elems > s.recv_elems ? s.send_elems : s.recv_elems) * element_size;
    return s;
  }
  /// Elements of rank r's input: the whole send buffer, or (all_gather) its one block.
  std::uint64_t input_elems(const row_shape& s) const {
    return kind == collective_kind::all_gather ? s.count : s.send_elems;
  }
};

namespace detail {

inline reduce_op bench_op(reduce_kind k) {
  return k == reduce_kind::premul_sum ? reduce_op::premul_sum(premul_scalar) : reduce_op(k);
}

/// Counts elements [at, at + elems) of `out` that differ from the reduction over n ranks of
/// pattern positions first_global, first_global + 1, ...
inline std::int64_t count_reduced(const unsigned char* out, std::uint64_t at, std::uint64_t first_global,
                                  std::uint64_t elems, dtype t, reduce_kind op, int n) {
  const std::size_t es = dtype_size(t);
  unsigned char expected[pattern_period][8];
  for (int k = 0; k < pattern_period; ++k) expected_reduction(t, op, n, k, expected[k]);
  std::int64_t wrong = 0;
  for (std::uint64_t i = 0; i < elems; ++i)
    if (std::memcmp(out + (at + i) * es, expected[(first_global + i) % pattern_period], es) != 0) ++wrong;
  return wrong;
}

/// Counts elements [at, at + elems) of `out` that differ from rank `source`'s input elements
/// source_first, source_first + 1, ...
inline std::int64_t count_copied(const unsigned char* out, std::uint64_t at, int source, std::uint64_t source_first,
                                 std::uint64_t elems, dtype t, reduce_kind op) {
  const std::size_t es = dtype_size(t);
  unsigned char expected[pattern_period][8];
  for (int k = 0; k < pattern_period; ++k) expected_copy(t, op, source, static_cast<std::uint64_t>(k), expected[k]);
  std::int64_t wrong = 0;
  for (std::uint64_t i = 0; i < elems; ++i)
    if (std::memcmp(out + (at + i) * es, expected[(source_first + i) % pattern_period], es) != 0) ++wrong;
  return wrong;
}

inline std::uint64_t at_zero(std::uint64_t, int) { return 0; }
inline std::uint64_t own_block(std::uint64_t count, int r) { return static_cast<std::uint64_t>(r) * count; }

}  // namespace detail

inline constexpr collective_descriptor all_reduce_bench{
    .kind = collective_kind::all_reduce,
    .send_per_rank = false,
    .recv_per_rank = false,
    .has_in_place = true,
    .moves_data = true,
    .bus_factor = [](int n) { return 2.0 * (n - 1) / n; },
    .least_bytes = [](int n, double S) { return n * 2 * S; },  // read S, write S per rank
    .call =
        [](communicator& c, const call_args& a, int, int) {
          all_reduce(c, a.in_place ? a.recv : a.send, a.recv, a.shape.count, a.type, detail::bench_op(a.op), a.options);
        },
    .input_offset = detail::at_zero,
    .output_offset = detail::at_zero,
    .verify = [](const unsigned char* out, const row_shape& s, dtype t, reduce_kind op, int, int, int n,
                 bool) { return detail::count_reduced(out, 0, 0, s.count, t, op, n); }};

inline constexpr collective_descriptor reduce_scatter_bench{
    .kind = collective_kind::reduce_scatter,
    .send_per_rank = true,
    .recv_per_rank = false,
    .has_in_place = true,
    .moves_data = true,
    .bus_factor = [](int n) { return (n - 1.0) / n; },
    .least_bytes = [](int n, double S) { return n * (S + S / n); },  // read S (n blocks), write S/n per rank
    .call =
        [](communicator& c, const call_args& a, int r, int) {
          reduce_scatter(c, a.in_place ? a.recv : a.send,
                         a.in_place ? a.recv + detail::own_block(a.shape.count, r) * dtype_size(a.type) : a.recv,
                         a.shape.count, a.type, detail::bench_op(a.op), a.options);
        },
    .input_offset = detail::at_zero,
    .output_offset = [](std::uint64_t count, int r) { return detail::own_block(count, r); },
    .verify =
        [](const unsigned char* out, const row_shape& s, dtype t, reduce_kind op, int, int r, int n, bool in_place) {
          const std::uint64_t at = in_place ? detail::own_block(s.count, r) : 0;
          return detail::count_reduced(out, at, detail::own_block(s.count, r), s.count, t, op, n);
        }};

inline constexpr collective_descriptor all_gather_bench{
    .kind = collective_kind::all_gather,
    .send_per_rank = false,
    .recv_per_rank = true,
    .has_in_place = true,
    .moves_data = true,
    .bus_factor = [](int n) { return (n - 1.0) / n; },
    .least_bytes = [](int n, double S) { return n * (S / n + S); },  // read S/n, write S per rank
    .call =
        [](communicator& c, const call_args& a, int r, int) {
          all_gather(c, a.in_place ? a.recv + detail::own_block(a.shape.count, r) * dtype_size(a.type) : a.send, a.recv,
                     a.shape.count, a.type, a.options);
        },
    .input_offset = [](std::uint64_t count, int r) { return detail::own_block(count, r); },
    .output_offset = detail::at_zero,
    .verify =
        [](const unsigned char* out, const row_shape& s, dtype t, reduce_kind op, int, int, int n, bool) {
          std::int64_t wrong = 0;
          for (int q = 0; q < n; ++q)
            wrong += detail::count_copied(out, detail::own_block(s.count, q), q, 0, s.count, t, op);
          return wrong;
        }};

inline constexpr collective_descriptor broadcast_bench{
    .kind = collective_kind::broadcast,
    .send_per_rank = false,
    .recv_per_rank = false,
    .has_in_place = true,
    .moves_data = true,
    .bus_factor = [](int) { return 1.0; },
    .least_bytes = [](int n, double S) { return S + n * S; },  // the root reads S, every rank writes S
    .call = [](communicator& c, const call_args& a, int,
               int) { broadcast(c, a.in_place ? a.recv : a.send, a.recv, a.shape.count, a.type, a.root, a.options); },
    .input_offset = detail::at_zero,
    .output_offset = detail::at_zero,
    .verify = [](const unsigned char* out, const row_shape& s, dtype t, reduce_kind op, int root, int, int,
                 bool) { return detail::count_copied(out, 0, root, 0, s.count, t, op); }};

inline constexpr collective_descriptor reduce_bench{
    .kind = collective_kind::reduce,
    .send_per_rank = false,
    .recv_per_rank = false,
    .has_in_place = true,
    .moves_data = true,
    .bus_factor = [](int) { return 1.0; },
    .least_bytes = [](int n, double S) { return n * S + S; },  // every input read, the root writes S
    .call =
        [](communicator& c, const call_args& a, int, int) {
          reduce(c, a.in_place ? a.recv : a.send, a.recv, a.shape.count, a.type, detail::bench_op(a.op), a.root,
                 a.options);
        },
    .input_offset = detail::at_zero,
    .output_offset = detail::at_zero,
    .verify = [](const unsigned char* out, const row_shape& s, dtype t, reduce_kind op, int root, int r, int n,
                 bool) -> std::int64_t { return r == root ? detail::count_reduced(out, 0, 0, s.count, t, op, n) : 0; }};

inline constexpr collective_descriptor all_to_all_bench{
    .kind = collective_kind::all_to_all,
    .send_per_rank = true,
    .recv_per_rank = true,
    .has_in_place = false,
    .moves_data = true,
    .bus_factor = [](int n) { return (n - 1.0) / n; },
    .least_bytes = [](int n, double S) { return n * 2 * S; },  // read S, write S per rank
    .call = [](communicator& c, const call_args& a, int,
               int) { all_to_all(c, a.send, a.recv, a.shape.count, a.type, a.options); },
    .input_offset = detail::at_zero,
    .output_offset = detail::at_zero,
    .verify =
        [](const unsigned char* out, const row_shape& s, dtype t, reduce_kind op, int, int r, int n, bool) {
          std::int64_t wrong = 0;
          for (int q = 0; q < n; ++q)
            wrong += detail::count_copied(out, detail::own_block(s.count, q), q, detail::own_block(s.count, r), s.count,
                                          t, op);
          return wrong;
        }};

inline constexpr collective_descriptor barrier_bench{
    .kind = collective_kind::barrier,
    .send_per_rank = false,
    .recv_per_rank = false,
    .has_in_place = true,
    .moves_data = false,
    .bus_factor = [](int) { return 0.0; },
    .least_bytes = [](int, double) { return 0.0; },
    .call = [](communicator& c, const call_args& a, int, int) { barrier(c, a.options); },
    .input_offset = detail::at_zero,
    .output_offset = detail::at_zero,
    .verify = [](const unsigned char*, const row_shape&, dtype, reduce_kind, int, int, int, bool) -> std::int64_t {
      return 0;
    }};

/// The descriptor of `kind`. Throws ringzero::error (invalid_argument) for send and recv, which
/// the benchmarks do not measure.
inline const collective_descriptor& describe_bench(collective_kind kind) {
  switch (kind) {
    case collective_kind::all_reduce: return all_reduce_bench;
    case collective_kind::reduce_scatter: return reduce_scatter_bench;
    case collective_kind::all_gather: return all_gather_bench;
    case collective_kind::broadcast: return broadcast_bench;
    case collective_kind::reduce: return reduce_bench;
    case collective_kind::all_to_all: return all_to_all_bench;
    case collective_kind::barrier: return barrier_bench;
    case collective_kind::send:
    case collective_kind::recv: break;
  }
  throw error(errc::invalid_argument, "the benchmarks measure no '" + std::string(collective_name(kind)) +
                                          "' (send and recv are point to point)");
}

/// Writes rank r's input for a row (in place: into the receive buffer at its input's place) and,
/// out of place, fills the receive buffer with 0xA5 so that an untouched element reads wrong.
/// Buffers are host memory (device benchmarks fill host mirrors and upload them).
inline void fill_row(const collective_descriptor& d, unsigned char* send, unsigned char* recv, const row_shape& s,
                     dtype t, reduce_kind op, int r, bool in_place) {
  const std::size_t es = dtype_size(t);
  unsigned char* in = in_place ? recv + d.input_offset(s.count, r) * es : send;
  fill_input(in, d.input_elems(s), t, op, r, 0);
  if (!in_place) std::memset(recv, 0xA5, s.recv_elems * es);
}

}  // namespace ringzero::bench
