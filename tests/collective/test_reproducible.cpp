// Reproducible mode on the local backend (collective/reproducible.hpp, docs/numerics.md): every
// world size 1-8, every rank permutation on world 4, every algorithm, dtype and summing op give
// the bits of one reference computed on one thread from the same contributions; accumulators
// give the same bits however their contributions are spread over ranks; refusals and the mode
// mismatch are raised on every rank.

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "harness.hpp"
#include "reproducible_reference.hpp"
#include "ringzero/primitive/reduce.hpp"
#include "ringzero/primitive/reproducible_sum.hpp"
#include "ringzero/ringzero.hpp"

using namespace ringzero;
using rzt::outcome;

namespace {

using rzt::adversarial;
using rzt::bytes;
using rzt::floating_types;
using rzt::get;
using rzt::op_for;
using rzt::put;
using rzt::reference;
using rzt::summing_ops;

collective_options reproducible_with(algorithm a) {
  collective_options o;
  o.algo = a;
  o.reproducible = true;
  return o;
}

/// Runs a reproducible all_reduce of in[r] on every rank r; returns every rank's output.
std::vector<bytes> run_all_reduce(const std::vector<bytes>& in, dtype t, reduce_kind op, algorithm a,
                                  std::uint64_t count, bool in_place = false) {
  const int n = static_cast<int>(in.size());
  std::vector<bytes> out(in.size(), bytes(count * dtype_size(t) + 1, 0xAB));
  const std::string failure = rzt::launch_world(n, [&](communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    if (in_place) {
      std::memcpy(out[r].data(), in[r].data(), in[r].size());
      all_reduce(comm, out[r].data(), out[r].data(), count, t, op_for(op, comm.rank()), reproducible_with(a));
    } else {
      all_reduce(comm, in[r].data(), out[r].data(), count, t, op_for(op, comm.rank()), reproducible_with(a));
    }
  });
  REQUIRE_MESSAGE(failure.empty(), failure);
  for (auto& o : out) {
    CHECK(o.back() == 0xAB);  // nothing written past the output
    o.pop_back();
  }
  return out;
}

}  // namespace

// The sanitizer builds' quick sweep (RINGZERO_TEST_SWEEP_QUICK) keeps world sizes 1, 2, 3, 5 and 8:
// one rank, powers of two and not, the largest; the release build runs all eight.
#if defined(RINGZERO_TEST_SWEEP_QUICK)
constexpr int kReproducibleWorlds[] = {1, 2, 3, 5, 8};
// Every 5th of world 4's 24 rank permutations: 5 of them, each rank first in at least one.
constexpr int kPermutationStride = 5;
// Accumulator stages: one staged contribution, some staged and some deposited, all staged.
constexpr std::uint64_t kStages[] = {1, 3, 16};
// reduce_scatter / reduce counts: in place (7) and more than one block (700).
constexpr std::uint64_t kScatterCounts[] = {7, 700};
#else
constexpr int kReproducibleWorlds[] = {1, 2, 3, 4, 5, 6, 7, 8};
constexpr int kPermutationStride = 1;
constexpr std::uint64_t kStages[] = {1, 2, 3, 8, 16};
constexpr std::uint64_t kScatterCounts[] = {1, 7, 700};
#endif

TEST_CASE("reproducible all_reduce: world sizes 1-8, every algorithm, dtype, op and count give the reference's bits") {
  for (int n : kReproducibleWorlds)
    for (dtype t : floating_types)
      for (std::uint64_t count : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{4099}}) {
        const auto in = adversarial(t, n, count, 100 * static_cast<std::uint64_t>(n) + count, true);
        for (reduce_kind op : summing_ops) {
          const bytes expected = reference(in, t, op, 0, count);
          for (algorithm a : rzt::every_algorithm) {
            INFO("world " << n << " " << dtype_name(t) << " " << reduce_kind_name(op) << " count " << count << " "
                          << algorithm_name(a));
            const auto out = run_all_reduce(in, t, op, a, count, count == 7);
            for (int r = 0; r < n; ++r) CHECK(out[static_cast<std::size_t>(r)] == expected);
          }
        }
      }
}

