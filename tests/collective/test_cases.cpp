// The cases of shared/cases/README.md that apply to collectives (C1-C12, C22), each on every
// algorithm (ring, direct, halving_doubling), in place and out of place where both exist.
// C11 (64-bit schedules) is also unit-tested in tests/core/test_partition.cpp; what is added
// here: the reduce_scatter/all_gather block partitions, both ring schedules, the
// halving-doubling ranges at 3*2^31+5 elements, and a 64-bit count through the public API.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <set>
#include <vector>

#include "../backend/float32_accumulation_checks.hpp"
#include "harness.hpp"
#include "reference.hpp"
#include "ringzero/algorithms/partition.hpp"
#include "ringzero/ringzero.hpp"

using namespace ringzero;
using rzt::every_algorithm;
using rzt::outcome;
using rzt::with_algo;

TEST_CASE("the tests' reference arithmetic agrees with IEEE 754 and with itself") {
  // every finite float16 / bfloat16 pattern round-trips, and midpoints round to the even pattern
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    if (((h >> 10) & 31) != 31) {
      REQUIRE(rzt::float_bits_rounded(dtype::float16, rzt::half_value(h)) == h);
      if ((h & 0x7fff) < 0x7bff) {
        const auto next = static_cast<std::uint16_t>(h + 1);
        const double mid = (rzt::half_value(h) + rzt::half_value(next)) / 2;
        REQUIRE(rzt::float_bits_rounded(dtype::float16, mid) == ((h & 1) ? next : h));
      }
    }
    if (((h >> 7) & 255) != 255) REQUIRE(rzt::float_bits_rounded(dtype::bfloat16, rzt::bfloat16_value(h)) == h);
  }
  CHECK(rzt::float_bits_rounded(dtype::float16, 65519.0) == 0x7bff);           // largest finite
  CHECK(rzt::float_bits_rounded(dtype::float16, 65520.0) == 0x7c00);           // the tie rounds to infinity
  CHECK(rzt::float_bits_rounded(dtype::bfloat16, 1.0 + 1.0 / 256) == 0x3f80);  // tie to even
  CHECK(rzt::float_bits_rounded(dtype::bfloat16, 1.0 + 3.0 / 256) == 0x3f82);
  // two independent implementations of round-to-nearest-even agree on arbitrary floats
  for (std::uint64_t i = 0; i < 200000; ++i) {
    const auto bits = static_cast<std::uint32_t>(rzt::mix64(i));
    const float f = std::bit_cast<float>(bits);
    if (!std::isfinite(f)) continue;
    REQUIRE(rzt::float_bits_rounded(dtype::float16, f) == float16(f).bits);
    REQUIRE(rzt::float_bits_rounded(dtype::bfloat16, f) == bfloat16(f).bits);
  }
  // expected reductions of the cases below
  const std::uint64_t c1[] = {120, 100};
  const double ones[] = {1, 1, 1};
  CHECK(rzt::expected_bits(dtype::int8, reduce_kind::sum, c1, 2, ones) == 0xdc);  // -36
  const std::uint64_t c3[] = {static_cast<std::uint32_t>(-1), static_cast<std::uint32_t>(-2),
                              static_cast<std::uint32_t>(-2)};
  CHECK(rzt::expected_bits(dtype::int32, reduce_kind::avg, c3, 3, ones) == static_cast<std::uint32_t>(-1));
  const std::uint64_t c2[] = {~0ull, 0, ~0ull >> 1};
  CHECK(rzt::expected_bits(dtype::uint64, reduce_kind::min, c2, 3, ones) == 0);
  CHECK(rzt::expected_bits(dtype::uint64, reduce_kind::max, c2, 3, ones) == ~0ull);
  CHECK(rzt::expected_bits(dtype::int64, reduce_kind::max, c2, 3, ones) == ~0ull >> 1);
  const std::uint64_t halves[] = {rzt::float_bits_exact(dtype::bfloat16, 1.0),
                                  rzt::float_bits_exact(dtype::bfloat16, 1.0),
                                  rzt::float_bits_exact(dtype::bfloat16, 0.5)};
  // (1 + 1 + 0.5) / 3 = 0.8333.. in float32, then to bfloat16
  CHECK(rzt::expected_bits(dtype::bfloat16, reduce_kind::avg, halves, 3, ones) == bfloat16(2.5f / 3.0f).bits);
  const double scalars[] = {3, -1};
  const std::uint64_t p[] = {200, 7};  // uint8: 200*3 - 7 = 593 = 81 mod 256
  CHECK(rzt::expected_bits(dtype::uint8, reduce_kind::premul_sum, p, 2, scalars) == 81);
}

