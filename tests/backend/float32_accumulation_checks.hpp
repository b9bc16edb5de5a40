#pragma once
// float16 / bfloat16 sum, avg and premul_sum accumulate in float32 and round once (case C22,
// core/reduce_op.hpp), written against `ringzero::communicator` so that the same checks run on
// the local backend (tests/collective/test_cases.cpp) and under mpirun (tests/backend/mpi).
//
// - C22 scaled to the world size n: (a) bfloat16 avg, rank 0 holds 1.0 and the others 2^-8:
//   the float32 sum divided by n in float32, rounded once (0.12890625 for n = 8); (b) float16
//   avg, every rank holds 30000: 30000 (a 16-bit sum overflows to inf from n = 3 on).
// - Inputs m * 2^e (|m| <= 127, e in [-4, 4]) whose float32 sums, and premul_sum's products and
//   sums, are exact, but whose 16-bit partial sums are not: every algorithm the backend offers
//   must return exactly the exact result rounded once, for all_reduce, reduce_scatter and
//   reduce, in and out of place, counts 1, 7, 1000, 4099. Each check also counts the elements
//   where rounding every partial sum to 16 bits (rank order) would give other bits, so a caller
//   can assert that the inputs do exercise the difference.

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "../collective/reference.hpp"
#include "ringzero/ringzero.hpp"