TEST_CASE("reproducible all_reduce: every rank permutation of the same inputs on world 4 gives the same bits") {
  for (dtype t : floating_types) {
    const std::uint64_t count = 1031;
    const auto in = adversarial(t, 4, count, 4242);
    for (reduce_kind op : {reduce_kind::sum, reduce_kind::avg}) {
      const bytes expected = reference(in, t, op, 0, count);
      std::vector<int> perm{0, 1, 2, 3};
      int index = 0;
      do {
        if (index++ % kPermutationStride != 0) continue;
        std::vector<bytes> permuted;
        for (int p : perm) permuted.push_back(in[static_cast<std::size_t>(p)]);
        for (algorithm a : rzt::every_algorithm) {
          INFO(dtype_name(t) << " " << reduce_kind_name(op) << " " << algorithm_name(a) << " perm " << perm[0]
                             << perm[1] << perm[2] << perm[3]);
          const auto out = run_all_reduce(permuted, t, op, a, count);
          for (const auto& o : out) CHECK(o == expected);
        }
      } while (std::next_permutation(perm.begin(), perm.end()));
    }
  }
}

TEST_CASE("reproducible all_reduce: cancellation, the kept bins, non-finite values and overflow, exactly") {
  const double values[] = {0x1p60, -0x1p60, 1.0, 0x1p-60};
  for (algorithm a : rzt::every_algorithm) {
    // float64 keeps 6 bins below 2^60's (down to 2^0): 1.0 survives, 2^-60 is dropped.
    std::vector<bytes> in(4, bytes(8));
    for (int r = 0; r < 4; ++r) put(in[static_cast<std::size_t>(r)], 0, dtype::float64, values[r]);
    CHECK(get(run_all_reduce(in, dtype::float64, reduce_kind::sum, a, 1)[2], 0, dtype::float64) == 1.0);
    // float32 keeps 3 bins (down to 2^36): the sum is 0 (error < 4 * 2^36, docs/numerics.md).
    std::vector<bytes> in32(4, bytes(4));
    for (int r = 0; r < 4; ++r) put(in32[static_cast<std::size_t>(r)], 0, dtype::float32, values[r]);
    CHECK(get(run_all_reduce(in32, dtype::float32, reduce_kind::sum, a, 1)[1], 0, dtype::float32) == 0.0);
    // Everything within 25 bits of the top: exact.
    for (int r = 0; r < 4; ++r)
      put(in32[static_cast<std::size_t>(r)], 0, dtype::float32, r == 0 ? 1.0 : std::ldexp(1.0, -20 - r));
    CHECK(get(run_all_reduce(in32, dtype::float32, reduce_kind::sum, a, 1)[3], 0, dtype::float32) ==
          1.0 + 0x1p-21 + 0x1p-22 + 0x1p-23);
    // float16 average of 4 x 30000 does not overflow (case C22); the sum does, on every rank.
    std::vector<bytes> in16(4, bytes(2));
    for (auto& b : in16) put(b, 0, dtype::float16, 30000.0);
    for (const auto& o : run_all_reduce(in16, dtype::float16, reduce_kind::avg, a, 1))
      CHECK(get(o, 0, dtype::float16) == 30000.0);
    for (const auto& o : run_all_reduce(in16, dtype::float16, reduce_kind::sum, a, 1))
      CHECK(std::isinf(get(o, 0, dtype::float16)));
    // bfloat16 avg over 8 ranks of 1.0 and seven 2^-8 (the example): one rounding.
    std::vector<bytes> inb(8, bytes(2));
    for (int r = 0; r < 8; ++r) put(inb[static_cast<std::size_t>(r)], 0, dtype::bfloat16, r == 0 ? 1.0 : 0x1p-8);
    for (const auto& o : run_all_reduce(inb, dtype::bfloat16, reduce_kind::avg, a, 1))
      CHECK(get(o, 0, dtype::bfloat16) == 0.12890625);  // (1 + 7/256) / 8 = 0.128418 -> 0.12890625
    // Non-finite: +inf alone, +inf with -inf, NaN.
    std::vector<bytes> inf(3, bytes(12));
    const double a0[] = {INFINITY, INFINITY, NAN}, a1[] = {1.0, -INFINITY, 1.0}, a2[] = {-1e30, 2.0, 3.0};
    for (int i = 0; i < 3; ++i) {
      put(inf[0], static_cast<std::uint64_t>(i), dtype::float32, a0[i]);
      put(inf[1], static_cast<std::uint64_t>(i), dtype::float32, a1[i]);
      put(inf[2], static_cast<std::uint64_t>(i), dtype::float32, a2[i]);
    }
    for (const auto& o : run_all_reduce(inf, dtype::float32, reduce_kind::sum, a, 3)) {
      CHECK(get(o, 0, dtype::float32) == INFINITY);
      CHECK(std::isnan(get(o, 1, dtype::float32)));
      CHECK(std::isnan(get(o, 2, dtype::float32)));
    }
    // Overflow of the sum of finite values: +inf everywhere.
    std::vector<bytes> big(2, bytes(4));
    for (auto& b : big) put(b, 0, dtype::float32, 3e38);
    for (const auto& o : run_all_reduce(big, dtype::float32, reduce_kind::sum, a, 1))
      CHECK(get(o, 0, dtype::float32) == INFINITY);
    for (const auto& o : run_all_reduce(big, dtype::float32, reduce_kind::avg, a, 1))
      CHECK(get(o, 0, dtype::float32) == static_cast<double>(3e38f));
  }
}