TEST_CASE("C1: int8 sum wraps two's complement (120 + 100 = -36) on both ranks") {
  for (algorithm a : every_algorithm)
    for (bool in_place : {false, true}) {
      INFO(algorithm_name(a) << (in_place ? " in-place" : " out-of-place"));
      std::array<std::vector<std::int8_t>, 2> out;
      const std::string error = rzt::launch_world(2, [&](communicator& comm) {
        std::vector<std::int8_t> send(37, static_cast<std::int8_t>(comm.rank() == 0 ? 120 : 100)), recv(37, 0);
        std::int8_t* target = in_place ? send.data() : recv.data();
        all_reduce(comm, send.data(), target, 37, dtype::int8, reduce_kind::sum, with_algo(a));
        out[static_cast<std::size_t>(comm.rank())].assign(target, target + 37);
      });
      REQUIRE(error.empty());
      for (const auto& v : out)
        for (std::int8_t x : v) CHECK(x == -36);
    }
}

TEST_CASE("C2: uint64 min and max compare unsigned") {
  const std::uint64_t top = std::numeric_limits<std::uint64_t>::max(), half = (std::uint64_t{1} << 63) - 1;
  for (algorithm a : every_algorithm)
    for (bool in_place : {false, true}) {
      INFO(algorithm_name(a) << (in_place ? " in-place" : " out-of-place"));
      std::array<std::array<std::uint64_t, 3>, 4> out{};
      const std::string error = rzt::launch_world(4, [&](communicator& comm) {
        const int r = comm.rank();
        // element 0: min of {2^64-1 on ranks 0,1,3; 0 on rank 2};
        // element 1: max of {2^64-1, 2^63-1 on rank 2}; element 2: max of {2^63-1, 2^64-1 on rank 2}
        std::vector<std::uint64_t> mins = {r == 2 ? 0 : top}, maxes = {r == 2 ? half : top, r == 2 ? top : half};
        std::vector<std::uint64_t> min_out(1, 7), max_out(2, 7);
        auto* min_target = in_place ? mins.data() : min_out.data();
        auto* max_target = in_place ? maxes.data() : max_out.data();
        all_reduce(comm, mins.data(), min_target, 1, dtype::uint64, reduce_kind::min, with_algo(a));
        all_reduce(comm, maxes.data(), max_target, 2, dtype::uint64, reduce_kind::max, with_algo(a));
        out[static_cast<std::size_t>(r)] = {min_target[0], max_target[0], max_target[1]};
      });
      REQUIRE(error.empty());
      for (const auto& v : out) {
        CHECK(v[0] == 0);
        CHECK(v[1] == top);
        CHECK(v[2] == top);
      }
    }
}

TEST_CASE("C3: int32 avg is the exact sum divided with truncation toward zero") {
  for (algorithm a : every_algorithm)
    for (bool in_place : {false, true}) {
      INFO(algorithm_name(a) << (in_place ? " in-place" : " out-of-place"));
      std::array<std::array<std::int32_t, 2>, 3> out{};
      const std::string error = rzt::launch_world(3, [&](communicator& comm) {
        const int r = comm.rank();
        std::vector<std::int32_t> send = {r == 0 ? 1 : 2, r == 0 ? -1 : -2}, recv(2, 99);
        auto* target = in_place ? send.data() : recv.data();
        all_reduce(comm, send.data(), target, 2, dtype::int32, reduce_kind::avg, with_algo(a));
        out[static_cast<std::size_t>(r)] = {target[0], target[1]};
      });
      REQUIRE(error.empty());
      for (const auto& v : out) {
        CHECK(v[0] == 1);   // 5 / 3
        CHECK(v[1] == -1);  // -5 / 3 truncates toward zero (not -2)
      }
    }
}

