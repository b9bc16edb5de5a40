// Every error path of the collectives on the local backend: contract mismatches (collective,
// count, dtype, op, root, algorithm) raised on every rank; timeouts naming the ranks that never
// arrived; ranks that return or throw while others wait; and bad input (null buffers, byte-size
// overflow, roots out of range, world sizes below 1, unknown dtype and op values, premul_sum
// scalars, forbidden buffer overlaps, malformed environment variables). Each test runs with a
// short timeout: nothing may hang.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "ringzero/ringzero.hpp"

using namespace ringzero;
using rzt::check_error;
using rzt::check_every_rank;
using rzt::contains;
using rzt::every_algorithm;
using rzt::outcome;
using rzt::with_algo;

namespace {

/// One collective call with every argument spelled out (defaults: a valid call).
struct call_args {
  collective_kind kind = collective_kind::all_reduce;
  std::uint64_t count = 4;
  dtype type = dtype::float32;
  reduce_op op = reduce_kind::sum;
  int root = 0;
  algorithm algo = algorithm::automatic;
  std::uint64_t tag = 0;
  tag_namer tag_name;
  const void* send = nullptr;  ///< overrides the default buffer when `use_pointers`
  void* recv = nullptr;
  bool use_pointers = false;
};

/// Buffers large enough for any call of up to 64 elements of 8 bytes on 16 ranks.
struct rank_buffers {
  std::vector<std::uint8_t> send = std::vector<std::uint8_t>(64 * 16 * 8, 1);
  std::vector<std::uint8_t> recv = std::vector<std::uint8_t>(64 * 16 * 8, 2);
};

/// Issues `a` on `comm` (blocking).
void issue(communicator& comm, const call_args& a, rank_buffers& b) {
  const void* s = a.use_pointers ? a.send : b.send.data();
  void* v = a.use_pointers ? a.recv : b.recv.data();
  collective_options o = with_algo(a.algo);
  o.tag = a.tag;
  o.tag_name = a.tag_name;
  switch (a.kind) {
    case collective_kind::all_reduce: return all_reduce(comm, s, v, a.count, a.type, a.op, o);
    case collective_kind::reduce_scatter: return reduce_scatter(comm, s, v, a.count, a.type, a.op, o);
    case collective_kind::all_gather: return all_gather(comm, s, v, a.count, a.type, o);
    case collective_kind::broadcast: return broadcast(comm, s, v, a.count, a.type, a.root, o);
    case collective_kind::reduce: return reduce(comm, s, v, a.count, a.type, a.op, a.root, o);
    case collective_kind::all_to_all: return all_to_all(comm, s, v, a.count, a.type, o);
    case collective_kind::barrier: return barrier(comm, o);
    default: throw std::logic_error("not a collective");
  }
}

constexpr collective_kind data_collectives[] = {collective_kind::all_reduce, collective_kind::reduce_scatter,
                                                collective_kind::all_gather, collective_kind::broadcast,
                                                collective_kind::reduce,     collective_kind::all_to_all};
constexpr collective_kind reductions[] = {collective_kind::all_reduce, collective_kind::reduce_scatter,
                                          collective_kind::reduce};

/// Runs, on `world` ranks, two valid all_reduce calls (so the failing call is #2), then
/// `args_of(rank)`; returns each rank's outcome of that call. Afterwards every rank runs one
/// more all_reduce and `usable` records whether it was right (contract errors leave the
/// communicator usable).
template <class ArgsOf>
std::vector<outcome> run_call(int world, ArgsOf&& args_of, std::vector<int>* usable = nullptr) {
  std::vector<outcome> o(static_cast<std::size_t>(world));
  if (usable) usable->assign(static_cast<std::size_t>(world), 0);
  const std::string error = rzt::launch_world(
      world,
      [&](communicator& comm) {
        rank_buffers b;
        for (int i = 0; i < 2; ++i) issue(comm, call_args{}, b);
        o[static_cast<std::size_t>(comm.rank())].capture([&] { issue(comm, args_of(comm.rank()), b); });
        std::int64_t x = comm.rank(), total = -1;
        all_reduce(comm, &x, &total, 1, dtype::int64, reduce_kind::sum);
        if (usable)
          (*usable)[static_cast<std::size_t>(comm.rank())] =
              total == static_cast<std::int64_t>(world) * (world - 1) / 2;
      },
      20.0);
  CHECK_MESSAGE(error.empty(), error);
  return o;
}

std::string name(collective_kind k) { return std::string(collective_name(k)); }

}  // namespace

// ------------------------------------------------------------------------------------------------
// Contract mismatches: raised on every rank, naming the collective, its sequence number and
// every rank's value; no data moves and the communicator stays usable.

TEST_CASE("collective mismatch is raised on every rank with each rank's collective") {
  std::vector<int> usable;
  auto o = run_call(
      3,
      [](int r) {
        call_args a;
        a.kind = r == 2 ? collective_kind::reduce : collective_kind::all_reduce;
        return a;
      },
      &usable);
  check_every_rank(o, errc::contract_mismatch,
                   {"#2", "collective mismatch", "ranks 0-1: all_reduce", "rank 2: reduce"});
  for (int u : usable) CHECK(u == 1);
  // barrier against a data collective
  o = run_call(2, [](int r) {
    call_args a;
    a.kind = r == 0 ? collective_kind::barrier : collective_kind::broadcast;
    return a;
  });
  check_every_rank(o, errc::contract_mismatch, {"#2", "rank 0: barrier", "rank 1: broadcast"});
}

