// Bad input on the MPI backend: mismatched collectives across processes (with and without the
// check mode), invalid arguments on one rank, send/recv size mismatches (C12), a rank that leaves
// early, ranks that never arrive (timeouts naming them), a wrong communicator size, and ranks
// that disagree on the check mode. Every case must end in a clear error on every rank, never a
// hang: the tests run with failure_policy::throw_error so that they can assert on the errors.
//
// Assertions are CHECKs only (never REQUIRE), so that every rank runs the same collectives in the
// same order even when a check fails.
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "mpi_test.hpp"
#if defined(RZT_HAVE_XXHASH)
#include "ringzero/verify_replicas.hpp"
#endif

using namespace ringzero;
using ringzero_test::contains;
using ringzero_test::error_of;
using ringzero_test::ranks_text;
using ringzero_test::throwing;

namespace {

/// A correct all_reduce after an error: the communicator is still usable.
void expect_usable(communicator& comm) {
  std::vector<std::int32_t> v(10, comm.rank() + 1);
  const auto e = error_of([&] { all_reduce(comm, std::span<std::int32_t>(v)); });
  CHECK_FALSE(e.has_value());
  const int n = comm.world_size();
  CHECK(v[0] == n * (n + 1) / 2);
  CHECK(v[9] == n * (n + 1) / 2);
}

}  // namespace

TEST_CASE("check mode: a count mismatch (C6) raises the same error on every rank; the communicator stays usable") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(true));
  const int n = comm.world_size(), r = comm.rank();
  const std::uint64_t count = r == 0 ? 2560 : 5120;
  std::vector<float> v(5120, 1.0f);
  const auto e = error_of([&] { all_reduce(comm, v.data(), v.data(), count, dtype::float32, reduce_kind::sum); });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::contract_mismatch);
    CHECK(contains(e->what(), "all_reduce #0: count mismatch: rank 0: 2560; " + ranks_text(1, n - 1) + ": 5120"));
    CHECK(contains(e->what(), "[mpi rank " + std::to_string(r) + "/" + std::to_string(n) + "]"));
  }
  CHECK(v[0] == 1.0f);  // no partial sum
  expect_usable(comm);
}

TEST_CASE("check mode: a tag mismatch (collective_options::tag) raises on every rank; the wire carries the tag") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(true));
  const int n = comm.world_size();
  std::vector<float> send(4, 2.0f), v(4 * static_cast<std::size_t>(n), 1.0f);
  collective_options o;
  o.tag = comm.rank() == 0 ? 0x0102030405060708ull : 9;
  const auto e = error_of([&] { all_gather(comm, send.data(), v.data(), 4, dtype::float32, o); });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::contract_mismatch);
    CHECK(contains(e->what(), "all_gather #0: tag mismatch"));
    CHECK(contains(e->what(), "rank 0: 0x102030405060708; " + ranks_text(1, n - 1) + ": 0x9"));
  }
  CHECK(v[0] == 1.0f);
  // With a namer, each rank names every rank's tag (the wire carries the tag, not the name).
  o.tag_name =
      tag_namer{[](const void*, std::uint64_t tag) noexcept { return "call " + std::to_string(tag & 0xff); }, nullptr};
  const auto named = error_of([&] { all_gather(comm, send.data(), v.data(), 4, dtype::float32, o); });
  CHECK(named.has_value());
  if (named) CHECK(contains(named->what(), "rank 0: call 8; " + ranks_text(1, n - 1) + ": call 9"));
  o.tag_name = {};
  o.tag = 9;  // the same tag everywhere runs
  std::vector<std::int32_t> x(4, 1);
  CHECK_FALSE(
      error_of([&] { all_reduce(comm, x.data(), x.data(), 4, dtype::int32, reduce_kind::sum, o); }).has_value());
  CHECK(x[3] == n);
  expect_usable(comm);
}

TEST_CASE("check mode: a dtype mismatch (C7) raises on every rank") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(true));
  const int n = comm.world_size(), r = comm.rank();
  float f = 0.1f;
  bfloat16 b(0.1f);
  const auto e = error_of([&] {
    if (r == 0)
      all_reduce(comm, &b, &b, 1, dtype::bfloat16, reduce_kind::sum);
    else
      all_reduce(comm, &f, &f, 1, dtype::float32, reduce_kind::sum);
  });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::contract_mismatch);
    CHECK(contains(e->what(), "dtype mismatch: rank 0: bfloat16; " + ranks_text(1, n - 1) + ": float32"));
  }
  CHECK(f == 0.1f);
  expect_usable(comm);
}