TEST_CASE("reproducible reduce_scatter and reduce: every world size and algorithm give the reference's bits") {
  for (int n = 1; n <= 8; n += (n < 4 ? 1 : 3))
    for (dtype t : floating_types)
      for (reduce_kind op : summing_ops)
        for (std::uint64_t count : kScatterCounts) {
          const auto in =
              adversarial(t, n, count * static_cast<std::uint64_t>(n), 7 * count + static_cast<std::uint64_t>(n));
          const std::uint64_t es = dtype_size(t);
          for (algorithm a : rzt::every_algorithm) {
            INFO("world " << n << " " << dtype_name(t) << " " << reduce_kind_name(op) << " count " << count << " "
                          << algorithm_name(a));
            std::vector<bytes> out(static_cast<std::size_t>(n), bytes(count * es));
            std::vector<bytes> root_out(static_cast<std::size_t>(n), bytes(count * es, 0x5A));
            const int root = n - 1;
            const bool in_place = count == 7;
            std::vector<bytes> work = in;
            const std::string failure = rzt::launch_world(n, [&](communicator& comm) {
              const auto r = static_cast<std::size_t>(comm.rank());
              if (in_place) {
                reduce_scatter(comm, work[r].data(), work[r].data() + r * count * es, count, t, op_for(op, comm.rank()),
                               reproducible_with(a));
              } else {
                reduce_scatter(comm, in[r].data(), out[r].data(), count, t, op_for(op, comm.rank()),
                               reproducible_with(a));
              }
              reduce(comm, in[r].data(), root_out[r].data(), count, t, op_for(op, comm.rank()), root,
                     reproducible_with(a));
            });
            REQUIRE_MESSAGE(failure.empty(), failure);
            for (int r = 0; r < n; ++r) {
              const auto ur = static_cast<std::uint64_t>(r);
              const bytes expected = reference(in, t, op, ur * count, count);
              const bytes got = in_place ? bytes(work[ur].begin() + static_cast<std::ptrdiff_t>(ur * count * es),
                                                 work[ur].begin() + static_cast<std::ptrdiff_t>((ur + 1) * count * es))
                                         : out[ur];
              CHECK(got == expected);
            }
            CHECK(root_out[static_cast<std::size_t>(root)] == reference(in, t, op, 0, count));
            for (int r = 0; r < root; ++r) CHECK(root_out[static_cast<std::size_t>(r)] == bytes(count * es, 0x5A));
          }
        }
}

