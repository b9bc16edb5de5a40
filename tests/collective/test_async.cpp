// Asynchronous collectives: several `_async` calls in flight then waited, ordering between
// asynchronous and blocking calls (issue order is execution order), errors delivered through
// `work::wait()`, and 10 000 back-to-back small all_reduce calls with correct results and no
// growth of scratch memory (speed is measured by benchmarks, not here).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "ringzero/ringzero.hpp"

using namespace ringzero;
using rzt::check_error;
using rzt::check_every_rank;
using rzt::every_algorithm;
using rzt::outcome;
using rzt::with_algo;

TEST_CASE("a default work handle is complete and empty") {
  const work w;
  CHECK_FALSE(w.valid());
  CHECK(w.test());
  CHECK_NOTHROW(w.wait());
}

TEST_CASE("every collective in flight at once, then waited, gives exact results") {
  for (int world : {3, 4})
    for (algorithm a : every_algorithm) {
      INFO("world " << world << " " << algorithm_name(a));
      std::vector<std::uint64_t> wrong(static_cast<std::size_t>(world), 0);
      std::vector<int> all_done(static_cast<std::size_t>(world), 0);
      const std::string error = rzt::launch_world(world, [&](communicator& comm) {
        const int r = comm.rank(), n = comm.world_size();
        const auto un = static_cast<std::uint64_t>(n);
        const std::uint64_t c = 37;
        const auto o = with_algo(a);
        auto v = [](int rank, std::uint64_t i) { return static_cast<std::int32_t>(rank * 1000 + static_cast<int>(i)); };
        std::vector<std::int32_t> sum_in(c), sum_out(c, -1), max_buf(c), rs_in(c * un), rs_out(c, -1),
            ag_out(c * un, -1), bc(c, -1), red_in(c), red_out(c, -1), a2a_in(c * un), a2a_out(c * un, -1);
        for (std::uint64_t i = 0; i < c; ++i) sum_in[i] = max_buf[i] = red_in[i] = v(r, i);
        for (std::uint64_t j = 0; j < c * un; ++j) rs_in[j] = a2a_in[j] = v(r, j);
        if (r == n - 1)
          for (std::uint64_t i = 0; i < c; ++i) bc[i] = v(r, i) * 3;
        std::vector<work> pending;
        pending.push_back(all_reduce_async(comm, sum_in.data(), sum_out.data(), c, dtype::int32, reduce_kind::sum, o));
        pending.push_back(all_reduce_async(comm, std::span<std::int32_t>(max_buf), reduce_kind::max, o));
        pending.push_back(
            reduce_scatter_async(comm, rs_in.data(), rs_out.data(), c, dtype::int32, reduce_kind::sum, o));
        pending.push_back(all_gather_async(comm, sum_in.data(), ag_out.data(), c, dtype::int32, o));
        pending.push_back(broadcast_async(comm, bc.data(), bc.data(), c, dtype::int32, n - 1, o));
        pending.push_back(reduce_async(comm, red_in.data(), red_out.data(), c, dtype::int32, reduce_kind::min, 0, o));
        if (a != algorithm::halving_doubling)
          pending.push_back(all_to_all_async(comm, a2a_in.data(), a2a_out.data(), c, dtype::int32, o));
        pending.push_back(barrier_async(comm, o));
        bool done = true;
        for (const work& w : pending) done = done && w.valid();
        for (auto it = pending.rbegin(); it != pending.rend(); ++it) it->wait();  // any order
        for (const work& w : pending) done = done && w.test();
        all_done[static_cast<std::size_t>(r)] = done;
        std::uint64_t& bad = wrong[static_cast<std::size_t>(r)];
        auto sum_of = [&](std::uint64_t i) {
          std::int32_t s = 0;
          for (int q = 0; q < n; ++q) s += v(q, i);
          return s;
        };
        for (std::uint64_t i = 0; i < c; ++i) {
          bad += sum_out[i] != sum_of(i);
          bad += max_buf[i] != v(n - 1, i);
          bad += rs_out[i] != sum_of(static_cast<std::uint64_t>(r) * c + i);
          bad += bc[i] != v(n - 1, i) * 3;
          if (r == 0)
            bad += red_out[i] != v(0, i);
          else
            bad += red_out[i] != -1;
        }
        for (std::uint64_t q = 0; q < un; ++q)
          for (std::uint64_t i = 0; i < c; ++i) {
            bad += ag_out[q * c + i] != v(static_cast<int>(q), i);
            if (a != algorithm::halving_doubling)
              bad += a2a_out[q * c + i] != v(static_cast<int>(q), static_cast<std::uint64_t>(r) * c + i);
          }
      });
      REQUIRE(error.empty());
      for (int r = 0; r < world; ++r) {
        CHECK_MESSAGE(wrong[static_cast<std::size_t>(r)] == 0, "rank " << r);
        CHECK(all_done[static_cast<std::size_t>(r)] == 1);
      }
    }
}