TEST_CASE("check mode: a root mismatch (C8) raises on every rank") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(true));
  const int r = comm.rank();
  std::vector<std::int64_t> v{1, 2, 3, 4}, out(4, -7);
  const auto e =
      error_of([&] { reduce(comm, v.data(), out.data(), 4, dtype::int64, reduce_kind::sum, r == 1 ? 1 : 0); });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::contract_mismatch);
    CHECK(contains(e->what(), "root mismatch: "));
    CHECK(contains(e->what(), "; rank 1: 1"));
  }
  CHECK(out[0] == -7);
  expect_usable(comm);
}

TEST_CASE("check mode: different collectives on different ranks raise on every rank") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(true));
  const int n = comm.world_size(), r = comm.rank();
  std::vector<float> v(100, 1.0f);
  const auto e = error_of([&] {
    if (r == 0)
      all_reduce(comm, std::span<float>(v));
    else
      broadcast(comm, std::span<float>(v), 0);
  });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::contract_mismatch);
    CHECK(contains(e->what(), "collective mismatch: rank 0: all_reduce; " + ranks_text(1, n - 1) + ": broadcast"));
  }
  expect_usable(comm);
}

TEST_CASE("check mode: invalid arguments on one rank are reported on every rank, naming that rank") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(true));
  const int n = comm.world_size(), r = comm.rank();
  std::vector<float> v(10, 1.0f);
  const auto e = error_of(
      [&] { all_reduce(comm, r == n - 1 ? nullptr : v.data(), v.data(), 10, dtype::float32, reduce_kind::sum); });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::invalid_argument);
    CHECK(contains(e->what(), "rank " + std::to_string(n - 1) + ": send buffer is null with count 10"));
  }
  expect_usable(comm);
}

TEST_CASE("check mode: a collective that only one rank calls is found at once") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(true));
  const int n = comm.world_size(), r = comm.rank();
  std::vector<float> v(10, 1.0f);
  // Rank 0 calls an all_reduce that the others skip; then everyone calls barrier: all_reduce #0
  // meets barrier #0.
  const auto e = error_of([&] {
    if (r == 0) all_reduce(comm, std::span<float>(v));
    barrier(comm);
  });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::contract_mismatch);
    CHECK(contains(e->what(), "collective mismatch: rank 0: all_reduce; " + ranks_text(1, n - 1) + ": barrier"));
  }
}

TEST_CASE("check off: invalid arguments on one rank abort the communicator; every rank fails with that reason") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(false));
  const int n = comm.world_size(), r = comm.rank();
  std::vector<float> v(1000, 1.0f);
  ringzero::collective_options ring;
  ring.algo = algorithm::ring;
  const auto start = std::chrono::steady_clock::now();
  const auto e = error_of([&] {
    all_reduce(comm, r == n - 1 ? nullptr : v.data(), v.data(), 1000, dtype::float32, reduce_kind::sum, ring);
  });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::invalid_argument);
    CHECK(contains(e->what(), "rank " + std::to_string(n - 1) + ": send buffer is null with count 1000"));
  }
  CHECK(ringzero_test::seconds_since(start) < 60.0);  // at once, not after the 120 s timeout
  CHECK(comm.aborted());
  const auto again = error_of([&] { barrier(comm); });
  CHECK(again.has_value());
  if (again) CHECK(again->kind() == errc::invalid_argument);
}

TEST_CASE("check off: a count mismatch (C6) fails on every rank with size_mismatch, never a partial sum") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(false));
  const int r = comm.rank();
  const std::uint64_t count = r == 0 ? 2560 : 5120;
  std::vector<float> v(5120, 1.0f);
  ringzero::collective_options ring;
  ring.algo = algorithm::ring;
  const auto e = error_of([&] { all_reduce(comm, v.data(), v.data(), count, dtype::float32, reduce_kind::sum, ring); });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::size_mismatch);
    CHECK(contains(e->what(), "bytes"));
  }
  CHECK(comm.aborted());
}

