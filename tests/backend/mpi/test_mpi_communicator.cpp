// The MPI communicator itself: split (like ncclCommSplit), a user communicator, asynchronous
// collectives on the progress thread, pipelined transfers in many small slices, and the cases
// of shared/cases/README.md that apply to collectives (C1-C5, C9, C10), each on the world size
// it names (made with split where the job is larger); the traffic counters, the paced link and
// the tuning table (communicator_options::tuning, RINGZERO_MPI_TUNING).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include <unistd.h>

#include "mpi_test.hpp"

using namespace ringzero;
using ringzero_test::error_of;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// The algorithms every collective test runs with on MPI.
const algorithm mpi_algorithms[] = {algorithm::ring, algorithm::halving_doubling, algorithm::native};

collective_options with(algorithm a) {
  collective_options o;
  o.algo = a;
  return o;
}

/// A communicator of the first `size` world ranks (nullptr on the others), made by split.
std::unique_ptr<mpi::communicator> first_ranks(mpi::communicator& world, int size) {
  return world.split(world.rank() < size ? 0 : -1, world.rank());
}

}  // namespace

TEST_CASE("split groups ranks by color, orders them by key, and gives nullptr to a negative color") {
  mpi::communicator world;
  const int n = world.world_size(), r = world.rank();
  // Two colors by parity; keys reverse the order inside each color.
  auto sub = world.split(r % 2, -r);
  CHECK(sub != nullptr);
  if (sub) {
    int members = 0, rank_in_sub = 0;
    for (int q = 0; q < n; ++q)
      if (q % 2 == r % 2) {
        ++members;
        if (q > r) ++rank_in_sub;  // higher world ranks have lower keys
      }
    CHECK(sub->world_size() == members);
    CHECK(sub->rank() == rank_in_sub);
    std::int64_t mine = r, sum = 0;
    for (int q = r % 2; q < n; q += 2) sum += q;
    all_reduce(*sub, &mine, &mine, 1, dtype::int64, reduce_kind::sum);
    CHECK(mine == sum);
    CHECK(sub->checking() == world.checking());
    CHECK(sub->timeout() == world.timeout());
  }
  // Rank 0 opts out.
  auto some = world.split(r == 0 ? -1 : 0, 0);
  CHECK((some == nullptr) == (r == 0));
  if (some) CHECK(some->world_size() == n - 1);
  // The parent still works after its children.
  std::vector<float> v(5, 1.0f);
  all_reduce(world, std::span<float>(v));
  CHECK(v[4] == static_cast<float>(n));
}

TEST_CASE("a communicator over a user communicator duplicates it and leaves it to the user") {
  MPI_Comm mine = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, 0, world_size() - world_rank(), &mine);  // reversed order
  {
    mpi::communicator comm(mine);
    CHECK(comm.rank() == world_size() - 1 - world_rank());
    CHECK(comm.handle() != mine);
    std::int32_t x = comm.rank();
    all_reduce(comm, &x, &x, 1, dtype::int32, reduce_kind::max);
    CHECK(x == comm.world_size() - 1);
  }
  int size = 0;
  CHECK(MPI_Comm_size(mine, &size) == MPI_SUCCESS);  // still valid: ours was a duplicate
  MPI_Comm_free(&mine);
}

TEST_CASE("asynchronous collectives run in issue order on the progress thread") {
  mpi::communicator comm;
  const int n = comm.world_size(), r = comm.rank();
  constexpr int k = 8;
  std::vector<std::vector<std::int64_t>> buffers(k, std::vector<std::int64_t>(3001));
  std::vector<work> handles;
  for (int i = 0; i < k; ++i) {
    std::fill(buffers[static_cast<std::size_t>(i)].begin(), buffers[static_cast<std::size_t>(i)].end(), r * 100 + i);
    handles.push_back(all_reduce_async(comm, std::span<std::int64_t>(buffers[static_cast<std::size_t>(i)]),
                                       reduce_kind::sum, with(mpi_algorithms[i % 3])));
  }
  std::vector<std::int64_t> after(10, r);
  all_reduce(comm, std::span<std::int64_t>(after), reduce_kind::max);  // blocking, queued behind the async ones
  for (auto& h : handles) h.wait();
  const std::int64_t rank_sum = static_cast<std::int64_t>(n) * (n - 1) / 2;
  for (int i = 0; i < k; ++i) {
    const auto& b = buffers[static_cast<std::size_t>(i)];
    CHECK(b.front() == rank_sum * 100 + static_cast<std::int64_t>(n) * i);
    CHECK(b.back() == b.front());
  }
  CHECK(after[9] == n - 1);
}