TEST_CASE("count mismatch of every collective is raised on every rank") {
  for (collective_kind k : data_collectives)
    for (algorithm algo : every_algorithm) {
      if (k == collective_kind::all_to_all && algo == algorithm::halving_doubling) continue;
      INFO(name(k) << " " << algorithm_name(algo));
      std::vector<int> usable;
      auto o = run_call(
          4,
          [&](int r) {
            call_args a;
            a.kind = k;
            a.algo = algo;
            a.count = r == 2 ? 7 : 5;
            return a;
          },
          &usable);
      check_every_rank(o, errc::contract_mismatch, {name(k) + " #2", "count mismatch", "ranks 0-1, 3: 5", "rank 2: 7"});
      for (int u : usable) CHECK(u == 1);
    }
}

TEST_CASE("dtype mismatch of every collective is raised on every rank") {
  for (collective_kind k : data_collectives) {
    INFO(name(k));
    auto o = run_call(3, [&](int r) {
      call_args a;
      a.kind = k;
      a.type = r == 1 ? dtype::int64 : dtype::float64;  // same element size: only the dtype differs
      return a;
    });
    check_every_rank(o, errc::contract_mismatch,
                     {name(k) + " #2", "dtype mismatch", "ranks 0, 2: float64; rank 1: int64"});
  }
}

TEST_CASE("reduce op mismatch is raised on every rank; premul_sum scalars may differ") {
  for (collective_kind k : reductions) {
    INFO(name(k));
    auto o = run_call(3, [&](int r) {
      call_args a;
      a.kind = k;
      a.op = r == 0 ? reduce_kind::max : reduce_kind::sum;
      return a;
    });
    check_every_rank(o, errc::contract_mismatch,
                     {name(k) + " #2", "reduce op mismatch", "rank 0: max", "ranks 1-2: sum"});
    o = run_call(3, [&](int r) {
      call_args a;
      a.kind = k;
      a.op = r == 0 ? reduce_op(reduce_kind::avg) : reduce_op::premul_sum(2.0);
      return a;
    });
    check_every_rank(o, errc::contract_mismatch, {"reduce op mismatch", "rank 0: avg", "ranks 1-2: premulsum"});
    o = run_call(3, [&](int r) {  // NCCL allows a different premul_sum scalar per rank
      call_args a;
      a.kind = k;
      a.op = reduce_op::premul_sum(r + 1.0);
      return a;
    });
    for (const auto& x : o) CHECK_MESSAGE(!x.threw, x.message);
  }
}

TEST_CASE("root mismatch of broadcast and reduce is raised on every rank") {
  for (collective_kind k : {collective_kind::broadcast, collective_kind::reduce})
    for (algorithm algo : every_algorithm) {
      INFO(name(k) << " " << algorithm_name(algo));
      auto o = run_call(5, [&](int r) {
        call_args a;
        a.kind = k;
        a.algo = algo;
        a.root = r < 3 ? 1 : 4;
        return a;
      });
      check_every_rank(o, errc::contract_mismatch, {name(k) + " #2", "root mismatch", "ranks 0-2: 1", "ranks 3-4: 4"});
    }
}

TEST_CASE("tag mismatch (collective_options::tag) is raised on every rank, for every collective") {
  // Calls that differ in count as well are reported as a count mismatch: the tag comes last.
  {
    auto o = run_call(2, [](int r) {
      call_args a;
      a.count = r == 0 ? 4 : 6;
      a.tag = static_cast<std::uint64_t>(r);
      return a;
    });
    check_every_rank(o, errc::contract_mismatch, {"all_reduce #2", "count mismatch: rank 0: 4; rank 1: 6"});
  }
  for (collective_kind k :
       {collective_kind::all_reduce, collective_kind::reduce_scatter, collective_kind::all_gather,
        collective_kind::broadcast, collective_kind::reduce, collective_kind::all_to_all, collective_kind::barrier}) {
    INFO(name(k));
    std::vector<int> usable;
    auto o = run_call(
        4,
        [&](int r) {
          call_args a;
          a.kind = k;
          a.tag = r == 3 ? 0xffffffffffffffffull : 7;
          return a;
        },
        &usable);
    check_every_rank(o, errc::contract_mismatch,
                     {name(k) + " #2", "tag mismatch", "ranks 0-2: 0x7; rank 3: 0xffffffffffffffff"});
    for (int u : usable) CHECK(u == 1);
    // The same tag on every rank runs.
    o = run_call(3, [&](int) {
      call_args a;
      a.kind = k;
      a.tag = 12345;
      return a;
    });
    for (const auto& x : o) CHECK_MESSAGE(!x.threw, x.message);
  }
}

namespace {

/// A tag_namer's function for the test below: "step <tag>" for tags under 100, else nothing.
std::string step_name(const void* prefix, std::uint64_t tag) noexcept {
  if (tag >= 100) return {};
  return static_cast<const char*>(prefix) + std::to_string(tag);
}

}  // namespace

TEST_CASE("collective_options::tag_name names every rank's call in mismatch errors, with this rank's namer") {
  static const char prefix[] = "step ";
  const tag_namer namer{&step_name, prefix};
  // A tag mismatch names each rank's tag; a tag the namer does not know prints as a number.
  auto o = run_call(4, [&](int r) {
    call_args a;
    a.tag = r == 3 ? 0x1234 : 7;
    a.tag_name = namer;
    return a;
  });
  check_every_rank(o, errc::contract_mismatch, {"all_reduce #2", "tag mismatch", "ranks 0-2: step 7; rank 3: 0x1234"});
  // Another mismatch gains the calls' names: each rank's when they differ, one when alike.
  o = run_call(3, [&](int r) {
    call_args a;
    a.count = r == 0 ? 4 : 6;
    a.tag = r == 0 ? 1 : 2;
    a.tag_name = namer;
    return a;
  });
  check_every_rank(o, errc::contract_mismatch,
                   {"count mismatch: rank 0: 4; ranks 1-2: 6 (the calls: rank 0: step 1; ranks 1-2: step 2)"});
  o = run_call(2, [&](int r) {
    call_args a;
    a.type = r == 0 ? dtype::float32 : dtype::int32;
    a.tag = 5;
    a.tag_name = namer;
    return a;
  });
  check_every_rank(o, errc::contract_mismatch, {"dtype mismatch: rank 0: float32; rank 1: int32 (in step 5)"});
  // Invalid arguments are not a mismatch: no names added.
  o = run_call(2, [&](int r) {
    call_args a;
    a.root = r == 0 ? 9 : 0;
    a.kind = collective_kind::broadcast;
    a.tag = 5;
    a.tag_name = namer;
    return a;
  });
  for (const auto& x : o) {
    CHECK(x.threw);
    CHECK_FALSE(contains(x.message, "step 5"));
  }
}