TEST_CASE("C4: avg on a world of one returns all 1000 bfloat16 values bit for bit") {
  std::vector<std::uint16_t> input(1000);
  for (std::size_t i = 0; i < input.size(); ++i)  // arbitrary bits: NaNs, infinities, subnormals included
    input[i] = static_cast<std::uint16_t>(rzt::mix64(i + 4));
  input[0] = 0x7f81;  // a signalling NaN must not be quieted
  input[999] = 0x8000;
  for (algorithm a : every_algorithm)
    for (bool in_place : {false, true}) {
      INFO(algorithm_name(a) << (in_place ? " in-place" : " out-of-place"));
      std::vector<std::uint16_t> all_reduce_out, reduce_out, reduce_scatter_out;
      const std::string error = rzt::launch_world(1, [&](communicator& comm) {
        auto run = [&](auto&& call) {
          std::vector<std::uint16_t> send = input, recv(input.size(), 0x1234);
          std::uint16_t* target = in_place ? send.data() : recv.data();
          call(send.data(), target);
          return std::vector<std::uint16_t>(target, target + input.size());
        };
        all_reduce_out = run(
            [&](void* s, void* t) { all_reduce(comm, s, t, 1000, dtype::bfloat16, reduce_kind::avg, with_algo(a)); });
        reduce_out = run(
            [&](void* s, void* t) { reduce(comm, s, t, 1000, dtype::bfloat16, reduce_kind::avg, 0, with_algo(a)); });
        reduce_scatter_out = run([&](void* s, void* t) {
          reduce_scatter(comm, s, t, 1000, dtype::bfloat16, reduce_kind::avg, with_algo(a));
        });
      });
      REQUIRE(error.empty());
      CHECK(all_reduce_out == input);
      CHECK(reduce_out == input);
      CHECK(reduce_scatter_out == input);
    }
}

TEST_CASE("C5: every collective with zero elements and null pointers succeeds and touches nothing") {
  for (int world : {1, 2, 5})
    for (algorithm a : every_algorithm) {
      INFO("world " << world << " " << algorithm_name(a));
      std::vector<int> completed(static_cast<std::size_t>(world), 0);
      std::vector<int> touched(static_cast<std::size_t>(world), 0);
      const std::string error = rzt::launch_world(world, [&](communicator& comm) {
        const auto o = with_algo(a);
        const auto r = static_cast<std::size_t>(comm.rank());
        // null pointers
        all_reduce(comm, nullptr, nullptr, 0, dtype::float32, reduce_kind::sum, o);
        reduce_scatter(comm, nullptr, nullptr, 0, dtype::float64, reduce_kind::avg, o);
        all_gather(comm, nullptr, nullptr, 0, dtype::int8, o);
        broadcast(comm, nullptr, nullptr, 0, dtype::bfloat16, world - 1, o);
        reduce(comm, nullptr, nullptr, 0, dtype::uint64, reduce_op::premul_sum(3.0), 0, o);
        if (a != algorithm::halving_doubling) all_to_all(comm, nullptr, nullptr, 0, dtype::int32, o);
        barrier(comm, o);
        // real buffers are not touched
        std::vector<std::uint8_t> in(64, 0x11), out(64, 0x22);
        all_reduce(comm, in.data(), out.data(), 0, dtype::float32, reduce_kind::max, o);
        reduce_scatter(comm, in.data(), out.data(), 0, dtype::int32, reduce_kind::sum, o);
        all_gather(comm, in.data(), out.data(), 0, dtype::float16, o);
        broadcast(comm, in.data(), out.data(), 0, dtype::uint8, 0, o);
        reduce(comm, in.data(), out.data(), 0, dtype::int64, reduce_kind::prod, world - 1, o);
        if (a != algorithm::halving_doubling) all_to_all(comm, in.data(), out.data(), 0, dtype::float64, o);
        // point to point: zero-byte transfers still match
        if (world >= 2) {
          const int next = (comm.rank() + 1) % world, prev = (comm.rank() + world - 1) % world;
          sendrecv(comm, nullptr, 0, next, nullptr, 0, prev, dtype::float32);
          if (comm.rank() == 0) send(comm, nullptr, 0, dtype::float32, 1);
          if (comm.rank() == 1) recv(comm, nullptr, 0, dtype::float32, 0);
        }
        for (std::size_t i = 0; i < 64; ++i)
          if (in[i] != 0x11 || out[i] != 0x22) touched[r] = 1;
        completed[r] = 1;
      });
      CHECK(error.empty());
      for (int r = 0; r < world; ++r) {
        CHECK(completed[static_cast<std::size_t>(r)] == 1);
        CHECK(touched[static_cast<std::size_t>(r)] == 0);
      }
    }
}