TEST_CASE("transfers in many small slices (more than the posting window) stay exact") {
  mpi::communicator_options o;
  o.slice_bytes = 4096;
  o.pipeline_depth = 2;
  mpi::communicator comm(MPI_COMM_WORLD, o);
  const int n = comm.world_size(), r = comm.rank();
  for (algorithm a : {algorithm::ring, algorithm::halving_doubling}) {
    CAPTURE(algorithm_name(a));
    // 100003 doubles: ~800 KB, ~196 slices per full message; the last slice is short.
    std::vector<double> v(100003);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i % 7) + static_cast<std::size_t>(r));
    all_reduce(comm, v.data(), v.data(), v.size(), dtype::float64, reduce_kind::sum, with(a));
    bool exact = true;
    for (std::size_t i = 0; i < v.size(); ++i)
      exact = exact && v[i] == static_cast<double>(n * static_cast<int>(i % 7) + n * (n - 1) / 2);
    CHECK(exact);
    std::vector<std::int32_t> mine(70001, r), all(70001 * static_cast<std::size_t>(n), -1);
    all_gather(comm, mine.data(), all.data(), mine.size(), dtype::int32, with(a));
    bool gathered = true;
    for (std::size_t i = 0; i < all.size(); ++i) gathered = gathered && all[i] == static_cast<std::int32_t>(i / 70001);
    CHECK(gathered);
  }
}

TEST_CASE("C1: int8 sum wraps (world 2: 120 + 100 = -36)") {
  mpi::communicator world;
  auto comm = first_ranks(world, 2);
  if (comm) {
    for (algorithm a : mpi_algorithms) {
      CAPTURE(algorithm_name(a));
      std::vector<std::int8_t> v(77, comm->rank() == 0 ? 120 : 100);
      all_reduce(*comm, std::span<std::int8_t>(v), reduce_kind::sum, with(a));
      CHECK(std::all_of(v.begin(), v.end(), [](std::int8_t x) { return x == -36; }));
    }
  }
}

TEST_CASE("C2: uint64 min/max compare unsigned (world 4)") {
  mpi::communicator world;
  if (world.world_size() >= 4) {
    auto comm = first_ranks(world, 4);
    if (comm) {
      const std::uint64_t top = std::numeric_limits<std::uint64_t>::max();
      for (algorithm a : mpi_algorithms) {
        CAPTURE(algorithm_name(a));
        std::vector<std::uint64_t> v(9, comm->rank() == 2 ? 0 : top);
        all_reduce(*comm, std::span<std::uint64_t>(v), reduce_kind::min, with(a));
        CHECK(std::all_of(v.begin(), v.end(), [](std::uint64_t x) { return x == 0; }));
        std::vector<std::uint64_t> w(9, comm->rank() == 2 ? top : (top >> 1));
        all_reduce(*comm, std::span<std::uint64_t>(w), reduce_kind::max, with(a));
        CHECK(std::all_of(w.begin(), w.end(), [&](std::uint64_t x) { return x == top; }));
      }
    }
  }
}

TEST_CASE("C3: int32 avg sums exactly, then truncates toward zero (world 3)") {
  mpi::communicator world;
  if (world.world_size() >= 3) {
    auto comm = first_ranks(world, 3);
    if (comm) {
      const std::int32_t values[3] = {1, 2, 2};
      for (algorithm a : mpi_algorithms) {
        CAPTURE(algorithm_name(a));
        std::vector<std::int32_t> v(5, values[comm->rank()]), w(5, -values[comm->rank()]);
        all_reduce(*comm, std::span<std::int32_t>(v), reduce_kind::avg, with(a));
        all_reduce(*comm, std::span<std::int32_t>(w), reduce_kind::avg, with(a));
        CHECK(v[4] == 1);
        CHECK(w[4] == -1);
      }
    }
  }
}