TEST_CASE("check off: a point-to-point send matched against a collective is a contract mismatch") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(false));
  const int r = comm.rank();
  std::vector<float> v(100, 1.0f);
  ringzero::collective_options ring;
  ring.algo = algorithm::ring;
  // Rank 0 sends to rank 1 while rank 1 is in an all_reduce whose ring receives from rank 0
  // (rank 0 is rank 1's predecessor); then rank 0 joins the all_reduce too.
  const auto e = error_of([&] {
    if (r == 0) send(comm, v.data(), 100, dtype::float32, 1);
    all_reduce(comm, v.data(), v.data(), 100, dtype::float32, reduce_kind::sum, ring);
  });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::contract_mismatch);
    CHECK(contains(e->what(), "rank 0 sent data of a point-to-point send/recv while rank 1 runs all_reduce #0"));
  }
}

// With the check mode on, a send/recv exchanges a small record with its peer before any data
// moves: both ranks raise the same error naming both amounts (as on the local backend), and the
// communicator stays usable. (Before, only the receiver raised; the sender's send returned.)
TEST_CASE(
    "check mode: a send/recv mismatch (C12) raises on both ranks before data moves; the communicator stays usable") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(true));
  const int r = comm.rank();
  struct mismatch {
    const char* name;
    std::uint64_t send_count;
    dtype send_type;
    std::uint64_t recv_count;
    dtype recv_type;
    errc code;
    const char* text;
  };
  const mismatch cases[] = {
      {"the sender sends more", 3, dtype::float32, 1, dtype::float32, errc::size_mismatch,
       "rank 0 sends 3 float32 (12 bytes) to rank 1 but rank 1 expects 1 float32 (4 bytes) (check mode: no data "
       "moved)"},
      {"the sender sends less", 1, dtype::float32, 3, dtype::float32, errc::size_mismatch,
       "rank 0 sends 1 float32 (4 bytes) to rank 1 but rank 1 expects 3 float32 (12 bytes)"},
      {"dtypes of different sizes", 3, dtype::float32, 3, dtype::float64, errc::size_mismatch,
       "rank 0 sends 3 float32 (12 bytes) to rank 1 but rank 1 expects 3 float64 (24 bytes)"},
  };
  SUBCASE("sizes that differ") {
    for (const mismatch& m : cases) {
      CAPTURE(m.name);
      std::vector<double> out(8, 1.0), in(8, -1.0);
      const auto e = error_of([&] {
        if (r == 0) send(comm, out.data(), m.send_count, m.send_type, 1);
        if (r == 1) recv(comm, in.data(), m.recv_count, m.recv_type, 0);
      });
      if (r <= 1) {
        CHECK(e.has_value());  // the sender too
        if (e) {
          INFO(std::string(e->what()));
          CHECK(e->kind() == m.code);
          CHECK(contains(e->what(), m.text));
          CHECK(contains(e->what(), "[mpi rank " + std::to_string(r) + "/"));
        }
      }
      if (r == 1) CHECK(in[0] == -1.0);  // nothing landed
      CHECK_FALSE(comm.aborted());
      expect_usable(comm);
    }
  }
  SUBCASE("both ranks receive from each other: an error on both instead of a timeout") {
    std::vector<float> in(4, 0.0f);
    const auto e = error_of([&] {
      if (r <= 1) recv(comm, in.data(), 4, dtype::float32, 1 - r);
    });
    if (r <= 1) {
      CHECK(e.has_value());
      if (e) {
        INFO(std::string(e->what()));
        CHECK(e->kind() == errc::contract_mismatch);
        CHECK(contains(e->what(),
                       "rank 1 receives 4 float32 (16 bytes) from rank 0 but rank 0 does not send to rank 1 "
                       "(check mode: no data moved)"));
      }
    }
    expect_usable(comm);
  }
  SUBCASE("a matched send/recv still moves the data") {
    std::vector<std::int64_t> out{1, -2, 3}, in(3, 0);
    const auto e = error_of([&] {
      if (r == 0) send(comm, out.data(), 3, dtype::int64, 1);
      if (r == 1) recv(comm, in.data(), 3, dtype::int64, 0);
    });
    CHECK_FALSE(e.has_value());
    if (r == 1) CHECK(in == out);
  }
}