TEST_CASE("issue order is execution order: async calls chain, blocking calls run after pending async work") {
  for (algorithm a : every_algorithm) {
    INFO(algorithm_name(a));
    const int world = 4;
    std::vector<std::int64_t> chained(world), after_blocking(world), received(world, -1);
    std::vector<int> complete_after_blocking(world, 0);
    std::vector<std::uint64_t> issued(world, 0);
    const std::string error = rzt::launch_world(world, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      const auto o = with_algo(a);
      // three in-place sums of the same buffer, all asynchronous: each must see the previous
      std::vector<std::int64_t> x(1000, comm.rank() + 1);
      work w1 = all_reduce_async(comm, std::span<std::int64_t>(x), reduce_kind::sum, o);
      work w2 = all_reduce_async(comm, std::span<std::int64_t>(x), reduce_kind::sum, o);
      work w3 = all_reduce_async(comm, std::span<std::int64_t>(x), reduce_kind::sum, o);
      // a blocking call on the same buffer runs after them, so when it returns all are done
      all_reduce(comm, x.data(), x.data(), x.size(), dtype::int64, reduce_kind::sum, o);
      complete_after_blocking[r] = w1.test() && w2.test() && w3.test();
      w3.wait();
      after_blocking[r] = x[999];
      // async then point-to-point: the transfer also waits for the pending collective
      std::vector<std::int64_t> y(8, comm.rank());
      work w4 = all_reduce_async(comm, std::span<std::int64_t>(y), reduce_kind::max, o);
      if (comm.rank() == 0) send(comm, y.data(), 8, dtype::int64, 1);
      if (comm.rank() == 1) recv(comm, y.data(), 8, dtype::int64, 0);
      w4.wait();
      received[r] = y[7];
      chained[r] = x[0];
      issued[r] = comm.issued();
    });
    REQUIRE(error.empty());
    // 10 after one sum, 40, 160, then 640 after the blocking call
    for (int r = 0; r < world; ++r) {
      CHECK(after_blocking[static_cast<std::size_t>(r)] == 640);
      CHECK(chained[static_cast<std::size_t>(r)] == 640);
      CHECK(complete_after_blocking[static_cast<std::size_t>(r)] == 1);
      CHECK(received[static_cast<std::size_t>(r)] == world - 1);
      CHECK(issued[static_cast<std::size_t>(r)] == 5);
    }
  }
}

TEST_CASE("errors of asynchronous calls are delivered by work::wait on every rank") {
  SUBCASE("contract mismatch: issue returns, wait throws, every wait the same, the communicator stays usable") {
    std::vector<outcome> first(3), second(3);
    std::vector<int> issued_ok(3, 0), usable(3, 0);
    const std::string error = rzt::launch_world(3, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      std::vector<float> x(16, 1.0f), y(16, 0.0f);
      work w;
      outcome issue;
      issue.capture([&] {
        w = all_reduce_async(comm, x.data(), y.data(), comm.rank() == 1 ? 8 : 16, dtype::float32, reduce_kind::sum);
      });
      issued_ok[r] = !issue.threw && w.valid();
      first[r].capture([&] { w.wait(); });
      second[r].capture([&] { w.wait(); });
      float one = 1.0f, total = 0.0f;
      all_reduce(comm, &one, &total, 1, dtype::float32, reduce_kind::sum);
      usable[r] = total == 3.0f;
    });
    CHECK(error.empty());
    check_every_rank(first, errc::contract_mismatch, {"all_reduce #0", "count mismatch", "ranks 0, 2: 16; rank 1: 8"});
    for (int r = 0; r < 3; ++r) {
      CHECK(second[static_cast<std::size_t>(r)].message == first[static_cast<std::size_t>(r)].message);
      CHECK(issued_ok[static_cast<std::size_t>(r)] == 1);
      CHECK(usable[static_cast<std::size_t>(r)] == 1);
    }
  }
  SUBCASE("invalid argument on one rank, behind a successful async call") {
    std::vector<outcome> good(2), bad(2);
    const std::string error = rzt::launch_world(2, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      std::vector<std::int32_t> x(4, 1), y(4, 0);
      work ok = all_reduce_async(comm, x.data(), y.data(), 4, dtype::int32, reduce_kind::sum);
      work fails = broadcast_async(comm, comm.rank() == 0 ? nullptr : x.data(), y.data(), 4, dtype::int32, 0);
      good[r].capture([&] { ok.wait(); });
      bad[r].capture([&] { fails.wait(); });
    });
    CHECK(error.empty());
    for (const auto& g : good) CHECK_MESSAGE(!g.threw, g.message);
    check_every_rank(bad, errc::invalid_argument, {"broadcast #1", "rank 0: send buffer is null with count 4"});
  }
  SUBCASE("timeout: a rank that never issues is named by every waiting rank's work") {
    std::vector<outcome> o(3);
    std::atomic<int> failed{0};
    const std::string error = rzt::launch_world(
        3,
        [&](communicator& comm) {
          if (comm.rank() == 1) {
            while (failed.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            return;
          }
          std::vector<double> x(4, 1.0), y(4, 0.0);
          work w = reduce_async(comm, x.data(), y.data(), 4, dtype::float64, reduce_kind::sum, 0);
          o[static_cast<std::size_t>(comm.rank())].capture([&] { w.wait(); });
          failed.fetch_add(1);
        },
        0.25);
    CHECK(error.empty());
    check_error(o[0], 0, errc::timeout, {"rank 1", "reduce #0"});
    check_error(o[2], 2, errc::timeout, {"rank 1", "reduce #0"});
  }
  SUBCASE("a blocking call queued behind a failed async call still reports its own outcome") {
    std::vector<outcome> async_failure(2), blocking(2);
    std::vector<std::int32_t> results(2, 0);
    const std::string error = rzt::launch_world(2, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      std::int32_t x = 5, y = 0;
      work w = all_reduce_async(comm, &x, &y, 1, comm.rank() == 0 ? dtype::int32 : dtype::uint32, reduce_kind::sum);
      std::int32_t a = comm.rank() + 1, b = 0;
      blocking[r].capture([&] { all_reduce(comm, &a, &b, 1, dtype::int32, reduce_kind::sum); });
      async_failure[r].capture([&] { w.wait(); });
      results[r] = b;
    });
    CHECK(error.empty());
    check_every_rank(async_failure, errc::contract_mismatch, {"dtype mismatch"});
    for (int r = 0; r < 2; ++r) {
      CHECK_MESSAGE(!blocking[static_cast<std::size_t>(r)].threw, blocking[static_cast<std::size_t>(r)].message);
      CHECK(results[static_cast<std::size_t>(r)] == 3);
    }
  }
}