namespace {

/// Each rank r deposits contributions placement[r] (indices into `in`) into an accumulator and
/// runs the accumulator all_reduce (async: all_reduce_async, while this thread fills a second
/// accumulator, then waits); returns rank 0's output (after checking all ranks agree). `reused`:
/// every rank first deposits all of `in` and clears the accumulator, which leaves its storage
/// as it was (a rank with no contribution then lends storage that must not be read). `stage`:
/// the accumulators keep that many contributions as copies (the rest are deposited).
bytes accumulated(const std::vector<bytes>& in, dtype t, reduce_kind op, algorithm a, std::uint64_t count,
                  const std::vector<std::vector<int>>& placement, bool async = false, bool reused = false,
                  std::uint64_t stage = 0) {
  const int n = static_cast<int>(placement.size());
  std::vector<bytes> out(static_cast<std::size_t>(n), bytes(count * dtype_size(t)));
  const std::string failure = rzt::launch_world(n, [&](communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    reproducible_accumulator acc(count, t, stage);
    if (reused) {
      for (const auto& x : in) acc.add(x.data());
      acc.clear();
    }
    for (int c : placement[r]) acc.add(in[static_cast<std::size_t>(c)].data());
    collective_options o;
    o.algo = a;
    if (!async) {
      all_reduce(comm, acc, out[r].data(), op, o);
      return;
    }
    work w = all_reduce_async(comm, acc, out[r].data(), op, o);
    reproducible_accumulator other(count, t, stage);
    for (int c : placement[r]) other.add(in[static_cast<std::size_t>(c)].data());
    w.wait();
    CHECK(acc.contributions() == placement[r].size());
    CHECK(acc.staged() == std::min<std::uint64_t>(stage, placement[r].size()));
  });
  REQUIRE_MESSAGE(failure.empty(), failure);
  for (const auto& o : out) CHECK(o == out[0]);
  return out[0];
}

}  // namespace

TEST_CASE(
    "reproducible accumulator: 8 contributions on 1 rank == 4 ranks x 2 == 8 ranks x 1 == 3 uneven ranks, bitwise") {
  const std::uint64_t count = 517;
  for (dtype t : floating_types) {
    const auto in = adversarial(t, 8, count, 77, true);
    for (reduce_kind op : {reduce_kind::sum, reduce_kind::avg}) {
      const bytes expected = reference(in, t, op, 0, count);
      for (algorithm a : rzt::every_algorithm) {
        INFO(dtype_name(t) << " " << reduce_kind_name(op) << " " << algorithm_name(a));
        CHECK(accumulated(in, t, op, a, count, {{0, 1, 2, 3, 4, 5, 6, 7}}) == expected);
        CHECK(accumulated(in, t, op, a, count, {{7, 0}, {1, 6}, {2, 5}, {4, 3}}) == expected);
        CHECK(accumulated(in, t, op, a, count, {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}) == expected);
        CHECK(accumulated(in, t, op, a, count, {{5, 2, 7, 0, 1}, {}, {3, 4, 6}}) == expected);  // a rank with none
        // all_reduce_async gives the same bits.
        CHECK(accumulated(in, t, op, a, count, {{7, 0}, {1, 6}, {2, 5}, {4, 3}}, true) == expected);
        CHECK(accumulated(in, t, op, a, count, {{5, 2, 7, 0, 1}, {}, {3, 4, 6}}, true) == expected);
        // Accumulators cleared after earlier contributions give the same bits (clear() leaves the storage).
        CHECK(accumulated(in, t, op, a, count, {{7, 0}, {1, 6}, {2, 5}, {4, 3}}, false, true) == expected);
        CHECK(accumulated(in, t, op, a, count, {{5, 2, 7, 0, 1}, {}, {3, 4, 6}}, true, true) == expected);
        // The ordinary reproducible all_reduce with one contribution per rank agrees too.
        if (op == reduce_kind::sum) CHECK(run_all_reduce(in, t, op, a, count)[5] == expected);
      }
    }
  }
}

TEST_CASE("reproducible accumulator: contributions kept as copies (a stage) give the deposits' bits") {
  const std::uint64_t count = 1100;  // more than one block of the fused direct sum
  for (dtype t : floating_types) {
    const auto in = adversarial(t, 8, count, 41, true);
    for (reduce_kind op : {reduce_kind::sum, reduce_kind::avg}) {
      const bytes expected = reference(in, t, op, 0, count);
      for (algorithm a : rzt::every_algorithm)
        for (std::uint64_t stage : kStages) {
          INFO(dtype_name(t) << " " << reduce_kind_name(op) << " " << algorithm_name(a) << " stage " << stage);
          // Every contribution staged, some staged and some deposited, ranks with none.
          CHECK(accumulated(in, t, op, a, count, {{0, 1, 2, 3, 4, 5, 6, 7}}, false, false, stage) == expected);
          CHECK(accumulated(in, t, op, a, count, {{7, 0}, {1, 6}, {2, 5}, {4, 3}}, false, false, stage) == expected);
          CHECK(accumulated(in, t, op, a, count, {{5, 2, 7, 0, 1}, {}, {3, 4, 6}}, true, false, stage) == expected);
          CHECK(accumulated(in, t, op, a, count, {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}, false, true, stage) ==
                expected);
          CHECK(accumulated(in, t, op, a, count, {{6, 1, 3}, {0, 2, 4, 5, 7}}, true, true, stage) == expected);
        }
    }
  }
}