// Ranks 0 and 1 both find the mismatch and abort the communicator; whichever abort notice
// arrives first is the error of the other ranks. Rank 0 or 1 itself reports its own verdict,
// or the other's when that rank's notice arrived while it still waited (for rank 1: for the
// descriptors of ranks 2..n-1), so every rank's error is one of the two verdicts.
TEST_CASE("check mode: a send against a collective raises contract_mismatch on every rank") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(true));
  const int r = comm.rank();
  const std::string n = std::to_string(comm.world_size());
  std::vector<float> v(10, 1.0f);
  const auto first = error_of([&] {
    if (r == 0)
      send(comm, v.data(), 10, dtype::float32, 1);
    else
      all_reduce(comm, std::span<float>(v));
  });
  const std::string by_rank0 =
      "[mpi rank 0/" + n + "] send: rank 1 runs all_reduce #0 while rank 0 runs a point-to-point send with it";
  const std::string by_rank1 = "[mpi rank 1/" + n +
                               "] all_reduce #0: rank 0 runs a point-to-point send/recv with rank 1 while rank 1 runs "
                               "all_reduce #0";
  CHECK(first.has_value());
  if (first) {
    INFO(std::string(first->what()));
    CHECK(first->kind() == errc::contract_mismatch);
    CHECK((contains(first->what(), by_rank0) || contains(first->what(), by_rank1)));
  }
  CHECK(comm.aborted());
}

// Without the check nothing is exchanged before the data: the receiver finds the mismatch from
// the message's size and tag and raises at once, naming both sizes, and aborts the
// communicator; the sender's send has already returned (MPI completed it: the receiver took the
// message off the wire to check it), so the sender raises the receiver's error at its next call.
TEST_CASE(
    "C12 check off: a send/recv size mismatch is an error on the receiver at once, on the sender at its next call") {
  SUBCASE("the sender sends less") {
    mpi::communicator comm(MPI_COMM_WORLD, throwing(false));
    const int r = comm.rank();
    float one = 1.0f;
    float three[3] = {0, 0, 0};
    const auto e = error_of([&] {
      if (r == 0) send(comm, &one, 1, dtype::float32, 1);
      if (r == 1) recv(comm, three, 3, dtype::float32, 0);
    });
    // Documented: the send usually completed and returned; it raises the receiver's error in the
    // call only when that rank's abort notice arrived before the send's closing probe.
    if (r == 0 && e) CHECK(e->kind() == errc::size_mismatch);
    if (r == 1) {
      CHECK(e.has_value());
      if (e) {
        CHECK(e->kind() == errc::size_mismatch);
        CHECK(contains(e->what(), "[mpi rank 1/"));
        CHECK(contains(e->what(), "recv: rank 0 sends 4 bytes but rank 1 expects 12 bytes"));
      }
    }
    const auto later = error_of([&] { barrier(comm); });  // the sender learns at its next call
    CHECK(later.has_value());
    if (later) {
      CHECK(later->kind() == errc::size_mismatch);
      CHECK(contains(later->what(), "rank 0 sends 4 bytes but rank 1 expects 12 bytes"));
    }
  }
  SUBCASE("the sender sends more") {
    mpi::communicator comm(MPI_COMM_WORLD, throwing(false));
    const int r = comm.rank();
    float three[3] = {1, 2, 3};
    float one = 0.0f;
    const auto e = error_of([&] {
      if (r == 0) send(comm, three, 3, dtype::float32, 1);
      if (r == 1) recv(comm, &one, 1, dtype::float32, 0);
    });
    if (r == 1) {
      CHECK(e.has_value());
      if (e) {
        CHECK(e->kind() == errc::size_mismatch);
        CHECK(contains(e->what(), "rank 0 sends 12 bytes but rank 1 expects 4 bytes"));
      }
    }
    const auto later = error_of([&] { barrier(comm); });
    CHECK(later.has_value());
  }
}

// Open MPI 4.1 writes a truncated rendezvous message past the posted receive (its whole size):
// ringzero must find the mismatch before any byte lands, so the memory after the receive
// buffer stays untouched.
TEST_CASE("C12 with a large message: the receiver's memory past its buffer is never written") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(false));
  const int r = comm.rank();
  std::vector<float> big(100000, 3.0f);
  std::vector<float> small(250 + 100000, -1.0f);  // 250 expected, then a guard region
  const auto e = error_of([&] {
    if (r == 0) send(comm, big.data(), big.size(), dtype::float32, 1);
    if (r == 1) recv(comm, small.data(), 250, dtype::float32, 0);
  });
  if (r == 1) {
    CHECK(e.has_value());
    if (e) {
      CHECK(e->kind() == errc::size_mismatch);
      CHECK(contains(e->what(), "rank 0 sends 400000 bytes but rank 1 expects 1000 bytes"));
    }
    bool guard_intact = true;
    for (std::size_t i = 0; i < small.size(); ++i) guard_intact = guard_intact && small[i] == -1.0f;
    CHECK(guard_intact);
  }
  const auto later = error_of([&] { barrier(comm); });
  CHECK(later.has_value());
}