TEST_CASE("C4: a world of one returns its input bit for bit (bfloat16 avg, 1000 values)") {
  mpi::communicator world;
  auto alone = world.split(world.rank(), 0);
  CHECK(alone != nullptr);
  if (alone) {
    CHECK(alone->world_size() == 1);
    for (algorithm a : mpi_algorithms) {
      CAPTURE(algorithm_name(a));
      std::vector<bfloat16> in(1000), out(1000, bfloat16(-7.0f));
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = bfloat16(static_cast<float>(i) * 0.37f - 100.0f);
      all_reduce(*alone, in.data(), out.data(), in.size(), dtype::bfloat16, reduce_kind::avg, with(a));
      CHECK(std::memcmp(in.data(), out.data(), in.size() * sizeof(bfloat16)) == 0);
    }
  }
}

TEST_CASE("C5: every collective with zero elements and null pointers succeeds") {
  mpi::communicator world;
  for (algorithm a : mpi_algorithms) {
    CAPTURE(algorithm_name(a));
    const auto o = with(a);
    const auto e = error_of([&] {
      all_reduce(world, nullptr, nullptr, 0, dtype::float32, reduce_kind::sum, o);
      reduce_scatter(world, nullptr, nullptr, 0, dtype::float32, reduce_kind::sum, o);
      all_gather(world, nullptr, nullptr, 0, dtype::float32, o);
      broadcast(world, nullptr, nullptr, 0, dtype::float32, 0, o);
      reduce(world, nullptr, nullptr, 0, dtype::float32, reduce_kind::sum, 0, o);
      if (a != algorithm::halving_doubling) all_to_all(world, nullptr, nullptr, 0, dtype::float32, o);
      barrier(world, o);
    });
    CHECK_FALSE(e.has_value());
  }
}

TEST_CASE("C9: reduce leaves non-root receive buffers exactly as they were (world 2, int64)") {
  mpi::communicator world;
  auto comm = first_ranks(world, 2);
  if (comm) {
    for (algorithm a : mpi_algorithms) {
      CAPTURE(algorithm_name(a));
      std::vector<std::int64_t> in =
          comm->rank() == 0 ? std::vector<std::int64_t>{1, 2, 3, 4} : std::vector<std::int64_t>{4, 5, 6, 7};
      std::vector<std::int64_t> out(4, 99);
      reduce(*comm, in.data(), out.data(), 4, dtype::int64, reduce_kind::sum, 0, with(a));
      if (comm->rank() == 0)
        CHECK(out == std::vector<std::int64_t>{5, 7, 9, 11});
      else
        CHECK(out == std::vector<std::int64_t>{99, 99, 99, 99});
    }
  }
}

TEST_CASE("C10: counts that do not divide (1, 3, 7 on world 4; 1000003 on world 3)") {
  mpi::communicator world;
  auto run = [](mpi::communicator& c, std::uint64_t count) {
    const int n = c.world_size(), r = c.rank();
    for (algorithm a : mpi_algorithms) {
      CAPTURE(algorithm_name(a));
      CAPTURE(count);
      std::vector<std::int64_t> v(count);
      std::iota(v.begin(), v.end(), static_cast<std::int64_t>(r));
      all_reduce(c, std::span<std::int64_t>(v), reduce_kind::sum, with(a));
      bool ok = true;
      for (std::uint64_t i = 0; i < count; ++i)
        ok = ok && v[i] == static_cast<std::int64_t>(n) * static_cast<std::int64_t>(i) + n * (n - 1) / 2;
      CHECK(ok);
      std::vector<std::int64_t> blocks(count * static_cast<std::uint64_t>(n), 1), mine(count, 0);
      reduce_scatter(c, blocks.data(), mine.data(), count, dtype::int64, reduce_kind::sum, with(a));
      CHECK(std::all_of(mine.begin(), mine.end(), [&](std::int64_t x) { return x == n; }));
      std::vector<std::int64_t> gathered(count * static_cast<std::uint64_t>(n), -1), own(count, r);
      all_gather(c, own.data(), gathered.data(), count, dtype::int64, with(a));
      bool g = true;
      for (std::uint64_t i = 0; i < gathered.size(); ++i) g = g && gathered[i] == static_cast<std::int64_t>(i / count);
      CHECK(g);
    }
  };
  if (world.world_size() >= 4) {
    auto four = first_ranks(world, 4);
    if (four)
      for (std::uint64_t count : {1, 3, 7}) run(*four, count);
  }
  if (world.world_size() >= 3) {
    auto three = first_ranks(world, 3);
    if (three) run(*three, 1000003);
  }
}