namespace ringzero_test {

/// What the checks found on one rank.
struct accumulation_report {
  std::vector<std::string> failures;   ///< one line per wrong call (first wrong element named)
  std::uint64_t checked = 0;           ///< result elements compared
  std::uint64_t rounding_differs = 0;  ///< of those, elements where per-hop 16-bit rounding differs
};

/// The exact-sum input of rank `r`, element `k`, as a value (see the file comment).
inline double accumulation_input(ringzero::dtype t, int r, std::uint64_t k) {
  const std::uint64_t h =
      rzt::mix64((k << 8) ^ (static_cast<std::uint64_t>(r) << 2) ^ static_cast<std::uint64_t>(t) ^ 0xacc0ull);
  const double m = static_cast<double>(h % 255) - 127.0;
  const int e = static_cast<int>((h >> 16) % 9) - 4;
  return std::ldexp(m, e);
}

/// Bits of the float32 reduction of `values[0..n)` (premul_sum: times `scalars`) rounded once
/// into 16-bit type `t`; the reduction is exact in double and in float32 for these inputs.
inline std::uint16_t rounded_once(ringzero::dtype t, ringzero::reduce_kind op, const std::vector<double>& values,
                                  const std::vector<double>& scalars) {
  double acc = 0;
  for (std::size_t r = 0; r < values.size(); ++r)
    acc += op == ringzero::reduce_kind::premul_sum ? values[r] * scalars[r] : values[r];
  const float wide = static_cast<float>(acc);
  if (static_cast<double>(wide) != acc) throw std::logic_error("accumulation test input is not exact in float32");
  const float result = op == ringzero::reduce_kind::avg ? wide / static_cast<float>(values.size()) : wide;
  return static_cast<std::uint16_t>(rzt::float_bits_rounded(t, static_cast<double>(result)));
}

/// Bits of the same reduction with every partial result rounded to 16 bits in rank order (what
/// a schedule that moves 16-bit partials computes on one of its orders).
inline std::uint16_t rounded_per_hop(ringzero::dtype t, ringzero::reduce_kind op, const std::vector<double>& values,
                                     const std::vector<double>& scalars) {
  auto round16 = [&](double x) { return rzt::float_value(t, rzt::float_bits_rounded(t, x)); };
  const bool premul = op == ringzero::reduce_kind::premul_sum;
  double acc = round16(premul ? values[0] * scalars[0] : values[0]);
  for (std::size_t r = 1; r < values.size(); ++r)
    acc = round16(acc + round16(premul ? values[r] * scalars[r] : values[r]));
  if (op == ringzero::reduce_kind::avg)
    acc = round16(static_cast<double>(static_cast<float>(acc) / static_cast<float>(values.size())));
  return static_cast<std::uint16_t>(rzt::float_bits_rounded(t, acc));
}

/// Runs C22 (scaled to the world size) on every algorithm `comm` offers; appends failures.
inline void check_c22(ringzero::communicator& comm, accumulation_report& report) {
  using namespace ringzero;
  const int n = comm.world_size(), r = comm.rank();
  for (algorithm a : {algorithm::ring, algorithm::halving_doubling, algorithm::direct, algorithm::native}) {
    if (!algorithm_available(comm, a, collective_kind::all_reduce)) continue;
    collective_options o;
    o.algo = a;
    // (a) bfloat16: 1.0 on rank 0, 2^-8 elsewhere
    const std::vector<std::uint16_t> a_in(5, r == 0 ? 0x3f80 : 0x3b80);
    std::vector<std::uint16_t> a_out(5, 0xa5a5);
    all_reduce(comm, a_in.data(), a_out.data(), 4, dtype::bfloat16, reduce_kind::avg, o);
    const float a_sum = 1.0f + static_cast<float>(n - 1) * 0x1p-8f;
    const auto a_expected = static_cast<std::uint16_t>(
        rzt::float_bits_rounded(dtype::bfloat16, static_cast<double>(a_sum / static_cast<float>(n))));
    // (b) float16: 30000 everywhere (0x7353)
    const std::vector<std::uint16_t> b_in(5, 0x7353);
    std::vector<std::uint16_t> b_out(5, 0xa5a5);
    all_reduce(comm, b_in.data(), b_out.data(), 4, dtype::float16, reduce_kind::avg, o);
    for (int i = 0; i < 4; ++i) {
      report.checked += 2;
      if (a_out[static_cast<std::size_t>(i)] != a_expected || (n == 8 && rzt::bfloat16_value(a_out[0]) != 0.12890625))
        report.failures.push_back("C22 (a) " + std::string(algorithm_name(a)) + " rank " + std::to_string(r) +
                                  ": got " + rzt::element_hex(a_out.data(), static_cast<std::uint64_t>(i), 2) +
                                  ", expected " + rzt::element_hex(&a_expected, 0, 2));
      if (b_out[static_cast<std::size_t>(i)] != 0x7353)
        report.failures.push_back("C22 (b) " + std::string(algorithm_name(a)) + " rank " + std::to_string(r) +
                                  ": got " + rzt::element_hex(b_out.data(), static_cast<std::uint64_t>(i), 2) +
                                  ", expected 30000");
    }
    if (a_out[4] != 0xa5a5 || b_out[4] != 0xa5a5)
      report.failures.push_back("C22 " + std::string(algorithm_name(a)) + ": the element after the output was written");
  }
}

/// Runs the exact-sum checks on every algorithm `comm` offers; appends to `report`.
inline void check_exact_sums(ringzero::communicator& comm, accumulation_report& report) {
  using namespace ringzero;
  const int n = comm.world_size(), r = comm.rank();
  const auto un = static_cast<std::uint64_t>(n);
  const int root = n - 1;
  constexpr std::uint16_t sentinel = 0xa5a5;
  std::vector<double> scalars(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) scalars[static_cast<std::size_t>(q)] = rzt::premul_scalar(dtype::float32, q);
  std::vector<double> values(static_cast<std::size_t>(n));
  for (collective_kind kind : {collective_kind::all_reduce, collective_kind::reduce_scatter, collective_kind::reduce})
    for (algorithm a : {algorithm::ring, algorithm::halving_doubling, algorithm::direct, algorithm::native}) {
      if (!algorithm_available(comm, a, kind)) continue;
      for (dtype t : {dtype::bfloat16, dtype::float16})
        for (reduce_kind op : {reduce_kind::sum, reduce_kind::avg, reduce_kind::premul_sum})
          for (std::uint64_t count : {1ull, 7ull, 1000ull, 4099ull})
            for (bool in_place : {false, true}) {
              const bool scatter = kind == collective_kind::reduce_scatter;
              const std::uint64_t in_count = scatter ? count * un : count;
              std::vector<std::uint16_t> send(in_count), recv(count + 1, sentinel);
              for (std::uint64_t k = 0; k < in_count; ++k)
                send[k] = static_cast<std::uint16_t>(rzt::float_bits_exact(t, accumulation_input(t, r, k)));
              const std::vector<std::uint16_t> original = send;
              std::uint16_t* out =
                  in_place ? send.data() + (scatter ? static_cast<std::uint64_t>(r) * count : 0) : recv.data();
              const reduce_op rop = op == reduce_kind::premul_sum
                                        ? reduce_op::premul_sum(scalars[static_cast<std::size_t>(r)])
                                        : reduce_op(op);
              collective_options o;
              o.algo = a;
              switch (kind) {
                case collective_kind::all_reduce: all_reduce(comm, send.data(), out, count, t, rop, o); break;
                case collective_kind::reduce_scatter: reduce_scatter(comm, send.data(), out, count, t, rop, o); break;
                default: reduce(comm, send.data(), out, count, t, rop, root, o); break;
              }
              std::ostringstream name;
              name << collective_name(kind) << ' ' << algorithm_name(a) << ' ' << dtype_name(t) << ' '
                   << reduce_kind_name(op) << " count " << count << (in_place ? " in place" : " out of place")
                   << ", rank " << r << " of " << n << ": ";
              if (kind == collective_kind::reduce && r != root) {  // case C9: untouched
                if ((in_place && send != original) ||
                    (!in_place && recv != std::vector<std::uint16_t>(count + 1, sentinel)))
                  report.failures.push_back(name.str() + "a non-root output was written");
                continue;
              }
              if (!in_place && recv[count] != sentinel)
                report.failures.push_back(name.str() + "the element after the output was written");
              const std::uint64_t base = scatter ? static_cast<std::uint64_t>(r) * count : 0;
              for (std::uint64_t i = 0; i < count; ++i) {
                for (int q = 0; q < n; ++q) values[static_cast<std::size_t>(q)] = accumulation_input(t, q, base + i);
                const std::uint16_t expected = rounded_once(t, op, values, scalars);
                ++report.checked;
                if (rounded_per_hop(t, op, values, scalars) != expected) ++report.rounding_differs;
                if (out[i] != expected) {
                  report.failures.push_back(name.str() + "element " + std::to_string(i) + " is " +
                                            rzt::element_hex(out, i, 2) + ", expected " +
                                            rzt::element_hex(&expected, 0, 2));
                  break;
                }
              }
            }
    }
}

/// Both checks on `comm` (every rank calls it, with the same world).
inline accumulation_report run_float32_accumulation_checks(ringzero::communicator& comm) {
  accumulation_report report;
  check_c22(comm, report);
  check_exact_sums(comm, report);
  return report;
}

}  // namespace ringzero_test