TEST_CASE("a rank that leaves early makes the waiting ranks fail at once with peer_exited") {
  for (bool check : {true, false}) {
    CAPTURE(check);
    for (bool by_exception : {false, true}) {
      CAPTURE(by_exception);
      const int n = [] {
        int s = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &s);
        return s;
      }();
      int world_rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      const int leaver = n - 1;
      const auto start = std::chrono::steady_clock::now();
      if (world_rank == leaver) {
        // Makes the communicator and leaves without the collective the others call.
        try {
          mpi::communicator comm(MPI_COMM_WORLD, throwing(check));
          if (by_exception) throw std::runtime_error("the data loader failed");
        } catch (const std::runtime_error&) {}
        continue;
      }
      mpi::communicator comm(MPI_COMM_WORLD, throwing(check));
      std::vector<double> v(1000, 1.0);
      const auto e = error_of([&] { all_reduce(comm, std::span<double>(v)); });
      CHECK(e.has_value());
      if (e) {
        INFO(std::string(e->what()));
        CHECK(e->kind() == errc::peer_exited);
        CHECK(contains(e->what(), "rank " + std::to_string(leaver) + " left the communicator"));
        if (by_exception) CHECK(contains(e->what(), "while unwinding an exception"));
      }
      CHECK(ringzero_test::seconds_since(start) < 60.0);  // not the 120 s timeout
    }
  }
}