TEST_CASE("every algorithm gives bitwise identical results on every rank (inexact floats, NaN payloads)") {
  mpi::communicator comm;
  const int n = comm.world_size(), r = comm.rank();
  for (algorithm a : mpi_algorithms) {
    for (std::uint64_t count : {1ull, 7ull, 1000ull, 300001ull}) {  // recursive doubling and Rabenseifner both
      CAPTURE(algorithm_name(a));
      CAPTURE(count);
      std::vector<float> v(count);
      for (std::uint64_t i = 0; i < count; ++i)  // sums of these are not exact in float32
        v[i] = 0.1f * static_cast<float>((i * 7 + static_cast<std::uint64_t>(r) * 13) % 101) +
               1e-3f * static_cast<float>(r);
      std::uint32_t nan_bits = 0x7fc00001u + static_cast<std::uint32_t>(r);  // a different quiet-NaN payload per rank
      std::memcpy(&v[0], &nan_bits, sizeof nan_bits);
      all_reduce(comm, std::span<float>(v), reduce_kind::sum, with(a));
      std::vector<float> everyone(count * static_cast<std::uint64_t>(n));
      all_gather(comm, v.data(), everyone.data(), count, dtype::float32);
      bool identical = true;
      for (int q = 0; q < n; ++q)
        identical = identical && std::memcmp(everyone.data() + static_cast<std::uint64_t>(q) * count, v.data(),
                                             count * sizeof(float)) == 0;
      CHECK(identical);
    }
  }
}

TEST_CASE("traffic: ring and halving-doubling count what they send, native collectives a ring's estimate") {
  mpi::communicator comm(MPI_COMM_WORLD);
  const int n = comm.world_size();
  const std::uint64_t count = 4096, bytes = count * sizeof(float);
  std::vector<float> v(count, 1.0f);
  for (algorithm a : mpi_algorithms) {
    CAPTURE(algorithm_name(a));
    const traffic_counts before = comm.traffic();
    all_reduce(comm, v.data(), v.data(), count, dtype::float32, reduce_kind::sum, with(a));
    const traffic_figures t = (comm.traffic() - before).of(collective_kind::all_reduce);
    CHECK(t.calls == 1);
    if (a == algorithm::native) {
      CHECK(t.sent == 0);
      CHECK(t.received == 0);
      CHECK(t.estimated_sent == ringzero::detail::ring_bytes_per_rank(collective_kind::all_reduce, n, bytes));
    } else {
      CHECK(t.estimated_sent == 0);
      // Summed over the ranks: every byte sent is received; the ring sends 2(n-1) buffers.
      std::uint64_t sums[2] = {t.sent, t.received};
      all_reduce(comm, sums, sums, 2, dtype::uint64, reduce_kind::sum);
      CHECK(sums[0] == sums[1]);
      if (a == algorithm::ring) CHECK(sums[0] == 2 * static_cast<std::uint64_t>(n - 1) * bytes);
    }
  }
}

