// Traffic counters (backend/traffic.hpp): each collective on each algorithm and world size counts
// exactly the bytes its schedule moves between ranks: every byte sent is received, the totals
// over the ranks are the schedule's (a ring all_reduce sends 2(n-1) buffers in all), calls are
// counted once per collective and point-to-point transfer, copies to oneself are not traffic,
// and a world of one moves nothing.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "harness.hpp"
#include "ringzero/ringzero.hpp"

using namespace ringzero;
using rzt::every_algorithm;
using rzt::with_algo;

namespace {

/// Runs one `kind` of `count` float32 elements (per rank's block for reduce_scatter, all_gather
/// and all_to_all) with `a` on `world` ranks; returns each rank's traffic difference.
std::vector<traffic_counts> traffic_of(int world, algorithm a, collective_kind kind, std::uint64_t count) {
  std::vector<traffic_counts> seen(static_cast<std::size_t>(world));
  const std::string error = rzt::launch_world(world, [&](communicator& comm) {
    const auto n = static_cast<std::uint64_t>(comm.world_size());
    std::vector<float> in(count * n, 1.0f), out(count * n, 0.0f);
    const collective_options o = with_algo(a);
    const traffic_counts before = comm.traffic();
    switch (kind) {
      case collective_kind::all_reduce:
        all_reduce(comm, in.data(), out.data(), count, dtype::float32, reduce_kind::sum, o);
        break;
      case collective_kind::reduce_scatter:
        reduce_scatter(comm, in.data(), out.data(), count, dtype::float32, reduce_kind::sum, o);
        break;
      case collective_kind::all_gather: all_gather(comm, in.data(), out.data(), count, dtype::float32, o); break;
      case collective_kind::broadcast: broadcast(comm, in.data(), out.data(), count, dtype::float32, 1 % n, o); break;
      case collective_kind::reduce:
        reduce(comm, in.data(), out.data(), count, dtype::float32, reduce_kind::sum, 1 % n, o);
        break;
      case collective_kind::all_to_all: all_to_all(comm, in.data(), out.data(), count, dtype::float32, o); break;
      default: break;
    }
    seen[static_cast<std::size_t>(comm.rank())] = comm.traffic() - before;
  });
  REQUIRE(error.empty());
  return seen;
}

}  // namespace

TEST_CASE("traffic: every byte sent is received; ring, direct and halving-doubling move their schedules' bytes") {
  const collective_kind kinds[] = {collective_kind::all_reduce, collective_kind::reduce_scatter,
                                   collective_kind::all_gather, collective_kind::broadcast,
                                   collective_kind::reduce,     collective_kind::all_to_all};
  for (int world : {2, 3, 4, 5})
    for (collective_kind k : kinds)
      for (std::uint64_t count : {37u, 1000u}) {
        std::uint64_t reduce_total = 0;  // ring's, which direct must equal
        for (algorithm a : every_algorithm) {
          if (a == algorithm::halving_doubling && k == collective_kind::all_to_all) continue;
          INFO(world << " ranks, " << algorithm_name(a) << " " << collective_name(k) << ", " << count << " floats");
          const auto seen = traffic_of(world, a, k, count);
          std::uint64_t sent = 0, received = 0;
          for (const traffic_counts& t : seen) {
            for (collective_kind other : kinds) CHECK(t.of(other).calls == (other == k ? 1u : 0u));
            CHECK(t.total().estimated_sent == 0);
            CHECK(t.total() == t.of(k));
            sent += t.of(k).sent;
            received += t.of(k).received;
          }
          CHECK(sent == received);
          const std::uint64_t n = static_cast<std::uint64_t>(world), m = n - 1, bytes = count * sizeof(float);
          // Bandwidth-optimal schedules: ring and direct always, halving-doubling on a power of
          // two for the vector sizes it splits (its small all_reduce doubles the whole buffer).
          const bool optimal = a != algorithm::halving_doubling || ((world & (world - 1)) == 0 && count == 1000);
          if (k == collective_kind::all_reduce && optimal) CHECK(sent == 2 * m * bytes);
          if ((k == collective_kind::reduce_scatter || k == collective_kind::all_gather ||
               k == collective_kind::all_to_all) &&
              optimal)
            CHECK(sent == n * m * bytes);
          if (k == collective_kind::broadcast && a != algorithm::halving_doubling) CHECK(sent == m * bytes);
          if (k == collective_kind::reduce_scatter && a != algorithm::halving_doubling)
            for (const traffic_counts& t : seen) CHECK(t.of(k).sent == m * bytes);
          if (k == collective_kind::reduce) {
            if (a == algorithm::ring) reduce_total = sent;
            if (a == algorithm::direct) CHECK(sent == reduce_total);
            CHECK(sent > m * bytes);  // a reduce_scatter, then the blocks to the root
          }
        }
      }
}