TEST_CASE("C6: an all_reduce count mismatch fails on every rank, naming each rank's count, and writes nothing") {
  for (algorithm a : every_algorithm) {
    INFO(algorithm_name(a));
    std::vector<outcome> o(4);
    std::vector<int> touched(4, 0), usable(4, 0);
    const std::string error = rzt::launch_world(4, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      const std::uint64_t count = comm.rank() == 0 ? 2560 : 5120;
      std::vector<float> send(5120, 1.0f), recv(5120, -7.0f);
      o[r].capture(
          [&] { all_reduce(comm, send.data(), recv.data(), count, dtype::float32, reduce_kind::sum, with_algo(a)); });
      for (float x : recv)
        if (x != -7.0f) touched[r] = 1;
      // the communicator is still usable after a refused call
      float one = 1.0f, total = 0.0f;
      all_reduce(comm, &one, &total, 1, dtype::float32, reduce_kind::sum, with_algo(a));
      usable[r] = total == 4.0f;
    });
    CHECK(error.empty());
    rzt::check_every_rank(o, errc::contract_mismatch,
                          {"all_reduce #0", "count mismatch", "rank 0: 2560", "ranks 1-3: 5120"});
    for (int r = 0; r < 4; ++r) {
      CHECK(touched[static_cast<std::size_t>(r)] == 0);  // never a partial sum
      CHECK(usable[static_cast<std::size_t>(r)] == 1);
    }
  }
}

TEST_CASE("C7: an all_reduce dtype mismatch fails on every rank") {
  for (algorithm a : every_algorithm) {
    INFO(algorithm_name(a));
    std::vector<outcome> o(3);
    std::vector<int> touched(3, 0);
    const std::string error = rzt::launch_world(3, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      float f = 0.1f, f_out = -1.0f;
      bfloat16 b(0.1f), b_out(-1.0f);
      o[r].capture([&] {
        if (comm.rank() == 0)
          all_reduce(comm, &b, &b_out, 1, dtype::bfloat16, reduce_kind::sum, with_algo(a));
        else
          all_reduce(comm, &f, &f_out, 1, dtype::float32, reduce_kind::sum, with_algo(a));
      });
      touched[r] = f_out != -1.0f || b_out.bits != bfloat16(-1.0f).bits;
    });
    CHECK(error.empty());
    rzt::check_every_rank(o, errc::contract_mismatch,
                          {"all_reduce #0", "dtype mismatch", "rank 0: bfloat16", "ranks 1-2: float32"});
    for (int t : touched) CHECK(t == 0);
  }
}

TEST_CASE("C8: a reduce root mismatch fails on both ranks") {
  for (algorithm a : every_algorithm) {
    INFO(algorithm_name(a));
    std::vector<outcome> o(2);
    const std::string error = rzt::launch_world(2, [&](communicator& comm) {
      std::int64_t x = 5, y = 0;
      o[static_cast<std::size_t>(comm.rank())].capture(
          [&] { reduce(comm, &x, &y, 1, dtype::int64, reduce_kind::sum, comm.rank(), with_algo(a)); });
    });
    CHECK(error.empty());
    rzt::check_every_rank(o, errc::contract_mismatch, {"reduce #0", "root mismatch", "rank 0: 0", "rank 1: 1"});
  }
}