TEST_CASE("reproducible accumulator: the stage holds the first contributions after each clear; oversized is refused") {
  std::vector<float> x = {1.0f, -2.0f, 0x1p-20f};
  reproducible_accumulator acc(3, dtype::float32, 2);
  for (int k = 0; k < 3; ++k) acc.add(std::span<const float>(x));
  CHECK(acc.contributions() == 3);
  CHECK(acc.staged() == 2);
  const primitive::binned_view v = acc.view();
  CHECK(v.staged_count == 2);
  CHECK(v.deposited() == 1);
  CHECK(std::memcmp(v.staged_array(1), x.data(), 12) == 0);
  acc.clear();
  CHECK(acc.staged() == 0);
  acc.add(std::span<const float>(x));
  CHECK(acc.staged() == 1);
  CHECK(acc.view().deposited() == 0);
  bool refused = false;
  try {
    reproducible_accumulator huge(std::uint64_t{1} << 40, dtype::float32, std::uint64_t{1} << 20);
  } catch (const error& e) {
    refused = e.kind() == errc::invalid_argument && std::string(e.what()).find("stage") != std::string::npos;
  }
  CHECK(refused);
}

TEST_CASE("reproducible accumulator: staged float32 gradients take the fused direct sum, with the deposits' bits") {
  // Normal values of many magnitudes (no subnormal, no inf): the fused form of direct applies
  // wherever every rank's contributions are staged; 24 contributions over 1..4 ranks.
  const std::uint64_t count = 3000;
  std::vector<bytes> in(24, bytes(count * 4));
  std::uint64_t state = 12345;
  for (auto& x : in)
    for (std::uint64_t i = 0; i < count; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const auto exponent = static_cast<int>((state >> 33) % 40) - 30;
      const float v = std::ldexp(static_cast<float>((state >> 40) & 0xFFFFFF) / 0x1p24f + 0.5f, exponent) *
                      ((state >> 20) & 1 ? -1.0f : 1.0f);
      std::memcpy(x.data() + i * 4, &v, 4);
    }
  for (reduce_kind op : {reduce_kind::sum, reduce_kind::avg}) {
    const bytes expected = reference(in, dtype::float32, op, 0, count);
    for (int n : {1, 2, 3, 4}) {
      std::vector<std::vector<int>> placement(static_cast<std::size_t>(n));
      for (int c = 0; c < 24; ++c) placement[static_cast<std::size_t>((c * 7) % n)].push_back(c);
      for (algorithm a : rzt::every_algorithm)
        for (std::uint64_t stage : {0u, 4u, 16u, 24u}) {
          INFO(reduce_kind_name(op) << " world " << n << " " << algorithm_name(a) << " stage " << stage);
          CHECK(accumulated(in, dtype::float32, op, a, count, placement, false, false, stage) == expected);
          CHECK(accumulated(in, dtype::float32, op, a, count, placement, true, true, stage) == expected);
        }
    }
  }
}

TEST_CASE("reproducible accumulator: reduce_scatter gives each rank its block of the all_reduce") {
  for (dtype t : floating_types)
    for (int n : {1, 2, 3, 4}) {
      const std::uint64_t c = 129, count = c * static_cast<std::uint64_t>(n);
      const auto in = adversarial(t, 6, count, 99);
      const bytes whole = reference(in, t, reduce_kind::avg, 0, count);
      for (algorithm a : rzt::every_algorithm)
        for (std::uint64_t stage : {0u, 1u, 6u}) {  // deposited, mixed, staged
          INFO(dtype_name(t) << " world " << n << " " << algorithm_name(a) << " stage " << stage);
          std::vector<bytes> out(static_cast<std::size_t>(n), bytes(c * dtype_size(t)));
          const std::string failure = rzt::launch_world(n, [&](communicator& comm) {
            reproducible_accumulator acc(count, t, stage);
            for (int i = comm.rank(); i < 6; i += comm.world_size()) acc.add(in[static_cast<std::size_t>(i)].data());
            collective_options o;
            o.algo = a;
            reduce_scatter(comm, acc, out[static_cast<std::size_t>(comm.rank())].data(), reduce_kind::avg, o);
          });
          REQUIRE_MESSAGE(failure.empty(), failure);
          for (int r = 0; r < n; ++r) {
            const auto b =
                whole.begin() + static_cast<std::ptrdiff_t>(static_cast<std::uint64_t>(r) * c * dtype_size(t));
            CHECK(out[static_cast<std::size_t>(r)] == bytes(b, b + static_cast<std::ptrdiff_t>(c * dtype_size(t))));
          }
        }
    }
}