TEST_CASE("traffic: a world of one, point-to-point transfers, copies to oneself and asynchronous calls") {
  // A world of one runs the call and moves nothing.
  std::vector<traffic_counts> one(1);
  CHECK(rzt::launch_world(1, [&](communicator& comm) {
          std::vector<float> v(64, 1.0f);
          const traffic_counts before = comm.traffic();
          all_reduce(comm, std::span<float>(v), reduce_kind::sum);
          one[0] = comm.traffic() - before;
        }).empty());
  CHECK(one[0].of(collective_kind::all_reduce).calls == 1);
  CHECK(one[0].total().total_sent() == 0);
  CHECK(one[0].total().received == 0);

  std::vector<traffic_counts> seen(3);
  CHECK(rzt::launch_world(3, [&](communicator& comm) {
          const int r = comm.rank();
          std::vector<double> a(100, 1.0), b(100, 0.0);
          const traffic_counts before = comm.traffic();
          if (r == 0) send(comm, a.data(), 100, dtype::float64, 1);
          if (r == 1) recv(comm, b.data(), 100, dtype::float64, 0);
          // A copy to oneself is not traffic.
          sendrecv(comm, a.data(), 10, r, b.data(), 10, r, dtype::float64);
          // Asynchronous: counted once it ran.
          work w = all_gather_async(comm, a.data(), b.data(), 20, dtype::float64);
          w.wait();
          seen[static_cast<std::size_t>(r)] = comm.traffic() - before;
        }).empty());
  CHECK(seen[0].of(collective_kind::send).sent == 800);
  CHECK(seen[0].of(collective_kind::send).calls == 2);  // the send and the sendrecv
  CHECK(seen[1].of(collective_kind::recv).received == 800);
  CHECK(seen[1].of(collective_kind::recv).calls == 1);
  CHECK(seen[2].of(collective_kind::send).sent == 0);
  CHECK(seen[2].of(collective_kind::send).received == 0);
  for (const traffic_counts& t : seen) {
    CHECK(t.of(collective_kind::all_gather).calls == 1);
    CHECK(t.of(collective_kind::all_gather).sent == 2 * 20 * sizeof(double));
    CHECK(t.of(collective_kind::all_gather).received == 2 * 20 * sizeof(double));
  }
}

TEST_CASE("traffic: a 16-bit sum moves float32 partial results, and the ring gathers 16-bit results") {
  // The float32 accumulation of 16-bit sums (docs/numerics.md) widens the partial results that
  // ring and halving-doubling move; the ring all-gathers the rounded 16-bit results (half its
  // traffic); direct reads the 16-bit inputs. 1024 bfloat16 on 2 ranks: 512 per block.
  for (algorithm a : every_algorithm) {
    std::vector<traffic_counts> seen(2);
    std::vector<std::vector<bfloat16>> results(2);
    CHECK(rzt::launch_world(2, [&](communicator& comm) {
            std::vector<bfloat16> v(1024);
            for (std::size_t i = 0; i < v.size(); ++i)
              v[i] = bfloat16(1.0f + static_cast<float>(i % 7) / 256.0f + static_cast<float>(comm.rank()) / 512.0f);
            const traffic_counts before = comm.traffic();
            all_reduce(comm, v.data(), v.data(), v.size(), dtype::bfloat16, reduce_kind::sum, with_algo(a));
            seen[static_cast<std::size_t>(comm.rank())] = comm.traffic() - before;
            results[static_cast<std::size_t>(comm.rank())] = v;
          }).empty());
    const std::uint64_t per_rank = a == algorithm::ring     ? 512 * sizeof(float) + 512 * sizeof(bfloat16)
                                   : a == algorithm::direct ? 1024 * sizeof(bfloat16)
                                                            : 1024 * sizeof(float);
    for (const traffic_counts& t : seen) CHECK(t.total().sent == per_rank);
    // Every element is the float32 sum of the two inputs rounded once, on both ranks.
    bool exact = true;
    for (std::size_t i = 0; i < 1024; ++i) {
      const float x = 1.0f + static_cast<float>(i % 7) / 256.0f;
      const float sum = static_cast<float>(bfloat16(x)) + static_cast<float>(bfloat16(x + 1.0f / 512.0f));
      for (const auto& r : results) exact = exact && r[i].bits == bfloat16(sum).bits;
    }
    CHECK(exact);
  }
}

TEST_CASE("traffic: the ring estimate of native collectives") {
  using ringzero::detail::ring_bytes_per_rank;
  static_assert(ring_bytes_per_rank(collective_kind::all_reduce, 4, 1000) == 1500);
  static_assert(ring_bytes_per_rank(collective_kind::reduce_scatter, 4, 1000) == 3000);
  static_assert(ring_bytes_per_rank(collective_kind::all_gather, 3, 10) == 20);
  static_assert(ring_bytes_per_rank(collective_kind::broadcast, 4, 1000) == 750);
  static_assert(ring_bytes_per_rank(collective_kind::all_to_all, 2, 8) == 8);
  static_assert(ring_bytes_per_rank(collective_kind::barrier, 4, 1000) == 0);
  static_assert(ring_bytes_per_rank(collective_kind::all_reduce, 1, 1000) == 0);
  CHECK(ring_bytes_per_rank(collective_kind::all_reduce, 2, 7) == 7);
}