TEST_CASE("a paced link holds every send back by its bytes at the chosen rate, and refuses native collectives") {
  mpi::communicator_options o = ringzero_test::throwing(false);
  o.link_gbps = 0.05;  // 50 Mb/s: 6.25 bytes per microsecond
  mpi::communicator comm(MPI_COMM_WORLD, o);
  CHECK(comm.link_gbps() == 0.05);
  const std::uint64_t count = 16384;  // 64 KiB of floats
  std::vector<float> v(count, 1.0f);
  const traffic_counts before = comm.traffic();
  const auto start = std::chrono::steady_clock::now();
  all_reduce(comm, v.data(), v.data(), count, dtype::float32, reduce_kind::sum, with(algorithm::ring));
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::uint64_t sent = (comm.traffic() - before).total().sent;
  CHECK(v[0] == static_cast<float>(comm.world_size()));
  // The link was charged exactly the bytes sent, and the call lasted at least that long.
  CHECK(comm.paced_seconds() == doctest::Approx(static_cast<double>(sent) * 8.0 / 0.05e9).epsilon(1e-12));
  CHECK(elapsed >= comm.paced_seconds());
  // Automatic choices never pick native on a paced link.
  all_reduce(comm, v.data(), v.data(), count, dtype::float32, reduce_kind::sum);
  CHECK((comm.traffic() - before).total().estimated_sent == 0);
  // An explicit native collective is refused on every rank (and the communicator aborted): as
  // the first call of a communicator of its own, so no rank is still inside an earlier one.
  mpi::communicator refusing(MPI_COMM_WORLD, o);
  const auto e = error_of([&] {
    all_reduce(refusing, v.data(), v.data(), count, dtype::float32, reduce_kind::sum, with(algorithm::native));
  });
  REQUIRE(e);
  CHECK(e->kind() == errc::invalid_argument);
  CHECK(ringzero_test::contains(e->what(), "native"));
}

TEST_CASE("a malformed RINGZERO_* variable on one rank is refused on every rank, naming the rank") {
  // Each used to throw on that rank alone, before the handshake: its peers waited in theirs
  // until the timeout (300 s by default).
  const int r = world_rank(), n = world_size();
  for (const char* variable : {"RINGZERO_LINK_GBPS", "RINGZERO_CHECK", "RINGZERO_TIMEOUT", "RINGZERO_ALGO"}) {
    CAPTURE(variable);
    const char* set = std::getenv(variable);
    const std::optional<std::string> before = set ? std::optional<std::string>(set) : std::nullopt;
    if (r == n - 1) ::setenv(variable, "junk", 1);
    mpi::communicator_options o = ringzero_test::throwing(std::nullopt);
    o.timeout.reset();  // RINGZERO_TIMEOUT decides
    const auto e = error_of([&] { mpi::communicator comm(MPI_COMM_WORLD, o); });
    if (before)
      ::setenv(variable, before->c_str(), 1);
    else
      ::unsetenv(variable);
    REQUIRE(e);
    CHECK(e->kind() == errc::invalid_argument);
    CHECK(ringzero_test::contains(e->what(), "malformed on rank(s) " + std::to_string(n - 1)));
    if (r == n - 1) CHECK(ringzero_test::contains(e->what(), std::string(variable) + "=\"junk\""));
  }
}