TEST_CASE("algorithm mismatch is raised on every rank, including for barrier") {
  for (collective_kind k :
       {collective_kind::all_reduce, collective_kind::reduce_scatter, collective_kind::all_gather,
        collective_kind::broadcast, collective_kind::reduce, collective_kind::all_to_all, collective_kind::barrier}) {
    INFO(name(k));
    auto o = run_call(3, [&](int r) {
      call_args a;
      a.kind = k;
      a.algo = r == 1 ? algorithm::direct : algorithm::ring;
      return a;
    });
    check_every_rank(o, errc::contract_mismatch,
                     {name(k) + " #2", "algorithm mismatch", "ranks 0, 2: ring; rank 1: direct"});
  }
}

TEST_CASE("an algorithm the local backend or the collective does not offer is an invalid argument on every rank") {
  for (collective_kind k :
       {collective_kind::all_reduce, collective_kind::reduce_scatter, collective_kind::all_gather,
        collective_kind::broadcast, collective_kind::reduce, collective_kind::all_to_all, collective_kind::barrier}) {
    INFO(name(k));
    std::vector<int> usable;
    auto o = run_call(
        2,
        [&](int) {
          call_args a;
          a.kind = k;
          a.algo = algorithm::native;  // the local backend has no native collectives
          return a;
        },
        &usable);
    check_every_rank(o, errc::invalid_argument, {"algorithm native is not available for " + name(k), "local"});
    for (int u : usable) CHECK(u == 1);
  }
  auto o = run_call(4, [](int) {
    call_args a;
    a.kind = collective_kind::all_to_all;
    a.algo = algorithm::halving_doubling;
    return a;
  });
  check_every_rank(o, errc::invalid_argument, {"algorithm halving_doubling is not available for all_to_all"});
  // an out-of-range algorithm value
  o = run_call(2, [](int) {
    call_args a;
    a.algo = static_cast<algorithm>(77);
    return a;
  });
  check_every_rank(o, errc::invalid_argument, {"ranks 0-1: algorithm invalid is not available"});
}

// ------------------------------------------------------------------------------------------------
// Timeouts: every waiting rank fails with errc::timeout naming the ranks that never arrived.

namespace {

/// Ranks in `missing` never call the collective (they wait until every other rank has failed,
/// then return); the others call all_reduce with algorithm `algo`. Returns each rank's outcome.
/// `per_communicator`: the timeout is set with communicator::set_timeout instead of launch_options.
std::vector<outcome> run_with_missing(int world, const std::vector<int>& missing, algorithm algo,
                                      bool per_communicator) {
  std::vector<outcome> o(static_cast<std::size_t>(world));
  std::atomic<int> failed{0};
  const int waiting = world - static_cast<int>(missing.size());
  local::launch_options options;
  options.timeout = std::chrono::duration<double>(per_communicator ? 60.0 : 0.25);
  const auto start = std::chrono::steady_clock::now();
  ringzero::local::launch(
      world,
      [&](communicator& comm) {
        if (per_communicator) comm.set_timeout(std::chrono::milliseconds(250));
        if (std::find(missing.begin(), missing.end(), comm.rank()) != missing.end()) {
          while (failed.load() < waiting && std::chrono::steady_clock::now() - start < std::chrono::seconds(60))
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          return;
        }
        std::vector<float> x(16, 1.0f), y(16, 0.0f);
        o[static_cast<std::size_t>(comm.rank())].capture(
            [&] { all_reduce(comm, x.data(), y.data(), 16, dtype::float32, reduce_kind::sum, with_algo(algo)); });
        failed.fetch_add(1);
      },
      options);
  return o;
}

}  // namespace

TEST_CASE("timeout: every waiting rank fails naming the ranks that never arrived") {
  for (algorithm algo : every_algorithm)
    for (bool per_communicator : {false, true}) {
      INFO(algorithm_name(algo) << (per_communicator ? " (communicator::set_timeout)" : " (launch_options::timeout)"));
      auto o = run_with_missing(4, {3}, algo, per_communicator);
      for (int r = 0; r < 3; ++r)
        check_error(o[static_cast<std::size_t>(r)], r, errc::timeout, {"rank 3", "all_reduce #0", "arrive"});
      o = run_with_missing(6, {2, 4, 5}, algo, per_communicator);
      for (int r : {0, 1, 3})
        check_error(o[static_cast<std::size_t>(r)], r, errc::timeout, {"ranks 2, 4-5", "all_reduce #0"});
    }
}

TEST_CASE("timeout: the first rank to give up says how long it waited") {
  auto o = run_with_missing(2, {1}, algorithm::ring, false);
  check_error(o[0], 0, errc::timeout, {"timed out after 0.25 s", "rank 1", "never arrived"});
}