TEST_CASE("reproducible mode: refusals and the mode mismatch are raised on every rank") {
  auto expect_everywhere = [](int n, auto&& call, errc code, std::initializer_list<std::string> parts) {
    std::vector<outcome> o(static_cast<std::size_t>(n));
    const std::string failure = rzt::launch_world(n, [&](communicator& comm) {
      o[static_cast<std::size_t>(comm.rank())].capture([&] { call(comm); });
      barrier(comm);  // the communicator is still usable
    });
    REQUIRE_MESSAGE(failure.empty(), failure);
    rzt::check_every_rank(o, code, parts);
  };
  std::vector<float> f(16, 1.0f);
  std::vector<std::int32_t> i32(16, 1);
  auto buffer_of = [](auto& v, int r) { return v.data() + 4 * r; };
  for (algorithm a : rzt::every_algorithm) {
    expect_everywhere(4,
                      [&](communicator& c) {
                        all_reduce(c, buffer_of(i32, c.rank()), buffer_of(i32, c.rank()), 4, dtype::int32,
                                   reduce_kind::sum, reproducible_with(a));
                      },
                      errc::invalid_argument, {"int32 sum", "reproducible"});
    for (reduce_kind k : {reduce_kind::max, reduce_kind::min, reduce_kind::prod})
      expect_everywhere(3,
                        [&](communicator& c) {
                          all_reduce(c, buffer_of(f, c.rank()), buffer_of(f, c.rank()), 4, dtype::float32, k,
                                     reproducible_with(a));
                        },
                        errc::invalid_argument, {"float32 " + std::string(reduce_kind_name(k)), "reproducible"});
    // Only rank 0 asks for it: a contract mismatch on every rank.
    expect_everywhere(4,
                      [&](communicator& c) {
                        collective_options o;
                        o.algo = a;
                        o.reproducible = c.rank() == 0;
                        all_reduce(c, buffer_of(f, c.rank()), buffer_of(f, c.rank()), 4, dtype::float32,
                                   reduce_kind::sum, o);
                      },
                      errc::contract_mismatch, {"reproducible mode mismatch", "rank 0: on; ranks 1-3: off"});
    // An accumulator on one rank, the ordinary mode on the others.
    expect_everywhere(2,
                      [&](communicator& c) {
                        reproducible_accumulator acc(4, dtype::float32);
                        acc.add(f.data());
                        if (c.rank() == 0)
                          all_reduce(c, acc, buffer_of(f, c.rank()), reduce_kind::sum, reproducible_with(a));
                        else
                          all_reduce(c, buffer_of(f, c.rank()), buffer_of(f, c.rank()), 4, dtype::float32,
                                     reduce_kind::sum, reproducible_with(a));
                      },
                      errc::contract_mismatch, {"reproducible mode mismatch", "rank 0: accumulator; rank 1: on"});
    // Accumulator arguments; the asynchronous all_reduce raises from wait(), on every rank.
    expect_everywhere(3,
                      [&](communicator& c) {
                        reproducible_accumulator acc(4, dtype::float32);
                        acc.add(f.data());
                        all_reduce_async(c, acc, buffer_of(f, c.rank()), reduce_kind::max, rzt::with_algo(a)).wait();
                      },
                      errc::invalid_argument, {"an accumulator reduces with sum or avg, not max"});
    expect_everywhere(3,
                      [&](communicator& c) {
                        reproducible_accumulator acc(4, dtype::float32);
                        reduce_scatter(c, acc, buffer_of(f, c.rank()), reduce_kind::sum, rzt::with_algo(a));
                      },
                      errc::invalid_argument, {"accumulator count 4 is not a multiple of world size 3"});
    expect_everywhere(2,
                      [&](communicator& c) {
                        reproducible_accumulator acc(4, dtype::float32);
                        all_reduce(c, acc, buffer_of(f, c.rank()), c.rank() == 0 ? reduce_kind::max : reduce_kind::sum,
                                   rzt::with_algo(a));
                      },
                      errc::invalid_argument, {"rank 0: an accumulator reduces with sum or avg, not max"});
  }
}