TEST_CASE("a paced link that differs between ranks, or is not a positive number, is refused on every rank") {
  const int r = world_rank(), n = world_size();
  mpi::communicator_options o = ringzero_test::throwing(false);
  o.link_gbps = r == 0 ? 1.0 : 2.5;
  auto e = error_of([&] { mpi::communicator comm(MPI_COMM_WORLD, o); });
  REQUIRE(e);
  CHECK(e->kind() == errc::invalid_argument);
  CHECK(ringzero_test::contains(e->what(),
                                "the paced link (communicator_options::link_gbps / RINGZERO_LINK_GBPS) "
                                "differs between ranks: rank 0: 1 Gb/s; " +
                                    ringzero_test::ranks_text(1, n - 1) + ": 2.5 Gb/s"));
  for (double bad :
       {0.0, -1.0, 1e-4, 2e6, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    o.link_gbps = bad;
    e = error_of([&] { mpi::communicator comm(MPI_COMM_WORLD, o); });
    REQUIRE(e);
    CHECK(e->kind() == errc::invalid_argument);
    CHECK(
        ringzero_test::contains(e->what(), "link_gbps must be a number of gigabits per second from 0.001 to 1000000"));
    CHECK(ringzero_test::contains(e->what(), "rank " + std::to_string(r) + "/"));
  }
}

TEST_CASE("a tuning table decides auto where a rule covers the call; the cost model elsewhere; results exact") {
  const int r = world_rank(), n = world_size();
  mpi::communicator_options o = ringzero_test::throwing(true);  // the check compares resolved algorithms
  tuning_table t;
  t.add({collective_kind::all_reduce, n, 0, algorithm::native});
  t.add({collective_kind::all_reduce, n, 4096, algorithm::halving_doubling});
  t.add({collective_kind::all_reduce, n, 65536, algorithm::ring});
  t.add({collective_kind::all_gather, n + 1, 0, algorithm::native});  // another world size: ignored
  o.tuning = t;
  mpi::communicator comm(MPI_COMM_WORLD, o);
  mpi::communicator plain(MPI_COMM_WORLD, ringzero_test::throwing(false));
  CHECK(comm.tuning().rules() == t.rules());
  {  // a communicator made by split keeps its parent's table, whatever RINGZERO_MPI_TUNING says now
    const char* set = std::getenv("RINGZERO_MPI_TUNING");
    const std::optional<std::string> before = set ? std::optional<std::string>(set) : std::nullopt;
    if (r == n - 1) ::setenv("RINGZERO_MPI_TUNING", "/nonexistent/ringzero-tuning.txt", 1);
    std::unique_ptr<mpi::communicator> child = comm.split(0, r);
    if (before)
      ::setenv("RINGZERO_MPI_TUNING", before->c_str(), 1);
    else
      ::unsetenv("RINGZERO_MPI_TUNING");
    REQUIRE(child);
    CHECK(child->tuning().rules() == t.rules());
  }
  const auto choice = [](communicator& c, collective_kind k, double bytes) {
    std::string problem;
    const algorithm a = resolve_algorithm(c, k, bytes, algorithm::automatic, algorithm::automatic, problem);
    CHECK(problem.empty());
    return a;
  };
  CHECK(choice(comm, collective_kind::all_reduce, 8) == algorithm::native);
  CHECK(choice(comm, collective_kind::all_reduce, 4095) == algorithm::native);
  CHECK(choice(comm, collective_kind::all_reduce, 4096) == algorithm::halving_doubling);
  CHECK(choice(comm, collective_kind::all_reduce, 1 << 20) == algorithm::ring);
  for (double bytes : {8.0, 65536.0, 4194304.0})  // not covered: the cost model's, as without a table
    CHECK(choice(comm, collective_kind::all_gather, bytes) == choice(plain, collective_kind::all_gather, bytes));
  // The collective runs what the table says: rank 0 names it explicitly, the others ask for auto,
  // and the check mode (which compares the resolved algorithms) lets the call through.
  const std::pair<std::uint64_t, algorithm> calls[] = {{2, algorithm::native},
                                                       {4096, algorithm::halving_doubling},
                                                       {70000, algorithm::ring}};  // int64: 16 B, 32 KiB, 547 KiB
  for (const auto& [count, expected] : calls) {
    CAPTURE(count);
    std::vector<std::int64_t> v(count), out(count);
    for (std::uint64_t i = 0; i < count; ++i) v[i] = static_cast<std::int64_t>(i) * (r + 1);
    all_reduce(comm, v.data(), out.data(), count, dtype::int64, reduce_kind::sum,
               with(r == 0 ? expected : algorithm::automatic));
    std::uint64_t wrong = 0;
    for (std::uint64_t i = 0; i < count; ++i) wrong += out[i] != static_cast<std::int64_t>(i) * n * (n + 1) / 2 ? 1 : 0;
    CHECK(wrong == 0);
  }
}

TEST_CASE("tuning tables that differ between ranks, or an unreadable RINGZERO_MPI_TUNING, are refused on every rank") {
  const int r = world_rank(), n = world_size();
  mpi::communicator_options o = ringzero_test::throwing(false);
  if (r == 0) {
    tuning_table t;
    t.add({collective_kind::all_reduce, n, 0, algorithm::native});
    o.tuning = t;
  }
  auto e = error_of([&] { mpi::communicator comm(MPI_COMM_WORLD, o); });
  REQUIRE(e);
  CHECK(e->kind() == errc::invalid_argument);
  CHECK(ringzero_test::contains(e->what(),
                                "the tuning table (communicator_options::tuning / RINGZERO_MPI_TUNING) "
                                "differs between ranks: rank 0: rules with fingerprint "));
  CHECK(ringzero_test::contains(e->what(), ringzero_test::ranks_text(1, n - 1) + ": none"));
  // The same 32-bit fingerprint, other rules (an FNV-1a collision): compared exactly.
  o.tuning = tuning_table::parse(r == 0 ? "all_reduce 2 762179584 ring" : "all_reduce 2 50552840 native", "table");
  e = error_of([&] { mpi::communicator comm(MPI_COMM_WORLD, o); });
  REQUIRE(e);
  CHECK(e->kind() == errc::invalid_argument);
  CHECK(ringzero_test::contains(e->what(), "differs between ranks: rank(s) " +
                                               (n == 2   ? std::string("1")
                                                : n == 3 ? std::string("1, 2")
                                                         : std::string("1, 2, 3")) +
                                               " have other rules than rank 0 (with the same 32-bit fingerprint)"));
  // The variable names a file that one rank cannot read: every rank refuses, that one says why.
  const char* set = std::getenv("RINGZERO_MPI_TUNING");
  const std::optional<std::string> before = set ? std::optional<std::string>(set) : std::nullopt;
  if (r == n - 1) ::setenv("RINGZERO_MPI_TUNING", "/nonexistent/ringzero-tuning.txt", 1);
  e = error_of([&] { mpi::communicator comm(MPI_COMM_WORLD, ringzero_test::throwing(false)); });
  if (before)
    ::setenv("RINGZERO_MPI_TUNING", before->c_str(), 1);
  else
    ::unsetenv("RINGZERO_MPI_TUNING");
  REQUIRE(e);
  CHECK(e->kind() == errc::invalid_argument);
  CHECK(ringzero_test::contains(e->what(), "malformed on rank(s) " + std::to_string(n - 1)));
  if (r == n - 1)
    CHECK(ringzero_test::contains(
        e->what(), "RINGZERO_MPI_TUNING: cannot read the tuning table /nonexistent/ringzero-tuning.txt"));
  // A rule for an algorithm MPI never runs (it would never apply), on the last rank: refused on
  // every rank, that one naming the rule.
  o = ringzero_test::throwing(false);
  if (r == n - 1) o.tuning = tuning_table::parse("all_reduce " + std::to_string(n) + " 4096 direct", "table");
  e = error_of([&] { mpi::communicator comm(MPI_COMM_WORLD, o); });
  REQUIRE(e);
  CHECK(e->kind() == errc::invalid_argument);
  CHECK(ringzero_test::contains(e->what(), "malformed on rank(s) " + std::to_string(n - 1)));
  if (r == n - 1)
    CHECK(ringzero_test::contains(e->what(), "communicator_options::tuning: the rule 'all_reduce " + std::to_string(n) +
                                                 " 4096 direct' names direct, which the MPI backend does not run"));
  // A file of comments only, on every rank: no table by mistake, refused naming the file.
  const std::string empty = "/tmp/ringzero-empty-tuning-" + std::to_string(::getpid()) + ".txt";
  std::FILE* file = std::fopen(empty.c_str(), "w");
  REQUIRE(file != nullptr);
  std::fputs("# ringzero tuning table\n\n", file);
  std::fclose(file);
  ::setenv("RINGZERO_MPI_TUNING", empty.c_str(), 1);
  e = error_of([&] { mpi::communicator comm(MPI_COMM_WORLD, ringzero_test::throwing(false)); });
  if (before)
    ::setenv("RINGZERO_MPI_TUNING", before->c_str(), 1);
  else
    ::unsetenv("RINGZERO_MPI_TUNING");
  std::remove(empty.c_str());
  REQUIRE(e);
  CHECK(e->kind() == errc::invalid_argument);
  CHECK(ringzero_test::contains(e->what(), "RINGZERO_MPI_TUNING: the tuning table " + empty + " has no rules"));
}