TEST_CASE("C9: reduce leaves non-root receive buffers exactly as they were") {
  for (algorithm a : every_algorithm)
    for (bool in_place : {false, true})
      for (bool null_recv : {false, true}) {
        if (in_place && null_recv) continue;
        INFO(algorithm_name(a) << (in_place ? " in-place" : " out-of-place")
                               << (null_recv ? ", null non-root recv" : ""));
        std::array<std::vector<std::int64_t>, 2> out;
        const std::string error = rzt::launch_world(2, [&](communicator& comm) {
          const int r = comm.rank();
          std::vector<std::int64_t> send =
              r == 0 ? std::vector<std::int64_t>{1, 2, 3, 4} : std::vector<std::int64_t>{4, 5, 6, 7};
          std::vector<std::int64_t> recv = {-1, -2, -3, -4};
          std::int64_t* target = in_place ? send.data() : (null_recv && r != 0 ? nullptr : recv.data());
          reduce(comm, send.data(), target, 4, dtype::int64, reduce_kind::sum, 0, with_algo(a));
          out[static_cast<std::size_t>(r)] = in_place ? send : recv;
        });
        REQUIRE(error.empty());
        CHECK(out[0] == std::vector<std::int64_t>{5, 7, 9, 11});
        if (in_place)
          CHECK(out[1] == std::vector<std::int64_t>{4, 5, 6, 7});
        else
          CHECK(out[1] == std::vector<std::int64_t>{-1, -2, -3, -4});
      }
}

namespace {

/// Input of rank r at element i for C10: distinct per rank and element, sums exact.
std::int32_t c10_value(int r, std::uint64_t i) {
  return static_cast<std::int32_t>((r + 1) * 100000 + static_cast<std::int64_t>(i % 99991));
}

/// Runs all_reduce, reduce_scatter and all_gather of `count` int32 elements on `world` ranks with
/// algorithm `a` and checks every element against sums computed here.
void check_uneven_counts(int world, std::uint64_t count, algorithm a, bool in_place) {
  INFO("world " << world << " count " << count << " " << algorithm_name(a)
                << (in_place ? " in-place" : " out-of-place"));
  std::vector<std::uint64_t> bad(static_cast<std::size_t>(world), 0);
  const auto n = static_cast<std::uint64_t>(world);
  const std::string error = rzt::launch_world(world, [&](communicator& comm) {
    const int r = comm.rank();
    std::uint64_t& wrong = bad[static_cast<std::size_t>(r)];
    auto sum_of = [&](std::uint64_t i) {
      std::int64_t s = 0;
      for (int q = 0; q < world; ++q) s += c10_value(q, i);
      return s;
    };
    // all_reduce
    std::vector<std::int32_t> a_in(count), a_out(count, -1);
    for (std::uint64_t i = 0; i < count; ++i) a_in[i] = c10_value(r, i);
    std::int32_t* a_target = in_place ? a_in.data() : a_out.data();
    all_reduce(comm, a_in.data(), a_target, count, dtype::int32, reduce_kind::sum, with_algo(a));
    for (std::uint64_t i = 0; i < count; ++i) wrong += a_target[i] != sum_of(i);
    // reduce_scatter: rank r's input element j = c10_value(r, j) over n*count elements
    std::vector<std::int32_t> rs_in(count * n), rs_out(count, -1);
    for (std::uint64_t j = 0; j < count * n; ++j) rs_in[j] = c10_value(r, j);
    std::int32_t* rs_target = in_place ? rs_in.data() + static_cast<std::uint64_t>(r) * count : rs_out.data();
    reduce_scatter(comm, rs_in.data(), rs_target, count, dtype::int32, reduce_kind::sum, with_algo(a));
    for (std::uint64_t i = 0; i < count; ++i)
      wrong += rs_target[i] != sum_of(static_cast<std::uint64_t>(r) * count + i);
    // all_gather: block q is rank q's count elements
    std::vector<std::int32_t> ag_in(count), ag_out(count * n, -1);
    for (std::uint64_t i = 0; i < count; ++i) ag_in[i] = c10_value(r, i);
    const std::int32_t* ag_send = ag_in.data();
    if (in_place) {
      std::copy(ag_in.begin(), ag_in.end(),
                ag_out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::uint64_t>(r) * count));
      ag_send = ag_out.data() + static_cast<std::uint64_t>(r) * count;
    }
    all_gather(comm, ag_send, ag_out.data(), count, dtype::int32, with_algo(a));
    for (std::uint64_t q = 0; q < n; ++q)
      for (std::uint64_t i = 0; i < count; ++i) wrong += ag_out[q * count + i] != c10_value(static_cast<int>(q), i);
  });
  REQUIRE(error.empty());
  for (int r = 0; r < world; ++r) CHECK_MESSAGE(bad[static_cast<std::size_t>(r)] == 0, "rank " << r);
}

}  // namespace