namespace {

/// 10 000 back-to-back small all_reduce calls on `world` ranks (algorithm `a`, blocking or
/// asynchronous in batches of 100 in flight); returns the number of wrong elements per rank and
/// whether scratch memory grew after the first 100 calls.
void back_to_back(int world, algorithm a, bool async) {
  INFO("world " << world << " " << algorithm_name(a) << (async ? " async" : " blocking"));
  constexpr int calls = 10000, batch = 100;
  constexpr std::uint64_t count = 8;
  std::vector<std::uint64_t> wrong(static_cast<std::size_t>(world), 0);
  std::vector<std::size_t> scratch_warm(static_cast<std::size_t>(world), 0),
      scratch_end(static_cast<std::size_t>(world), 0);
  const std::string error = rzt::launch_world(
      world,
      [&](communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        const auto o = with_algo(a);
        // value of rank q at call i, element e; the sums stay exact in float32
        auto value = [](int q, int i, std::uint64_t e) {
          return static_cast<float>((i % 997) + q * 3 + static_cast<int>(e));
        };
        auto expected = [&](int i, std::uint64_t e) {
          float s = 0.0f;
          for (int q = 0; q < world; ++q) s += value(q, i, e);
          return s;
        };
        std::vector<float> in(count * batch), out(count * batch);
        for (int i0 = 0; i0 < calls; i0 += batch) {
          std::vector<work> pending;
          for (int i = i0; i < i0 + batch; ++i) {
            float* src = in.data() + static_cast<std::uint64_t>(i - i0) * count;
            float* dst = out.data() + static_cast<std::uint64_t>(i - i0) * count;
            for (std::uint64_t e = 0; e < count; ++e) src[e] = value(comm.rank(), i, e);
            if (async)
              pending.push_back(all_reduce_async(comm, src, dst, count, dtype::float32, reduce_kind::sum, o));
            else
              all_reduce(comm, src, dst, count, dtype::float32, reduce_kind::sum, o);
          }
          for (const work& w : pending) w.wait();
          for (int i = i0; i < i0 + batch; ++i)
            for (std::uint64_t e = 0; e < count; ++e)
              wrong[r] += out[static_cast<std::uint64_t>(i - i0) * count + e] != expected(i, e);
          if (i0 == 0) scratch_warm[r] = detail::transport_of(comm).scratch_bytes();
        }
        scratch_end[r] = detail::transport_of(comm).scratch_bytes();
        if (comm.issued() != static_cast<std::uint64_t>(calls)) wrong[r] += 1;
      },
      120.0);
  REQUIRE(error.empty());
  for (int r = 0; r < world; ++r) {
    CHECK_MESSAGE(wrong[static_cast<std::size_t>(r)] == 0, "rank " << r);
    CHECK(scratch_end[static_cast<std::size_t>(r)] == scratch_warm[static_cast<std::size_t>(r)]);
  }
}

}  // namespace

TEST_CASE("10 000 back-to-back small all_reduce calls complete with correct results") {
  for (algorithm a : {algorithm::automatic, algorithm::ring, algorithm::direct, algorithm::halving_doubling})
    back_to_back(2, a, false);
  back_to_back(4, algorithm::automatic, false);
  back_to_back(2, algorithm::automatic, true);
  back_to_back(3, algorithm::halving_doubling, true);
}
