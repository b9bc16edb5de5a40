// Reproducible mode on the MPI backend (run under mpirun -np 2, 3, 4): all_reduce,
// reduce_scatter and reduce of every floating dtype and summing op, with every algorithm the
// backend offers (ring, halving_doubling, native MPI collectives), in and out of check mode,
// give the bits of the same function computed on one rank from every rank's inputs; so do
// accumulators whose contributions are spread over the ranks. A mode mismatch raises on every
// rank in check mode. CHECKs only (never REQUIRE), so every rank runs the same collectives.

#include <cstdint>
#include <vector>

#include "../../collective/reproducible_reference.hpp"
#include "mpi_test.hpp"

using namespace ringzero;
using ringzero_test::contains;
using ringzero_test::error_of;
using ringzero_test::throwing;

namespace {

constexpr algorithm mpi_reproducible_algorithms[] = {algorithm::ring, algorithm::halving_doubling, algorithm::native};

collective_options reproducible_with(algorithm a) {
  collective_options o;
  o.algo = a;
  o.reproducible = true;
  return o;
}

}  // namespace

TEST_CASE("MPI reproducible all_reduce, reduce_scatter and reduce equal the one-rank reference on every algorithm") {
  for (bool check : {false, true}) {
    mpi::communicator comm(MPI_COMM_WORLD, throwing(check));
    const int n = comm.world_size(), r = comm.rank();
    const auto ur = static_cast<std::size_t>(r);
    for (dtype t : rzt::floating_types)
      for (reduce_kind op : rzt::summing_ops)
        for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{4099}}) {
          const std::uint64_t es = dtype_size(t);
          // Every rank builds every rank's inputs (same seed) and computes the reference itself.
          const auto in = rzt::adversarial(t, n, count * static_cast<std::uint64_t>(n), 31 * count + 7, true);
          const rzt::bytes whole = rzt::reference(in, t, op, 0, count);
          const rzt::bytes mine = rzt::reference(in, t, op, static_cast<std::uint64_t>(r) * count, count);
          for (algorithm a : mpi_reproducible_algorithms) {
            INFO("check " << check << " " << dtype_name(t) << " " << reduce_kind_name(op) << " count " << count << " "
                          << algorithm_name(a));
            rzt::bytes out(count * es), scattered(count * es), root_out(count * es, 0x5A);
            rzt::bytes in_place(in[ur].begin(), in[ur].begin() + static_cast<std::ptrdiff_t>(count * es));
            const auto e = error_of([&] {
              all_reduce(comm, in[ur].data(), out.data(), count, t, rzt::op_for(op, r), reproducible_with(a));
              all_reduce(comm, in_place.data(), in_place.data(), count, t, rzt::op_for(op, r), reproducible_with(a));
              reduce_scatter(comm, in[ur].data(), scattered.data(), count, t, rzt::op_for(op, r), reproducible_with(a));
              reduce(comm, in[ur].data(), root_out.data(), count, t, rzt::op_for(op, r), n - 1, reproducible_with(a));
            });
            CHECK_FALSE(e.has_value());
            CHECK(out == whole);
            CHECK(in_place == whole);
            CHECK(scattered == mine);
            CHECK(root_out == (r == n - 1 ? whole : rzt::bytes(count * es, 0x5A)));
          }
        }
  }
}

TEST_CASE(
    "MPI reproducible accumulators: 8 contributions spread over the ranks, deposited or staged as copies, equal the "
    "one-rank reference") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(std::nullopt));
  const int n = comm.world_size(), r = comm.rank();
  const std::uint64_t total = 516;  // divisible by 2, 3 and 4 (reduce_scatter)
  for (dtype t : rzt::floating_types) {
    const auto in = rzt::adversarial(t, 8, total, 5, true);
    for (reduce_kind op : {reduce_kind::sum, reduce_kind::avg}) {
      const rzt::bytes expected = rzt::reference(in, t, op, 0, total);
      const std::uint64_t block = total / static_cast<std::uint64_t>(n), es = dtype_size(t);
      // Stage 0: every contribution deposited; 1: each rank's first one a copy, the rest
      // deposited; rank-dependent: ranks keep different numbers of copies; 8: all copies.
      for (std::uint64_t stage :
           {std::uint64_t{0}, std::uint64_t{1}, static_cast<std::uint64_t>(r % 3), std::uint64_t{8}})
        for (algorithm a : mpi_reproducible_algorithms) {
          INFO(dtype_name(t) << " " << reduce_kind_name(op) << " " << algorithm_name(a) << " stage " << stage);
          reproducible_accumulator acc(total, t, stage);
          for (int c = r; c < 8; c += n) acc.add(in[static_cast<std::size_t>(c)].data());
          rzt::bytes out(total * es), part(block * es);
          collective_options o;
          o.algo = a;
          const auto e = error_of([&] {
            all_reduce(comm, acc, out.data(), op, o);
            reduce_scatter(comm, acc, part.data(), op, o);
          });
          CHECK_FALSE(e.has_value());
          CHECK(out == expected);
          const auto b = expected.begin() + static_cast<std::ptrdiff_t>(static_cast<std::uint64_t>(r) * block * es);
          CHECK(part == rzt::bytes(b, b + static_cast<std::ptrdiff_t>(block * es)));
        }
    }
  }
}

TEST_CASE("MPI check mode: a reproducible mode mismatch raises on every rank; the communicator stays usable") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(true));
  const int n = comm.world_size();
  std::vector<float> v(8, 1.0f);
  collective_options o;
  o.reproducible = comm.rank() == 0;
  const auto e = error_of([&] { all_reduce(comm, std::span<float>(v), reduce_kind::sum, o); });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::contract_mismatch);
    CHECK(contains(e->what(), "reproducible mode mismatch"));
    CHECK(contains(e->what(), "rank 0: on; " + ringzero_test::ranks_text(1, n - 1) + ": off"));
  }
  const auto refused =
      error_of([&] { all_reduce(comm, std::span<float>(v), reduce_kind::max, reproducible_with(algorithm::ring)); });
  CHECK(refused.has_value());
  if (refused) CHECK(contains(refused->what(), "float32 max"));
  all_reduce(comm, std::span<float>(v), reduce_kind::sum, reproducible_with(algorithm::ring));
  CHECK(v[0] == static_cast<float>(n));
}