TEST_CASE("C10: counts that do not divide the world give exact results (trailing ranks may own nothing)") {
  // A large odd count too (pipelined in many slices): 1 MB of int32 in the sanitizer builds' quick
  // sweep, 4 MB in the release build.
#if defined(RINGZERO_TEST_SWEEP_QUICK)
  const std::uint64_t large = 250007;
#else
  const std::uint64_t large = 1000003;
#endif
  for (algorithm a : every_algorithm)
    for (bool in_place : {false, true}) {
      for (std::uint64_t count : {1u, 3u, 7u}) check_uneven_counts(4, count, a, in_place);
      check_uneven_counts(3, large, a, in_place);
    }
}

TEST_CASE("C11: reduce_scatter / all_gather block partitions of 3*2^31+5 elements are exact in 64 bits") {
  using namespace ringzero::algorithms;
  const std::uint64_t count = 3ull * (1ull << 31) + 5;
  for (int n : {5, 13}) {
    // whole-buffer collectives split n*count elements into blocks of exactly `count`
    const partition blocks(count * static_cast<std::uint64_t>(n), n, count);
    for (int q = 0; q < n; ++q) {
      const range b = blocks.block(static_cast<std::uint64_t>(q));
      CHECK(b.begin == static_cast<std::uint64_t>(q) * count);
      CHECK(b.size() == count);
    }
    // the byte offset of the last block is beyond 2^32 * 8 and exact
    CHECK(blocks.start(static_cast<std::uint64_t>(n - 1)) * 8 == static_cast<std::uint64_t>(n - 1) * count * 8);
  }
}

TEST_CASE("C11: both ring schedules hand every block on exactly once per step (worlds 2-13)") {
  using namespace ringzero::algorithms;
  for (int n = 2; n <= 13; ++n) {
    for (int r = 0; r < n; ++r) {
      std::set<int> rs_seen, ag_seen;
      for (int k = 0; k < n - 1; ++k) {
        const int next = ring_mod(r + 1, n);
        // what r sends at step k is what r+1 receives at step k
        CHECK(ring_rs_send_block(r, k, n) == ring_rs_recv_block(next, k, n));
        CHECK(ring_ag_send_block(r, k, n) == ring_ag_recv_block(next, k, n));
        // a reduce-scatter step sends the block combined in the previous step
        if (k > 0) CHECK(ring_rs_send_block(r, k, n) == ring_rs_recv_block(r, k - 1, n));
        if (k > 0) CHECK(ring_ag_send_block(r, k, n) == ring_ag_recv_block(r, k - 1, n));
        rs_seen.insert(ring_rs_recv_block(r, k, n));
        ag_seen.insert(ring_ag_recv_block(r, k, n));
      }
      CHECK(rs_seen.size() == static_cast<std::size_t>(n - 1));
      CHECK(ag_seen.size() == static_cast<std::size_t>(n - 1));
      CHECK(ag_seen.count(r) == 0);  // the own block is never received in the all-gather
      CHECK(ring_ag_send_block(r, 0, n) == r);
    }
  }
}