// Rank 0 has the shortest timeout, so it is the one that times out first and its error (sent to
// the others as the abort reason) is the one every rank reports. The destructor of the aborted
// communicator does not wait for the sleeping rank (see the destruction test below); the world
// barrier lines the ranks up again.
TEST_CASE("check mode: a timeout names the ranks that never arrived, on every rank") {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  {
    mpi::communicator comm(MPI_COMM_WORLD, throwing(true, world_rank == 0 ? 1.0 : 2.0));
    const int n = comm.world_size(), r = comm.rank();
    std::vector<float> v(100, 1.0f);
    if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(3500));
    const auto e = error_of([&] { all_reduce(comm, std::span<float>(v)); });
    CHECK(e.has_value());
    if (e) {
      CHECK(e->kind() == errc::timeout);
      CHECK(contains(e->what(), "timed out after 1 s: rank " + std::to_string(n - 1) +
                                    " never arrived at all_reduce #0 (" + ranks_text(0, n - 2) + " did)"));
    }
    CHECK(comm.aborted());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("check off: a timeout names the peers whose transfers did not complete") {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  {
    mpi::communicator comm(MPI_COMM_WORLD, throwing(false, world_rank == 0 ? 1.0 : 2.0));
    const int n = comm.world_size(), r = comm.rank();
    std::vector<float> v(100, 1.0f);
    ringzero::collective_options ring;
    ring.algo = algorithm::ring;
    if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(3500));
    const auto e = error_of([&] { all_reduce(comm, v.data(), v.data(), 100, dtype::float32, reduce_kind::sum, ring); });
    CHECK(e.has_value());
    if (e) {
      CHECK(e->kind() == errc::timeout);
      // Rank 0 receives from its ring predecessor, the sleeping rank.
      CHECK(contains(e->what(), "timed out after 1 s in all_reduce #0 waiting for rank " + std::to_string(n - 1) +
                                    ": the receive of "));
      CHECK(contains(e->what(),
                     " bytes from rank " + std::to_string(n - 1) + " (0 of 1 slices arrived) did not complete"));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Destroying a communicator after a timeout (throw_error) must not wait for the rank that never
// arrived for another whole timeout: it waits mpi::failed_departure_wait (250 ms) for the
// departures, then hands the MPI communicators to detail::lingering, which frees them once the
// late rank's departure notice arrives. The late rank fails when it arrives, and its destructor
// is prompt too; MPI stays usable. (With the check off, the automatic algorithm on 3 ranks let
// the late rank complete its one exchange with data a peer had sent before giving up, and
// return a wrong sum: every collective now ends by looking for an abort notice.)
TEST_CASE("after a timeout under throw_error, destroying the communicator is prompt on every rank") {
  for (bool check : {true, false}) {
    CAPTURE(check);
    int world_rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    // The late rank arrives after the others timed out and after a whole timeout more (the
    // destructor's old wait), so that only a prompt destruction passes.
    const double timeout_s = 1.0;
    const bool late = world_rank == world - 1;
    double destroy_s = 0;
    {
      std::optional<mpi::communicator> comm;
      comm.emplace(MPI_COMM_WORLD, throwing(check, timeout_s));
      std::vector<float> v(100, 1.0f);
      if (late) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      const auto e = error_of([&] { all_reduce(*comm, std::span<float>(v)); });
      CHECK(e.has_value());
      if (e && !late) CHECK(e->kind() == errc::timeout);
      CHECK(comm->aborted());
      const auto start = std::chrono::steady_clock::now();
      comm.reset();
      destroy_s = ringzero_test::seconds_since(start);
    }
    INFO("destructor: " << destroy_s << " s");
    CHECK(destroy_s < 0.8 * timeout_s);  // was a whole timeout: it waited for the late rank's departure
    MPI_Barrier(MPI_COMM_WORLD);
    {
      mpi::communicator comm(MPI_COMM_WORLD, throwing(check));
      expect_usable(comm);
    }
    // The late rank's departure notice has arrived by now: the lingering communicators are freed.
    const auto start = std::chrono::steady_clock::now();
    while (mpi::detail::lingering::size() != 0 && ringzero_test::seconds_since(start) < 5.0) {
      mpi::detail::lingering::collect(false);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(mpi::detail::lingering::size() == 0);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// Check off: rank 0's send of 4 MiB (above the eager limit) times out because rank 1 arrives
// late; rank 0 catches the error and reuses its buffer. MPI may still complete the abandoned
// send (its request was freed, not cancelled) from that buffer when rank 1 posts its receive:
// rank 1's recv returned without an error, holding rank 0's new contents (99) instead of the
// data sent. A point-to-point transfer now looks for the abort notice before it starts and
// after it completes, as every collective does, so the late rank fails (from the probe at the
// start, or at the end when rank 0's notice was not yet received when the receive began).
TEST_CASE(
    "check off: a rank that arrives late at a send its peer gave up on fails, instead of receiving the reused buffer") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(false, 30.0));
  comm.set_timeout(std::chrono::duration<double>(1.0));
  const int r = comm.rank();
  const std::size_t count = std::size_t{1} << 20;
  std::vector<float> buffer(count, r == 0 ? 1.0f : 0.0f);
  if (r == 0) {
    const auto e = error_of([&] { send(comm, buffer.data(), count, dtype::float32, 1); });
    CHECK(e.has_value());
    if (e) CHECK(e->kind() == errc::timeout);
    std::fill(buffer.begin(), buffer.end(), 99.0f);  // the buffer is the caller's again
  } else if (r == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    const auto e = error_of([&] { recv(comm, buffer.data(), count, dtype::float32, 0); });
    CHECK(e.has_value());
    if (e) {
      CHECK(e->kind() == errc::timeout);
      CHECK(contains(e->what(), "recv: the communicator was aborted: ringzero [mpi rank 0/"));
    }
    // (What the failed receive left in `buffer` is unspecified, as after any failed receive.)
  }
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0's buffer outlives rank 1's receive
}

// A send to oneself is received only by the same call's receive from oneself. MPI completes a
// small send to oneself at once, so a sendrecv that sent to itself but received from a peer
// returned, and a later sendrecv to itself received that stale message instead of its own data:
// {1, 2, 3, 4} instead of {5, 6, 7, 8}, with no error, with or without the check mode. Now a
// sendrecv with only one side on the own rank is refused before anything moves.
TEST_CASE("sendrecv with only one side on the own rank is refused; a later sendrecv to itself gets its own data") {
  for (const bool check : {false, true}) {
    CAPTURE(check);
    mpi::communicator comm(MPI_COMM_WORLD, throwing(check, 5.0));
    const int r = comm.rank(), n = comm.world_size();
    const int peer = (r + 1) % n;
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, x[4] = {0, 0, 0, 0}, y[4] = {0, 0, 0, 0};
    const auto to_self = error_of([&] { sendrecv(comm, a, 4, r, x, 4, peer, dtype::float32); });
    CHECK(to_self.has_value());
    if (to_self) {
      CHECK(to_self->kind() == errc::invalid_argument);
      CHECK(contains(to_self->what(), "sendrecv: to " + std::to_string(r) + " and from " + std::to_string(peer) +
                                          ": a send to oneself needs the same call's receive from oneself (from == " +
                                          std::to_string(r) + ")"));
    }
    const auto from_self = error_of([&] { sendrecv(comm, a, 4, peer, x, 4, r, dtype::float32); });
    CHECK(from_self.has_value());
    if (from_self) {
      CHECK(from_self->kind() == errc::invalid_argument);
      CHECK(contains(from_self->what(),
                     "a receive from oneself needs the same call's send to oneself (to == " + std::to_string(r) + ")"));
    }
    CHECK_FALSE(error_of([&] { sendrecv(comm, b, 4, r, y, 4, r, dtype::float32); }).has_value());
    CHECK(y[0] == 5.0f);
    CHECK(y[1] == 6.0f);
    CHECK(y[2] == 7.0f);
    CHECK(y[3] == 8.0f);
    CHECK(x[0] == 0.0f);  // nothing moved
    expect_usable(comm);
  }
}

TEST_CASE("a communicator of the wrong size is refused on every rank") {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  auto options = throwing(false);
  options.expected_world_size = n + 1;
  const auto e = error_of([&] { mpi::communicator comm(MPI_COMM_WORLD, options); });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::invalid_argument);
    CHECK(contains(e->what(), "the job has " + std::to_string(n) + " processes in this communicator but " +
                                  std::to_string(n + 1) + " were expected"));
  }
}

TEST_CASE("ranks that disagree on the check mode cannot make a communicator") {
  int r = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const auto e = error_of([&] { mpi::communicator comm(MPI_COMM_WORLD, throwing(r == 0)); });
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::invalid_argument);
    CHECK(contains(e->what(),
                   "the check mode (RINGZERO_CHECK / communicator_options::check) differs between ranks: rank 0: 1; " +
                       ranks_text(1, n - 1) + ": 0"));
  }
}