TEST_CASE(
    "RINGZERO_REPRODUCIBLE=1: floating sums become reproducible, integers and min/max run as usual, prod is refused") {
  const rzt::scoped_env env("RINGZERO_REPRODUCIBLE", "1");
  const std::uint64_t count = 301;
  const auto in = adversarial(dtype::float32, 3, count, 5);
  const bytes expected = reference(in, dtype::float32, reduce_kind::sum, 0, count);
  std::vector<bytes> out(3, bytes(count * 4));
  std::vector<std::int32_t> ints(3 * 5);
  std::vector<float> maxes(3 * 5);
  std::vector<outcome> prod(3);
  const std::string failure = rzt::launch_world(3, [&](communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    CHECK(comm.reproducible());
    all_reduce(comm, in[r].data(), out[r].data(), count, dtype::float32, reduce_kind::sum);
    for (int i = 0; i < 5; ++i) {
      ints[r * 5 + static_cast<std::size_t>(i)] = static_cast<std::int32_t>(r) * 1000 + i;
      maxes[r * 5 + static_cast<std::size_t>(i)] = static_cast<float>(r) - static_cast<float>(i);
    }
    all_reduce(comm, std::span<std::int32_t>(ints.data() + r * 5, 5), reduce_kind::sum);
    all_reduce(comm, std::span<float>(maxes.data() + r * 5, 5), reduce_kind::max);
    prod[r].capture([&] { all_reduce(comm, std::span<float>(maxes.data() + r * 5, 5), reduce_kind::prod); });
  });
  REQUIRE_MESSAGE(failure.empty(), failure);
  for (const auto& o : out) CHECK(o == expected);
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 5; ++i) {
      CHECK(ints[static_cast<std::size_t>(r * 5 + i)] == 3000 + 3 * i);
      CHECK(maxes[static_cast<std::size_t>(r * 5 + i)] == 2.0f - static_cast<float>(i));
    }
  rzt::check_every_rank(prod, errc::invalid_argument, {"RINGZERO_REPRODUCIBLE=1", "float32 prod"});
}

namespace {

/// A one-rank communicator that claims CUDA device memory (no device needed: reproducible mode
/// is refused before any data moves). Its begin() runs the contract check on its descriptor.
class device_memory_communicator final : public detail::backend_communicator {
 public:
  device_memory_communicator() : backend_communicator(0, 1) {}
  ~device_memory_communicator() override { stop_progress(); }
  backend_kind backend() const noexcept override { return backend_kind::nccl; }
  memory_space space() const noexcept override { return memory_space::cuda; }
  void begin(const collective_descriptor& d) override {
    if (auto v = check_contract(
            1, [&](int) -> const collective_descriptor& { return d; }, false))
      raise(&d, v->code, v->message);
  }
  void end(const collective_descriptor&) override {}
  void backend_sendrecv(const collective_descriptor& d, const void*, std::uint64_t, int, void*, std::uint64_t,
                        int) override {
    raise(&d, errc::internal, "no transfers in this test");
  }
  void backend_sendrecv_reduce(const collective_descriptor& d, const void*, std::uint64_t, int, const void*, void*,
                               std::uint64_t, int, const combine_fn&) override {
    raise(&d, errc::internal, "no transfers in this test");
  }
  link_model link() const noexcept override { return {}; }
};

}  // namespace

TEST_CASE("reproducible mode: device memory is refused with errc::unsupported naming the backend") {
  device_memory_communicator comm;
  float x = 1.0f;
  outcome o;
  o.capture([&] { all_reduce(comm, &x, &x, 1, dtype::float32, reduce_kind::sum, reproducible_with(algorithm::ring)); });
  rzt::check_error(o, 0, errc::unsupported, {"reproducible mode is not available on backend nccl", "device memory"});
}