TEST_CASE("C11: halving-doubling ranges of 3*2^31+5 elements tile exactly, for worlds 2-13") {
  using namespace ringzero::algorithms;
  const std::uint64_t count = 3ull * (1ull << 31) + 5;
  for (int n = 2; n <= 13; ++n) {
    INFO("world " << n);
    const hd_layout layout(n);
    const partition blocks(count, n, cache_line_granule(8));
    auto groups = [&](int g0, int g1) {
      return blocks.blocks(static_cast<std::uint64_t>(layout.first_block(g0)),
                           static_cast<std::uint64_t>(layout.first_block(g1)));
    };
    // Recursive halving: at each step a virtual rank keeps one half of its range and gives the
    // other to its partner; the partner keeps exactly what it is given.
    std::vector<range> final_range(static_cast<std::size_t>(layout.p));
    for (int v = 0; v < layout.p; ++v) {
      int lo = 0, hi = layout.p;
      for (int d = layout.p / 2; d >= 1; d /= 2) {
        const int mid = lo + (hi - lo) / 2;
        const bool lower = (v & d) == 0;
        const range keep = lower ? groups(lo, mid) : groups(mid, hi);
        const range give = lower ? groups(mid, hi) : groups(lo, mid);
        CHECK(keep.end <= count);
        CHECK((keep.end == give.begin || give.end == keep.begin));
        CHECK(keep.size() + give.size() == groups(lo, hi).size());
        if (lower)
          hi = mid;
        else
          lo = mid;
      }
      final_range[static_cast<std::size_t>(v)] = groups(lo, hi);
      CHECK(final_range[static_cast<std::size_t>(v)] == groups(v, v + 1));
    }
    std::uint64_t at = 0;
    for (const range& r : final_range) {
      CHECK(r.begin == at);
      at = r.end;
    }
    CHECK(at == count);
  }
}

TEST_CASE("C11: a 64-bit count reaches the contract check intact (no truncation to 32 bits)") {
  const std::uint64_t count = 3ull * (1ull << 31) + 5;
  for (algorithm a : every_algorithm) {
    std::vector<outcome> o(5);
    const std::string error = rzt::launch_world(5, [&](communicator& comm) {
      // null buffers: refused before any memory is touched, with the full count in the message
      o[static_cast<std::size_t>(comm.rank())].capture(
          [&] { all_reduce(comm, nullptr, nullptr, count, dtype::float64, reduce_kind::sum, with_algo(a)); });
    });
    CHECK(error.empty());
    rzt::check_every_rank(o, errc::invalid_argument, {"6442450949", "null"});
  }
}

TEST_CASE("C12: a send/recv size mismatch fails on both sides, not a hang") {
  for (bool receiver_larger : {true, false}) {
    const char* what = receiver_larger ? "recv of 3 for a send of 1" : "recv of 1 for a send of 3";
    INFO(what);
    std::vector<outcome> o(2);
    std::vector<float> after(2, 0.0f);
    std::vector<float> untouched(2, 1.0f);
    const std::string error = rzt::launch_world(
        2,
        [&](communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          std::vector<float> data = {1.5f, 2.5f, 3.5f}, in = {-9.0f, -9.0f, -9.0f};
          const std::uint64_t sent = receiver_larger ? 1 : 3, expected = receiver_larger ? 3 : 1;
          o[r].capture([&] {
            if (comm.rank() == 0)
              send(comm, data.data(), sent, dtype::float32, 1);
            else
              recv(comm, in.data(), expected, dtype::float32, 0);
          });
          if (comm.rank() == 1) untouched[r] = in[0] == -9.0f && in[1] == -9.0f && in[2] == -9.0f;  // no partial copy
          // later transfers still match
          float x = 42.0f, y = 0.0f;
          if (comm.rank() == 0)
            send(comm, &x, 1, dtype::float32, 1);
          else
            recv(comm, &y, 1, dtype::float32, 0);
          after[r] = comm.rank() == 1 ? y : 42.0f;
        },
        10.0);
    CHECK(error.empty());
    const std::string sizes = receiver_larger ? "rank 0 sends 4 bytes but rank 1 expects 12 bytes"
                                              : "rank 0 sends 12 bytes but rank 1 expects 4 bytes";
    rzt::check_error(o[0], 0, errc::size_mismatch, {sizes, "send"});
    rzt::check_error(o[1], 1, errc::size_mismatch, {sizes, "recv"});
    CHECK(untouched[1] == 1.0f);
    CHECK(after[1] == 42.0f);
  }
}