TEST_CASE("a construction that times out leaves MPI usable, and the late rank times out instead of hanging") {
  // Every rank but the last gives up making the communicator after 0.5 s; the last arrives
  // after 1 s. Its duplicate of the data communicator completes the others' abandoned one
  // (which MPI then writes into memory kept for it, not into the destroyed object: that was a
  // crash), and it must not block making the control communicator nobody else makes.
  int world_rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const bool late = world_rank == world - 1;
  if (late) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const auto start = std::chrono::steady_clock::now();
  const auto e = error_of([&] { mpi::communicator comm(MPI_COMM_WORLD, throwing(false, late ? 1.0 : 0.5)); });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(e.has_value());
  if (e) {
    CHECK(e->kind() == errc::timeout);
    CHECK(contains(e->what(), std::string("timed out after ") + (late ? "1" : "0.5") + " s making the communicator"));
  }
  CHECK(waited < 10.0);
  MPI_Barrier(MPI_COMM_WORLD);  // MPI still works
  mpi::communicator comm(MPI_COMM_WORLD, throwing(false));
  expect_usable(comm);
}

#if defined(RZT_HAVE_XXHASH)
TEST_CASE("verify_replicas over MPI: one flipped bit on the last rank is named on every rank") {
  mpi::communicator comm(MPI_COMM_WORLD, throwing(true));
  const int n = comm.world_size(), r = comm.rank();
  std::vector<float> a(1000, 0.5f), b(33, -2.0f);
  std::vector<replica_tensor> tensors = {{"a", a.data(), a.size() * 4}, {"b", b.data(), b.size() * 4}};
  CHECK(verify_replicas(comm, tensors).tensors == 2);
  if (r == n - 1) reinterpret_cast<unsigned char*>(b.data())[17] ^= 0x02;
  const auto e = error_of([&] { verify_replicas(comm, tensors, "parameters"); });
  REQUIRE(e.has_value());
  CHECK(e->kind() == errc::replica_mismatch);
  CHECK(contains(e->what(), "the replicas' parameters differ: tensor 1 'b' (132 bytes) differs: "));
  CHECK(contains(e->what(), "rank " + std::to_string(n - 1) + " holds "));
  CHECK(contains(e->what(), "1 of 2 tensors differ"));
  expect_usable(comm);
}
#endif