TEST_CASE("timeout from RINGZERO_TIMEOUT (seconds) applies when the launch sets none") {
  rzt::scoped_env env("RINGZERO_TIMEOUT", "0.2");
  std::vector<outcome> o(2);
  std::vector<double> seconds(2, 0.0);
  std::atomic<bool> done{false};
  ringzero::local::launch(2, [&](communicator& comm) {
    seconds[static_cast<std::size_t>(comm.rank())] = comm.timeout().count();
    if (comm.rank() == 1) {
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    o[0].capture([&] { barrier(comm); });
    done = true;
  });
  for (double t : seconds) CHECK(t == doctest::Approx(0.2));
  check_error(o[0], 0, errc::timeout, {"0.2 s", "rank 1", "barrier #0"});
}

TEST_CASE("timeout in a point-to-point transfer names the peer") {
  std::vector<outcome> o(2);
  std::atomic<bool> done{false};
  const std::string error = rzt::launch_world(
      2,
      [&](communicator& comm) {
        if (comm.rank() == 1) {
          while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          return;
        }
        float x = 1.0f;
        o[0].capture([&] { send(comm, &x, 1, dtype::float32, 1); });  // rank 1 never receives
        done = true;
      },
      0.25);
  CHECK(error.empty());
  check_error(o[0], 0, errc::timeout, {"rank 1", "send"});
}

TEST_CASE("a rank arriving after the others timed out fails too and writes no one's buffers") {
  for (algorithm algo : every_algorithm) {
    INFO(algorithm_name(algo));
    const int world = 3;
    // buffers owned here so that they outlive the ranks: after failing, nobody may write them
    std::vector<std::vector<float>> send(world, std::vector<float>(64, 1.0f)),
        recv(world, std::vector<float>(64, -5.0f));
    std::vector<outcome> o(world);
    std::atomic<int> failed{0};
    const auto start = std::chrono::steady_clock::now();
    ringzero::local::launch(
        world,
        [&](local::communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          if (comm.rank() == 2) {  // late: waits until the others gave up and left the world
            while ((failed.load() < 2 || !comm.shared_world().exited(0) || !comm.shared_world().exited(1)) &&
                   std::chrono::steady_clock::now() - start < std::chrono::seconds(60))
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          o[r].capture([&] {
            all_reduce(comm, send[r].data(), recv[r].data(), 64, dtype::float32, reduce_kind::sum, with_algo(algo));
          });
          if (comm.rank() != 2) failed.fetch_add(1);
        },
        rzt::timeout_after(0.25));
    for (int r = 0; r < 2; ++r) check_error(o[static_cast<std::size_t>(r)], r, errc::timeout, {"rank 2"});
    CHECK(o[2].threw);
    CHECK(o[2].is_ringzero);
    for (int r = 0; r < 2; ++r)
      for (float v : recv[static_cast<std::size_t>(r)])
        REQUIRE_MESSAGE(v == -5.0f, "rank 2 wrote rank " << r << "'s output after it failed");
  }
}

// ------------------------------------------------------------------------------------------------
// Ranks that leave: returning early gives errc::peer_exited, throwing errc::aborted; launch
// rethrows the lowest failing rank's exception.

TEST_CASE("a rank whose function returns while others wait: peer_exited on every waiting rank") {
  for (algorithm algo : every_algorithm) {
    INFO(algorithm_name(algo));
    std::vector<outcome> o(3);
    const std::string error = rzt::launch_world(3, [&](communicator& comm) {
      if (comm.rank() == 2) return;  // leaves at once
      std::vector<std::int32_t> x(8, 1), y(8, 0);
      o[static_cast<std::size_t>(comm.rank())].capture(
          [&] { all_reduce(comm, x.data(), y.data(), 8, dtype::int32, reduce_kind::sum, with_algo(algo)); });
    });
    CHECK(error.empty());
    for (int r = 0; r < 2; ++r)
      check_error(o[static_cast<std::size_t>(r)], r, errc::peer_exited, {"rank 2", "returned", "all_reduce #0"});
  }
}

TEST_CASE("a rank that returns after finishing some collectives: peers waiting for the next one fail") {
  std::vector<outcome> o(2);
  const std::string error = rzt::launch_world(2, [&](communicator& comm) {
    barrier(comm);
    barrier(comm);
    if (comm.rank() == 1) return;
    o[0].capture([&] { barrier(comm); });
  });
  CHECK(error.empty());
  check_error(o[0], 0, errc::peer_exited, {"rank 1", "barrier #2"});
}

TEST_CASE("a rank that throws while others wait: aborted on every waiting rank, and launch rethrows") {
  SUBCASE("the thrower is the lowest failing rank: launch rethrows its own exception") {
    std::vector<outcome> o(3);
    bool rethrown = false;
    try {
      ringzero::local::launch(
          3,
          [&](communicator& comm) {
            if (comm.rank() == 0) throw std::runtime_error("boom from rank 0");
            std::vector<double> x(8, 1.0), y(8, 0.0);
            o[static_cast<std::size_t>(comm.rank())].capture(
                [&] { all_reduce(comm, x.data(), y.data(), 8, dtype::float64, reduce_kind::sum); });
          },
          rzt::timeout_after(30));
    } catch (const std::runtime_error& e) { rethrown = contains(e.what(), "boom from rank 0"); }
    CHECK(rethrown);
    for (int r = 1; r < 3; ++r)
      check_error(o[static_cast<std::size_t>(r)], r, errc::aborted, {"boom from rank 0", "rank 0 failed"});
  }
  SUBCASE("errors escaping every rank: launch rethrows the lowest rank's, which names the first failure") {
    std::optional<ringzero::error> caught;
    try {
      ringzero::local::launch(
          4,
          [&](communicator& comm) {
            if (comm.rank() == 3) throw std::runtime_error("boom from rank 3");
            std::vector<float> x(8, 1.0f), y(8, 0.0f);
            all_reduce(comm, x.data(), y.data(), 8, dtype::float32, reduce_kind::sum);
          },
          rzt::timeout_after(30));
    } catch (const ringzero::error& e) { caught.emplace(e); }
    REQUIRE(caught.has_value());
    CHECK(caught->kind() == errc::aborted);
    CHECK(contains(caught->what(), "rank 0/4"));
    CHECK(contains(caught->what(), "boom from rank 3"));
  }
  SUBCASE("an exception not derived from std::exception") {
    std::vector<outcome> o(2);
    bool rethrown = false;
    try {
      ringzero::local::launch(
          2,
          [&](communicator& comm) {
            if (comm.rank() == 1) throw 42;
            o[0].capture([&] { barrier(comm); });
          },
          rzt::timeout_after(30));
    } catch (int v) { rethrown = v == 42; }
    CHECK(rethrown);
    check_error(o[0], 0, errc::aborted, {"rank 1 failed", "not derived from std::exception"});
  }
}

TEST_CASE("a rank that throws or returns while its peer waits in a transfer") {
  std::vector<outcome> o(2);
  try {
    ringzero::local::launch(
        2,
        [&](communicator& comm) {
          if (comm.rank() == 1) throw std::runtime_error("receiver gone");
          float x = 0.0f;
          o[0].capture([&] { recv(comm, &x, 1, dtype::float32, 1); });
        },
        rzt::timeout_after(30));
  } catch (const std::runtime_error&) {}
  check_error(o[0], 0, errc::aborted, {"receiver gone"});
  o.assign(2, outcome{});
  const std::string error = rzt::launch_world(2, [&](communicator& comm) {
    if (comm.rank() == 0) return;
    float x = 0.0f;
    o[1].capture([&] { recv(comm, &x, 1, dtype::float32, 0); });
  });
  CHECK(error.empty());
  check_error(o[1], 1, errc::peer_exited, {"rank 0", "returned"});
}

// ------------------------------------------------------------------------------------------------
// Bad input: a clear invalid_argument on every rank, naming the rank and what was wrong.

TEST_CASE("null buffers with a non-zero count are refused on every rank, naming the rank") {
  for (collective_kind k : data_collectives)
    for (bool null_send : {true, false}) {
      INFO(name(k) << (null_send ? " null send" : " null recv"));
      rank_buffers keep;
      auto o = run_call(3, [&](int r) {
        call_args a;
        a.kind = k;
        a.count = 5;
        if (r == 1) {
          a.use_pointers = true;
          a.send = null_send ? nullptr : keep.send.data();
          a.recv = null_send ? keep.recv.data() : nullptr;
          a.root = 0;  // rank 1 is not the root: for broadcast a null send and for reduce a null recv are fine there
        }
        return a;
      });
      const bool ignored =
          (k == collective_kind::broadcast && null_send) || (k == collective_kind::reduce && !null_send);
      if (ignored) {
        for (const auto& x : o) CHECK_MESSAGE(!x.threw, x.message);
      } else {
        check_every_rank(o, errc::invalid_argument,
                         {name(k) + " #2",
                          "rank 1: " + std::string(null_send ? "send" : "receive") + " buffer is null with count 5"});
      }
    }
}

TEST_CASE("a count that overflows the byte size is refused on every rank") {
  for (collective_kind k : data_collectives) {
    INFO(name(k));
    auto o = run_call(4, [&](int) {
      call_args a;
      a.kind = k;
      a.type = dtype::float64;
      a.count = std::uint64_t{1} << 61;  // 2^61 * 8 bytes = 2^64
      return a;
    });
    check_every_rank(o, errc::invalid_argument,
                     {"count 2305843009213693952 of float64 overflows the buffer size in bytes"});
  }
  for (collective_kind k :
       {collective_kind::reduce_scatter, collective_kind::all_gather, collective_kind::all_to_all}) {
    INFO(name(k) << ": the per-rank count fits, count * world size does not");
    auto o = run_call(4, [&](int) {
      call_args a;
      a.kind = k;
      a.type = dtype::int8;
      a.count = std::uint64_t{1} << 62;
      return a;
    });
    check_every_rank(o, errc::invalid_argument, {"overflows the buffer size in bytes (times world size 4)"});
  }
  for (collective_kind k : data_collectives) {
    INFO(name(k) << ": 2^64 - 4 bytes fit in 64 bits but in no buffer (more than PTRDIFF_MAX)");
    auto o = run_call(4, [&](int) {
      call_args a;
      a.kind = k;
      a.type = dtype::float32;
      a.count = (std::uint64_t{1} << 62) - 1;
      return a;
    });
    check_every_rank(o, errc::invalid_argument,
                     {"count 4611686018427387903 of float32 overflows the buffer size in bytes"});
  }
}

TEST_CASE("a root out of range is refused on every rank") {
  for (collective_kind k : {collective_kind::broadcast, collective_kind::reduce})
    for (int root : {-1, 4, 1000}) {
      INFO(name(k) << " root " << root);
      auto o = run_call(4, [&](int) {
        call_args a;
        a.kind = k;
        a.root = root;
        return a;
      });
      check_every_rank(o, errc::invalid_argument, {"root " + std::to_string(root) + " is outside [0, 4)"});
    }
  // on one rank only: still every rank fails (never a hang), the message names that rank
  auto o = run_call(3, [](int r) {
    call_args a;
    a.kind = collective_kind::reduce;
    a.root = r == 2 ? 3 : 0;
    return a;
  });
  check_every_rank(o, errc::invalid_argument, {"rank 2: root 3 is outside [0, 3)"});
}

TEST_CASE("a world size below 1 and a rank outside the world are refused") {
  for (int n : {0, -1, -100}) {
    bool refused = false;
    try {
      ringzero::local::launch(n, [](communicator&) {});
    } catch (const ringzero::error& e) {
      refused = e.kind() == errc::invalid_argument &&
                contains(e.what(), "world size must be at least 1, got " + std::to_string(n));
    }
    CHECK_MESSAGE(refused, "launch(" << n << ")");
    CHECK_THROWS_AS(local::world{n}, ringzero::error);
  }
  local::world w(2);
  for (int r : {-1, 2, 7}) {
    bool refused = false;
    try {
      local::communicator c(w, r);
    } catch (const ringzero::error& e) {
      refused =
          e.kind() == errc::invalid_argument && contains(e.what(), "rank " + std::to_string(r) + " is outside [0, 2)");
    }
    CHECK_MESSAGE(refused, "rank " << r);
  }
}

TEST_CASE("unknown dtype and reduce op values are refused on every rank") {
  for (collective_kind k : data_collectives) {
    INFO(name(k));
    auto o = run_call(3, [&](int r) {
      call_args a;
      a.kind = k;
      if (r == 0) a.type = static_cast<dtype>(42);
      return a;
    });
    check_every_rank(o, errc::invalid_argument, {"rank 0: unknown dtype value 42"});
  }
  for (collective_kind k : reductions) {
    INFO(name(k));
    auto o = run_call(3, [&](int) {
      call_args a;
      a.kind = k;
      a.op = static_cast<reduce_kind>(17);
      return a;
    });
    check_every_rank(o, errc::invalid_argument, {"ranks 0-2: unknown reduce op value 17"});
  }
}

TEST_CASE("premul_sum scalars: non-integral on integer dtypes, non-finite, and too large are refused") {
  struct bad {
    dtype type;
    double scalar;
    const char* says;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const bad& b :
       {bad{dtype::int32, 0.5, "premul_sum scalar 0.5"}, bad{dtype::uint8, -2.25, "premul_sum scalar -2.25"},
        bad{dtype::int64, 9007199254740992.0, "below 2^53"}, bad{dtype::float32, nan, "not finite"},
        bad{dtype::bfloat16, inf, "not finite"}, bad{dtype::int8, -inf, "not finite"}})
    for (collective_kind k : reductions) {
      INFO(name(k) << " " << dtype_name(b.type) << " scalar " << b.scalar);
      auto o = run_call(2, [&](int r) {
        call_args a;
        a.kind = k;
        a.type = b.type;
        a.op = reduce_op::premul_sum(r == 1 ? b.scalar : 1.0);
        return a;
      });
      check_every_rank(o, errc::invalid_argument, {"rank 1: ", b.says});
    }
  // integral scalars, also negative ones, are fine on integer dtypes
  auto o = run_call(2, [](int r) {
    call_args a;
    a.type = dtype::uint8;
    a.op = reduce_op::premul_sum(r == 0 ? -3.0 : 1e15);
    return a;
  });
  for (const auto& x : o) CHECK_MESSAGE(!x.threw, x.message);
}

TEST_CASE("buffers that overlap in ways the collective forbids are refused on every rank") {
  const int world = 3;
  // element offsets relative to one shared arena per rank
  struct layout {
    collective_kind kind;
    std::int64_t recv_offset;  ///< recv = send + this many elements (on rank 1)
    const char* rule;
  };
  const std::uint64_t count = 4;
  for (const layout& l : {layout{collective_kind::all_reduce, 1, "in place requires send == recv"},
                          layout{collective_kind::all_reduce, -3, "in place requires send == recv"},
                          layout{collective_kind::broadcast, 2, "in place requires send == recv"},
                          layout{collective_kind::reduce, 3, "in place requires send == recv"},
                          // reduce_scatter in place needs recv == send + rank*count = send + 4 on rank 1
                          layout{collective_kind::reduce_scatter, 0, "in place requires recv == send + rank*count"},
                          layout{collective_kind::reduce_scatter, 8, "in place requires recv == send + rank*count"},
                          layout{collective_kind::reduce_scatter, 5, "in place requires recv == send + rank*count"},
                          // all_gather in place needs send == recv + rank*count = recv + 4 on rank 1
                          layout{collective_kind::all_gather, 0, "in place requires send == recv + rank*count"},
                          layout{collective_kind::all_gather, -8, "in place requires send == recv + rank*count"},
                          layout{collective_kind::all_to_all, 0, "all_to_all cannot run in place"},
                          layout{collective_kind::all_to_all, 2, "all_to_all cannot run in place"}}) {
    INFO(name(l.kind) << " recv = send + " << l.recv_offset);
    std::vector<std::vector<float>> arena(world, std::vector<float>(64, 0.0f));
    auto o = run_call(world, [&](int r) {
      call_args a;
      a.kind = l.kind;
      a.count = count;
      a.root = 1;  // rank 1 is the root: its send and recv are both used
      if (r == 1) {
        float* base = arena[1].data() + 16;
        a.use_pointers = true;
        a.send = base;
        a.recv = base + l.recv_offset;
      }
      return a;
    });
    check_every_rank(o, errc::invalid_argument, {"rank 1: send buffer", "overlap", l.rule});
  }
  // the in-place conventions themselves are accepted
  for (collective_kind k : {collective_kind::reduce_scatter, collective_kind::all_gather}) {
    std::vector<std::vector<float>> arena(world, std::vector<float>(64, 1.0f));
    auto o = run_call(world, [&](int r) {
      call_args a;
      a.kind = k;
      a.count = count;
      float* base = arena[static_cast<std::size_t>(r)].data();
      a.use_pointers = true;
      a.send = base + (k == collective_kind::all_gather ? static_cast<std::uint64_t>(r) * count : 0);
      a.recv = base + (k == collective_kind::reduce_scatter ? static_cast<std::uint64_t>(r) * count : 0);
      return a;
    });
    for (const auto& x : o) CHECK_MESSAGE(!x.threw, x.message);
  }
}

TEST_CASE("ranks writing each other's buffers are refused on every rank") {
  const int world = 3;
  std::vector<float> shared(64, 0.0f);
  std::vector<std::vector<float>> own(world, std::vector<float>(64, 0.0f));
  SUBCASE("two ranks pass the same output buffer") {
    auto o = run_call(world, [&](int r) {
      call_args a;
      a.use_pointers = true;
      a.send = own[static_cast<std::size_t>(r)].data();
      a.recv = r == 2 ? own[static_cast<std::size_t>(r)].data() + 8 : shared.data();  // ranks 0 and 1 share
      return a;
    });
    check_every_rank(o, errc::invalid_argument,
                     {"buffer overlap between ranks", "rank 0's receive buffer", "rank 1's receive buffer"});
  }
  SUBCASE("a rank's output is another rank's input") {
    auto o = run_call(world, [&](int r) {
      call_args a;
      a.kind = collective_kind::all_gather;
      a.count = 2;
      a.use_pointers = true;
      a.send = own[static_cast<std::size_t>(r)].data();
      a.recv = r == 1 ? own[0].data() : own[static_cast<std::size_t>(r)].data() + 16;
      return a;
    });
    check_every_rank(o, errc::invalid_argument,
                     {"buffer overlap between ranks", "rank 1's receive buffer", "rank 0's send buffer"});
  }
}

TEST_CASE("typed calls refuse spans of the wrong size on every rank") {
  std::vector<outcome> o(2);
  const std::string error = rzt::launch_world(2, [&](communicator& comm) {
    std::vector<float> send(3, 1.0f), recv(comm.rank() == 0 ? 4 : 3, 0.0f);
    o[static_cast<std::size_t>(comm.rank())].capture(
        [&] { all_reduce(comm, std::span<const float>(send), std::span<float>(recv)); });
  });
  CHECK(error.empty());
  // rank 0's spans disagree (3 vs 4); counts also differ (4 vs 3)
  check_every_rank(o, errc::invalid_argument, {"rank 0: send span has 3 elements"});
  o.assign(2, outcome{});
  const std::string error2 = rzt::launch_world(2, [&](communicator& comm) {
    std::vector<std::int32_t> send(5, 1), recv(2, 0);  // reduce_scatter needs send = 2 * 2 = 4
    o[static_cast<std::size_t>(comm.rank())].capture(
        [&] { reduce_scatter(comm, std::span<const std::int32_t>(send), std::span<std::int32_t>(recv)); });
  });
  CHECK(error2.empty());
  check_every_rank(o, errc::invalid_argument, {"send span has 5 elements (needs 4)"});
}

TEST_CASE("point-to-point bad input is refused before any transfer") {
  std::vector<outcome> o(8);
  const std::string error = rzt::launch_world(2, [&](communicator& comm) {
    if (comm.rank() != 0) return;
    float x = 1.0f;
    o[0].capture([&] { send(comm, &x, 1, dtype::float32, 2); });
    o[1].capture([&] { recv(comm, &x, 1, dtype::float32, -1); });
    o[2].capture([&] { send(comm, &x, 1, dtype::float32, 0); });
    o[3].capture([&] { recv(comm, nullptr, 3, dtype::float32, 1); });
    o[4].capture([&] { send(comm, &x, 1, static_cast<dtype>(99), 1); });
    o[5].capture([&] { send(comm, &x, std::uint64_t{1} << 62, dtype::int32, 1); });
    o[6].capture([&] { sendrecv(comm, &x, 1, 0, &x, 1, 0, dtype::float32); });
    o[7].capture([&] { recv(comm, &x, 1, dtype::float32, 0); });
  });
  CHECK(error.empty());
  check_error(o[0], 0, errc::invalid_argument, {"peer 2 is outside [0, 2)"});
  check_error(o[1], 0, errc::invalid_argument, {"peer -1 is outside [0, 2)"});
  check_error(o[2], 0, errc::invalid_argument, {"send to oneself"});
  check_error(o[3], 0, errc::invalid_argument, {"buffer is null with count 3"});
  check_error(o[4], 0, errc::invalid_argument, {"unknown dtype value 99"});
  check_error(o[5], 0, errc::invalid_argument, {"overflows the buffer size in bytes"});
  check_error(o[6], 0, errc::invalid_argument, {"overlap"});
  check_error(o[7], 0, errc::invalid_argument, {"recv from oneself"});
}

TEST_CASE("set_timeout refuses a non-positive timeout") {
  std::vector<outcome> o(3);
  const std::string error = rzt::launch_world(1, [&](communicator& comm) {
    o[0].capture([&] { comm.set_timeout(std::chrono::seconds(0)); });
    o[1].capture([&] { comm.set_timeout(std::chrono::duration<double>(-1.0)); });
    o[2].capture([&] { comm.set_timeout(std::chrono::duration<double>(std::numeric_limits<double>::quiet_NaN())); });
  });
  CHECK(error.empty());
  for (const auto& x : o) check_error(x, 0, errc::invalid_argument, {"timeout must be positive"});
}

TEST_CASE("an infinite or huge timeout means for ever, not an instant timeout") {
  // A deadline of now + 1e10 s overflowed the clock's 64-bit nanoseconds into the past: the
  // first wait timed out at once. Such timeouts are kept as max_timeout_seconds.
  for (double seconds : {1e10, std::numeric_limits<double>::infinity()}) {
    INFO("timeout " << seconds << " s");
    std::vector<double> kept(2, 0.0);
    std::vector<float> sums(2, 0.0f);
    const std::string error = rzt::launch_world(2, [&](communicator& comm) {
      comm.set_timeout(std::chrono::duration<double>(seconds));
      kept[static_cast<std::size_t>(comm.rank())] = comm.timeout().count();
      if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 waits
      float x = 1.0f, y = 0.0f;
      all_reduce(comm, &x, &y, 1, dtype::float32, reduce_kind::sum);
      sums[static_cast<std::size_t>(comm.rank())] = y;
    });
    CHECK(error.empty());
    for (int r = 0; r < 2; ++r) {
      CHECK(kept[static_cast<std::size_t>(r)] == ringzero::max_timeout_seconds);
      CHECK(sums[static_cast<std::size_t>(r)] == 2.0f);
    }
  }
  rzt::scoped_env env("RINGZERO_TIMEOUT", "1e12");
  CHECK(ringzero::env_timeout().count() == ringzero::max_timeout_seconds);
}

// ------------------------------------------------------------------------------------------------
// Malformed environment variables: an error when the communicator is made, naming the variable.

TEST_CASE("a malformed RINGZERO_ALGO is refused when the communicators are made") {
  for (const char* value : {"bogus", "RING", "ring ", "halving-doubling", "1"}) {
    INFO("RINGZERO_ALGO=" << value);
    rzt::scoped_env env("RINGZERO_ALGO", value);
    bool refused = false;
    try {
      ringzero::local::launch(
          3, [](communicator& comm) { barrier(comm); }, rzt::timeout_after(10));
    } catch (const ringzero::error& e) {
      refused =
          e.kind() == errc::invalid_argument && contains(e.what(), "RINGZERO_ALGO=\"" + std::string(value) + "\"");
    }
    CHECK(refused);
  }
}

TEST_CASE("a malformed RINGZERO_TIMEOUT is refused, with or without a launch timeout") {
  for (const char* value : {"abc", "0", "-5", "inf", "nan", "1e999", "10s", " "}) {
    for (bool launch_timeout : {false, true}) {
      INFO("RINGZERO_TIMEOUT=\"" << value << "\"" << (launch_timeout ? " with launch_options::timeout" : ""));
      rzt::scoped_env env("RINGZERO_TIMEOUT", value);
      bool refused = false;
      try {
        local::launch_options opt;
        if (launch_timeout) opt.timeout = std::chrono::seconds(5);
        ringzero::local::launch(
            2, [](communicator& comm) { barrier(comm); }, opt);
      } catch (const ringzero::error& e) {
        refused = e.kind() == errc::invalid_argument && contains(e.what(), "RINGZERO_TIMEOUT");
      }
      CHECK(refused);
    }
  }
}

TEST_CASE("a malformed RINGZERO_PIN is refused") {
  rzt::scoped_env env("RINGZERO_PIN", "maybe");
  CHECK_THROWS_WITH_AS(ringzero::local::launch(2, [](communicator&) {}), doctest::Contains("RINGZERO_PIN"),
                       ringzero::error);
}

TEST_CASE("two threads running collectives on one communicator at once: a clear error on the second") {
  // Rank 0's own thread enters an all_reduce and waits there for rank 1 (which comes 400 ms
  // later); meanwhile a second thread of rank 0 calls a collective on the same communicator.
  std::atomic<int> second_kind{-1};
  std::string second_what;
  std::array<std::vector<float>, 2> out;
  const std::string error = rzt::launch_world(2, [&](communicator& comm) {
    std::vector<float> x(1000, static_cast<float>(comm.rank() + 1));
    if (comm.rank() == 0) {
      std::thread intruder([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        std::vector<float> y(10, 1.0f);
        try {
          all_reduce(comm, y.data(), y.data(), y.size(), dtype::float32, reduce_kind::sum);
        } catch (const ringzero::error& e) {
          second_kind = static_cast<int>(e.kind());
          second_what = e.what();
        }
      });
      all_reduce(comm, x.data(), x.data(), x.size(), dtype::float32, reduce_kind::sum);
      intruder.join();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      all_reduce(comm, x.data(), x.data(), x.size(), dtype::float32, reduce_kind::sum);
    }
    out[static_cast<std::size_t>(comm.rank())] = x;
  });
  REQUIRE(error.empty());
  CHECK(second_kind.load() == static_cast<int>(errc::invalid_argument));
  CHECK_MESSAGE(second_what.find("another thread is running a collective on this communicator") != std::string::npos,
                second_what);
  CHECK_MESSAGE(second_what.find("rank 0") != std::string::npos, second_what);
  // The first thread's collective was not disturbed.
  for (const auto& v : out)
    for (float f : v) CHECK(f == 3.0f);
}

TEST_CASE("error_text: a program's line names ringzero only where the error says where it happened") {
  // Outside any communicator: the message alone, so "<program>: <message>" names one program.
  const error plain(errc::io_error, "cannot open IDX file /x");
  CHECK(std::string(plain.what()) == "ringzero: cannot open IDX file /x");
  CHECK(error_text(plain) == "cannot open IDX file /x");
  // With a backend, a rank or a collective: whole, as what() says it.
  const error located(errc::timeout, error_context{"local", 1, 4, "all_reduce", 7}, "rank 2 never arrived");
  CHECK(error_text(located) == "ringzero [local rank 1/4] all_reduce #7: rank 2 never arrived");
  CHECK(error_text(located) == located.what());
  const error only_collective(errc::invalid_argument, error_context{"", -1, -1, "barrier", -1}, "bad");
  CHECK(error_text(only_collective) == "ringzero barrier: bad");
  // Any other exception: its what().
  const std::runtime_error other("something else");
  CHECK(error_text(other) == "something else");
}