TEST_CASE("C12: a sendrecv size mismatch between two ranks fails on both") {
  std::vector<outcome> o(2);
  const std::string error = rzt::launch_world(
      2,
      [&](communicator& comm) {
        std::vector<std::int32_t> out(4, comm.rank()), in(4, -1);
        const int peer = 1 - comm.rank();
        const std::uint64_t n_in = comm.rank() == 0 ? 4 : 2;  // rank 1 expects fewer than rank 0 sends
        o[static_cast<std::size_t>(comm.rank())].capture(
            [&] { sendrecv(comm, out.data(), 4, peer, in.data(), n_in, peer, dtype::int32); });
      },
      10.0);
  CHECK(error.empty());
  rzt::check_every_rank(o, errc::size_mismatch, {"rank 0 sends 16 bytes but rank 1 expects 8 bytes"});
}

TEST_CASE(
    "direct all_reduce of large float sums (the fused streaming loop): 2, 3 and 4 ranks, in and out of place, "
    "misaligned") {
  // 1048579 elements: above the streaming threshold (4 MiB) for float32 and float64, with a
  // tail after the 64-byte steps; shifted by one element so the outputs start unaligned.
  constexpr std::uint64_t count = 1048579;
  for (int n : {2, 3, 4})
    for (dtype t : {dtype::float32, dtype::float64})
      for (bool in_place : {false, true})
        for (int shift : {0, 1}) {
          INFO("world " << n << ", " << dtype_name(t) << (in_place ? ", in place" : ", out of place") << ", shift "
                        << shift);
          std::atomic<std::uint64_t> wrong{0};
          const std::string error = rzt::launch_world(n, [&](communicator& comm) {
            const int r = comm.rank();
            auto run = [&]<class T>() {
              std::vector<T> send(count + 1), recv(count + 1, T(-1));
              for (std::uint64_t i = 0; i < count; ++i)
                send[i + shift] = static_cast<T>(static_cast<double>(i % 1000) - 500.0) * static_cast<T>(r + 1);
              T* out = in_place ? send.data() + shift : recv.data() + shift;
              all_reduce(comm, send.data() + shift, out, count, t, reduce_kind::sum, with_algo(algorithm::direct));
              const double ranks_factor = n * (n + 1) / 2.0;  // sum of (r + 1)
              for (std::uint64_t i = 0; i < count; ++i)
                if (out[i] != static_cast<T>((static_cast<double>(i % 1000) - 500.0) * ranks_factor))
                  wrong.fetch_add(1);
              if (!in_place && shift == 1 && recv[0] != T(-1)) wrong.fetch_add(1);  // nothing before the buffer
            };
            if (t == dtype::float32)
              run.template operator()<float>();
            else
              run.template operator()<double>();
          });
          REQUIRE(error.empty());
          CHECK(wrong.load() == 0);
        }
}

TEST_CASE("C22: 16-bit sums, averages and premul_sums accumulate in float32 and round once, on every algorithm") {
  // C22 literally at world 8 (0.12890625) and world 4 (30000), scaled to worlds 2, 3, 5; and
  // inputs with exact float32 sums: all_reduce, reduce_scatter and reduce return the same bits
  // on ring, direct and halving_doubling (tests/backend/float32_accumulation_checks.hpp).
  std::uint64_t checked = 0, rounding_differs = 0;
  // The sanitizer builds' quick sweep keeps worlds 3, 4 and 8 (not a power of two; C22's own two).
#if defined(RINGZERO_TEST_SWEEP_QUICK)
  const std::vector<int> worlds = {3, 4, 8};
#else
  const std::vector<int> worlds = {2, 3, 4, 5, 8};
#endif
  for (int n : worlds) {
    INFO("world " << n);
    std::mutex m;
    std::vector<std::string> failures;
    const std::string error = rzt::launch_world(
        n,
        [&](communicator& comm) {
          const ringzero_test::accumulation_report report = ringzero_test::run_float32_accumulation_checks(comm);
          std::lock_guard<std::mutex> lock(m);
          failures.insert(failures.end(), report.failures.begin(), report.failures.end());
          checked += report.checked;
          rounding_differs += report.rounding_differs;
        },
        120.0);
    REQUIRE(error.empty());
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
  }
  CHECK(checked > 0);
  // the inputs do separate the two arithmetics: 16-bit partial sums would differ somewhere
  CHECK(rounding_differs > checked / 20);
}
