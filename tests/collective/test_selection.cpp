// Algorithm selection: RINGZERO_ALGO forcing (like NCCL_ALGO), per-call
// `collective_options::algo`, `communicator::set_forced_algorithm`, and the default (auto)
// choice: the cost model's cheapest available algorithm, identical on every rank, and correct
// results for every collective across the sizes where the choice changes.
//
// Which algorithm ran is observed from outside: a rank that asks for algorithm A explicitly
// while its peers ask for `auto` succeeds exactly when `auto` resolved to A on the peers (the
// contract check compares resolved algorithms); the descriptor built by the collective layer is
// also inspected directly.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "harness.hpp"
#include "ringzero/core/tuning_table.hpp"
#include "ringzero/ringzero.hpp"

using namespace ringzero;
using rzt::check_every_rank;
using rzt::outcome;
using rzt::with_algo;

namespace {

constexpr collective_kind all_collectives[] = {collective_kind::all_reduce, collective_kind::reduce_scatter,
                                               collective_kind::all_gather, collective_kind::broadcast,
                                               collective_kind::reduce,     collective_kind::all_to_all,
                                               collective_kind::barrier};

/// Runs collective `k` on `comm` with `count` int32 elements per rank and algorithm `a`, and
/// returns the number of wrong elements (values chosen so that every sum is exact).
std::uint64_t run_and_check(communicator& comm, collective_kind k, std::uint64_t count, algorithm a) {
  const int r = comm.rank(), n = comm.world_size();
  const auto un = static_cast<std::uint64_t>(n);
  const auto o = with_algo(a);
  auto v = [](int rank, std::uint64_t i) { return static_cast<std::int32_t>(rank * 100 + static_cast<int>(i % 89)); };
  auto sum_of = [&](std::uint64_t i) {
    std::int32_t s = 0;
    for (int q = 0; q < n; ++q) s += v(q, i);
    return s;
  };
  std::uint64_t bad = 0;
  const int root = n - 1;
  switch (k) {
    case collective_kind::all_reduce:
    case collective_kind::reduce: {
      std::vector<std::int32_t> in(count), out(count, -1);
      for (std::uint64_t i = 0; i < count; ++i) in[i] = v(r, i);
      if (k == collective_kind::all_reduce)
        all_reduce(comm, in.data(), out.data(), count, dtype::int32, reduce_kind::sum, o);
      else
        reduce(comm, in.data(), out.data(), count, dtype::int32, reduce_kind::sum, root, o);
      for (std::uint64_t i = 0; i < count; ++i)
        bad += (k == collective_kind::reduce && r != root) ? out[i] != -1 : out[i] != sum_of(i);
      break;
    }
    case collective_kind::reduce_scatter: {
      std::vector<std::int32_t> in(count * un), out(count, -1);
      for (std::uint64_t j = 0; j < count * un; ++j) in[j] = v(r, j);
      reduce_scatter(comm, in.data(), out.data(), count, dtype::int32, reduce_kind::sum, o);
      for (std::uint64_t i = 0; i < count; ++i) bad += out[i] != sum_of(static_cast<std::uint64_t>(r) * count + i);
      break;
    }
    case collective_kind::all_gather: {
      std::vector<std::int32_t> in(count), out(count * un, -1);
      for (std::uint64_t i = 0; i < count; ++i) in[i] = v(r, i);
      all_gather(comm, in.data(), out.data(), count, dtype::int32, o);
      for (std::uint64_t j = 0; j < count * un; ++j) bad += out[j] != v(static_cast<int>(j / count), j % count);
      break;
    }
    case collective_kind::broadcast: {
      std::vector<std::int32_t> buf(count, -1);
      if (r == root)
        for (std::uint64_t i = 0; i < count; ++i) buf[i] = v(r, i);
      broadcast(comm, buf.data(), buf.data(), count, dtype::int32, root, o);
      for (std::uint64_t i = 0; i < count; ++i) bad += buf[i] != v(root, i);
      break;
    }
    case collective_kind::all_to_all: {
      std::vector<std::int32_t> in(count * un), out(count * un, -1);
      for (std::uint64_t j = 0; j < count * un; ++j) in[j] = v(r, j);
      all_to_all(comm, in.data(), out.data(), count, dtype::int32, o);
      for (std::uint64_t q = 0; q < un; ++q)
        for (std::uint64_t i = 0; i < count; ++i)
          bad += out[q * count + i] != v(static_cast<int>(q), static_cast<std::uint64_t>(r) * count + i);
      break;
    }
    case collective_kind::barrier: barrier(comm, o); break;
    default: break;
  }
  return bad;
}

/// The algorithm the collective layer resolves for an `auto` call of `k` with `count` int32
/// elements on `comm` (the descriptor every rank publishes).
algorithm resolved(const communicator& comm, collective_kind k, std::uint64_t count) {
  // describe() only computes with the addresses: two distant fake ones, never dereferenced
  const void* send = reinterpret_cast<const void*>(std::uintptr_t{1} << 20);
  void* recv = reinterpret_cast<void*>(std::uintptr_t{1} << 46);
  const bool rooted = k == collective_kind::broadcast || k == collective_kind::reduce;
  auto q =
      detail::make_request(k, send, recv, count, dtype::int32, reduce_kind::sum, rooted ? 0 : -1, collective_options{});
  if (k == collective_kind::barrier) {
    q.send = q.recv = nullptr;
    q.count = 0;
    q.type = dtype::uint8;
  }
  return detail::describe(comm, q).algo;
}

/// S of the cost model for `k` with `count` int32 elements per rank (collective/selection.hpp).
double model_bytes(collective_kind k, std::uint64_t count, int n) {
  const bool whole =
      k == collective_kind::reduce_scatter || k == collective_kind::all_gather || k == collective_kind::all_to_all;
  return static_cast<double>(count) * 4.0 * (whole ? n : 1);
}

}  // namespace

TEST_CASE("RINGZERO_ALGO forces the algorithm of every auto call that can use it") {
  struct forcing {
    const char* value;
    algorithm algo;
  };
  for (const forcing& f : {forcing{"ring", algorithm::ring}, forcing{"direct", algorithm::direct},
                           forcing{"halving_doubling", algorithm::halving_doubling},
                           forcing{"hd", algorithm::halving_doubling}, forcing{"rhd", algorithm::halving_doubling}})
    for (int world : {3, 4}) {
      INFO("RINGZERO_ALGO=" << f.value << " world " << world);
      rzt::scoped_env env("RINGZERO_ALGO", f.value);
      std::vector<std::uint64_t> wrong(static_cast<std::size_t>(world), 0);
      std::vector<int> forced_seen(static_cast<std::size_t>(world), 0), resolved_ok(static_cast<std::size_t>(world), 0);
      std::vector<outcome> mismatch(static_cast<std::size_t>(world));
      const std::string error = rzt::launch_world(world, [&](communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        forced_seen[r] = comm.forced_algorithm() == f.algo;
        int ok = 1;
        for (collective_kind k : all_collectives) {
          const bool offered = algorithm_implements(f.algo, k);
          for (std::uint64_t count : {1u, 1000u, 70000u}) {
            const algorithm expect = offered ? f.algo : model_choice(comm, k, model_bytes(k, count, world));
            ok &= resolved(comm, k, count) == expect;
            // rank 0 names the algorithm, the others ask for auto: they agree only if auto -> expect
            wrong[r] += run_and_check(comm, k, count, comm.rank() == 0 ? expect : algorithm::automatic);
          }
        }
        resolved_ok[r] = ok;
        // rank 0 asks for another algorithm explicitly: an algorithm mismatch naming both
        const algorithm other = f.algo == algorithm::ring ? algorithm::direct : algorithm::ring;
        mismatch[r].capture([&] {
          run_and_check(comm, collective_kind::all_reduce, 16, comm.rank() == 0 ? other : algorithm::automatic);
        });
      });
      REQUIRE_MESSAGE(error.empty(), error);
      for (int r = 0; r < world; ++r) {
        CHECK(forced_seen[static_cast<std::size_t>(r)] == 1);
        CHECK(resolved_ok[static_cast<std::size_t>(r)] == 1);
        CHECK_MESSAGE(wrong[static_cast<std::size_t>(r)] == 0, "rank " << r);
      }
      const std::string other_name(algorithm_name(f.algo == algorithm::ring ? algorithm::direct : algorithm::ring));
      check_every_rank(mismatch, errc::contract_mismatch,
                       {"algorithm mismatch", "rank 0: " + other_name, ": " + std::string(algorithm_name(f.algo))});
    }
}

TEST_CASE("RINGZERO_ALGO=auto, automatic, native, or unset leaves the choice to the cost model") {
  for (const char* value : {"auto", "automatic", "native", ""}) {
    INFO("RINGZERO_ALGO=\"" << value << "\"");
    rzt::scoped_env env("RINGZERO_ALGO", value);
    std::vector<int> ok(3, 0);
    std::vector<std::uint64_t> wrong(3, 0);
    const std::string error = rzt::launch_world(3, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      int good = comm.forced_algorithm() == (std::string(value) == "native" ? algorithm::native : algorithm::automatic);
      for (collective_kind k : all_collectives) {
        good &= resolved(comm, k, 1000) == model_choice(comm, k, model_bytes(k, 1000, 3));
        wrong[r] += run_and_check(comm, k, 1000, algorithm::automatic);
      }
      ok[r] = good;
    });
    REQUIRE_MESSAGE(error.empty(), error);
    for (int r = 0; r < 3; ++r) {
      CHECK(ok[static_cast<std::size_t>(r)] == 1);
      CHECK(wrong[static_cast<std::size_t>(r)] == 0);
    }
  }
}

TEST_CASE("a per-call algorithm overrides RINGZERO_ALGO; set_forced_algorithm overrides it per communicator") {
  rzt::scoped_env env("RINGZERO_ALGO", "ring");
  std::vector<std::uint64_t> wrong(4, 0);
  std::vector<int> ok(4, 0);
  std::vector<outcome> mismatch(4);
  const std::string error = rzt::launch_world(4, [&](communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    // every rank asks for direct explicitly: runs direct despite RINGZERO_ALGO=ring
    for (collective_kind k : all_collectives) wrong[r] += run_and_check(comm, k, 777, algorithm::direct);
    // explicit direct against auto (= ring): refused
    mismatch[r].capture([&] {
      run_and_check(comm, collective_kind::all_gather, 5, comm.rank() == 2 ? algorithm::direct : algorithm::automatic);
    });
    // per communicator: halving_doubling for auto calls from now on
    comm.set_forced_algorithm(algorithm::halving_doubling);
    int good = comm.forced_algorithm() == algorithm::halving_doubling;
    good &= resolved(comm, collective_kind::all_reduce, 100) == algorithm::halving_doubling;
    good &= resolved(comm, collective_kind::all_to_all, 100) != algorithm::halving_doubling;
    for (collective_kind k : all_collectives)
      wrong[r] += run_and_check(
          comm, k, 100,
          comm.rank() == 1 && k != collective_kind::all_to_all ? algorithm::halving_doubling : algorithm::automatic);
    comm.set_forced_algorithm(algorithm::automatic);
    good &= resolved(comm, collective_kind::all_reduce, 100) == model_choice(comm, collective_kind::all_reduce, 400.0);
    ok[r] = good;
  });
  REQUIRE_MESSAGE(error.empty(), error);
  for (int r = 0; r < 4; ++r) {
    CHECK(wrong[static_cast<std::size_t>(r)] == 0);
    CHECK(ok[static_cast<std::size_t>(r)] == 1);
  }
  check_every_rank(mismatch, errc::contract_mismatch, {"all_gather", "algorithm mismatch", "rank 2: direct", "ring"});
}

TEST_CASE("the default choice is the cost model's cheapest available algorithm, for every collective and size") {
  for (int world : {2, 3, 4, 5, 8}) {
    local::world w(world);
    local::communicator comm(w, 0);  // a communicator is enough: no collective runs here
    for (collective_kind k : all_collectives)
      for (std::uint64_t count : {1ull, 16ull, 256ull, 4096ull, 65536ull, 1ull << 20, 1ull << 24, 1ull << 28}) {
        INFO("world " << world << " " << collective_name(k) << " count " << count);
        const double bytes = model_bytes(k, count, world);
        const algorithm choice = model_choice(comm, k, bytes);
        CHECK(algorithm_available(comm, choice, k));
        CHECK(resolved(comm, k, count) == choice);
        const double cost = estimate_us(k, choice, world, bytes, comm.link());
        CHECK(std::isfinite(cost));
        for (algorithm other : {algorithm::ring, algorithm::direct, algorithm::halving_doubling})
          if (algorithm_available(comm, other, k)) CHECK(cost <= estimate_us(k, other, world, bytes, comm.link()));
      }
  }
}

TEST_CASE("the default choice gives exact results for every collective across sizes and worlds") {
  // Counts around the places where the cost model changes its mind, on small and odd worlds.
  for (int world : {2, 3, 5, 8}) {
    INFO("world " << world);
    std::vector<std::uint64_t> wrong(static_cast<std::size_t>(world), 0);
    std::vector<std::set<int>> chosen(static_cast<std::size_t>(world));
    const std::string error = rzt::launch_world(world, [&](communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      for (collective_kind k : all_collectives)
        for (std::uint64_t count : {0ull, 1ull, 13ull, 1000ull, 40000ull, 300001ull}) {
          if (world == 8 && count > 40000 && k != collective_kind::all_reduce) continue;  // keep it small
          chosen[r].insert(static_cast<int>(resolved(comm, k, count)));
          wrong[r] += run_and_check(comm, k, count, algorithm::automatic);
        }
    });
    REQUIRE_MESSAGE(error.empty(), error);
    for (int r = 0; r < world; ++r) {
      CHECK_MESSAGE(wrong[static_cast<std::size_t>(r)] == 0, "rank " << r);
      CHECK(chosen[static_cast<std::size_t>(r)] == chosen[0]);  // every rank resolves alike
      CHECK(chosen[static_cast<std::size_t>(r)].count(static_cast<int>(algorithm::automatic)) == 0);
    }
  }
}

TEST_CASE("local backend: auto picks direct but for 2-rank reduce_scatter from 30000 B, as ringzero-bench measured") {
  // Every collective on the local backend starts and ends with two all-rank synchronisations
  // (begin, end), whatever the algorithm, and a point-to-point schedule moves at least as many
  // bytes as direct: a received byte is read from the peer and written locally (beta = 2 mu),
  // and all_gather / all_to_all first copy the own block, broadcast's root its whole input.
  // The model counted the synchronisations for direct alone and left the copies out, so it
  // picked ring or halving_doubling where forcing direct was 1.1-6.5x faster (docs/performance.md).
  // The one exception: on 2 ranks ring's reduce_scatter combines straight into the output with
  // the same memory traffic, while direct's goes through an L1 tile (2 S/n at cache_us_per_byte).
  for (int world : {2, 3, 4, 5, 8}) {
    local::world w(world);
    local::communicator comm(w, 0);
    const link_model m = comm.link();
    for (collective_kind k : all_collectives)
      for (std::uint64_t count : {1ull, 16ull, 256ull, 4096ull, 65536ull, 1ull << 20, 1ull << 24, 1ull << 28}) {
        INFO("world " << world << " " << collective_name(k) << " count " << count);
        const double bytes = model_bytes(k, count, world);
        const algorithm expect =
            world == 2 && k == collective_kind::reduce_scatter && bytes >= 30000 ? algorithm::ring : algorithm::direct;
        CHECK(model_choice(comm, k, bytes) == expect);
        CHECK(resolved(comm, k, count) == expect);
      }
    if (world == 2) {  // direct - ring = 2 S/2 c - alpha: the crossover is alpha / c = 30000 B
      CHECK(model_choice(comm, collective_kind::reduce_scatter, 29000.0) == algorithm::direct);
      CHECK(model_choice(comm, collective_kind::reduce_scatter, 31000.0) == algorithm::ring);
    }
    // all_gather: ring moves the same 2 S of memory traffic as direct (own block 2 S/n, n-1
    // receives of S/n at 2 mu) and adds n-1 steps
    const double S = 1 << 20;
    CHECK(estimate_us(collective_kind::all_gather, algorithm::ring, world, S, m) -
              estimate_us(collective_kind::all_gather, algorithm::direct, world, S, m) ==
          doctest::Approx((world - 1) * m.alpha_us));
  }
}

TEST_CASE("the rendezvous (2 sigma) is part of every algorithm's estimate") {
  // The same 2 sigma for every algorithm changes no choice between ring and halving_doubling
  // (the MPI and NCCL backends choose between those two): raising sync_us from 0 to 5 adds
  // exactly 10 us to each estimate, for every collective, size and world.
  link_model quiet;
  quiet.alpha_us = 2.0;
  quiet.beta_us_per_byte = 1.5e-4;
  quiet.gamma_us_per_byte = 1e-4;
  quiet.memory_us_per_byte = 1.5e-4;
  link_model synced = quiet;
  synced.sync_us = 5.0;
  for (int world : {2, 3, 4, 6, 8, 13})
    for (collective_kind k : all_collectives)
      for (double bytes = 8; bytes <= double(1ull << 30); bytes *= 4) {
        INFO("world " << world << " " << collective_name(k) << " bytes " << bytes);
        const double ring_quiet = estimate_us(k, algorithm::ring, world, bytes, quiet);
        const double ring_synced = estimate_us(k, algorithm::ring, world, bytes, synced);
        CHECK(ring_synced - ring_quiet == doctest::Approx(10.0));
        CHECK(estimate_us(k, algorithm::direct, world, bytes, synced) -
                  estimate_us(k, algorithm::direct, world, bytes, quiet) ==
              doctest::Approx(10.0));
        if (!algorithm_implements(algorithm::halving_doubling, k)) continue;
        CHECK(estimate_us(k, algorithm::halving_doubling, world, bytes, synced) -
                  estimate_us(k, algorithm::halving_doubling, world, bytes, quiet) ==
              doctest::Approx(10.0));
      }
}

TEST_CASE("algorithm descriptors: one per algorithm, each collective at most once, every entry runnable") {
  const algorithm every[] = {algorithm::ring, algorithm::direct, algorithm::halving_doubling, algorithm::native};
  CHECK(std::size(algorithms::algorithm_table) == std::size(every));
  for (algorithm a : every) {
    INFO(algorithm_name(a));
    const algorithms::algorithm_descriptor* d = algorithms::find_algorithm(a);
    REQUIRE(d != nullptr);
    CHECK(d->id == a);
    CHECK(!d->requires_backend.empty());
    for (int i = 0; i < collective_kind_count; ++i) {
      const auto k = static_cast<collective_kind>(i);
      int entries = 0;
      for (const algorithms::collective_entry& e : d->collectives) entries += e.kind == k;
      CHECK(entries <= 1);
      const algorithms::collective_entry* e = d->find(k);
      CHECK(algorithm_implements(a, k) == (e != nullptr));
      if (e == nullptr) continue;
      CHECK(static_cast<bool>(e->run));
      // a formula for every algorithm but the backend's own collective
      CHECK(static_cast<bool>(e->cost_us) != d->backend_moves_data);
    }
  }
  CHECK(algorithms::find_algorithm(algorithm::automatic) == nullptr);
  CHECK(estimate_us(collective_kind::send, algorithm::direct, 4, 1000.0, link_model{}) == INFINITY);
  CHECK(estimate_us(collective_kind::all_to_all, algorithm::halving_doubling, 4, 1000.0, link_model{}) == INFINITY);
}

TEST_CASE("dispatch raises errc::internal naming the collective and algorithm that no descriptor runs") {
  // ring's descriptor alone: a test-only table without direct and halving_doubling
  const algorithms::algorithm_descriptor ring_only[] = {algorithms::ring_descriptor};
  struct unhandled {
    collective_kind kind;
    algorithm algo;
    bool ring_only_table;
  };
  for (const unhandled& u : {unhandled{collective_kind::all_to_all, algorithm::halving_doubling, false},
                             unhandled{collective_kind::send, algorithm::ring, false},
                             unhandled{collective_kind::all_reduce, algorithm::automatic, false},
                             unhandled{collective_kind::all_reduce, algorithm::direct, true},
                             unhandled{collective_kind::barrier, algorithm::halving_doubling, true}}) {
    INFO(collective_name(u.kind) << " with " << algorithm_name(u.algo) << (u.ring_only_table ? " (ring only)" : ""));
    for (int world : {2, 3}) {
      std::vector<outcome> o(static_cast<std::size_t>(world));
      const std::string error = rzt::launch_world(world, [&](communicator& comm) {
        collective_descriptor d;
        d.kind = u.kind;
        d.algo = u.algo;
        d.type = dtype::int32;
        d.count = 1;
        // every rank has its own buffers: the call must fail before touching any
        std::vector<std::int32_t> mine_in(1, comm.rank()), mine_out(1, -1);
        d.send = mine_in.data();
        d.recv = mine_out.data();
        const algorithms::call call{detail::transport_of(comm), d, d, algorithms::host_ops()};
        o[static_cast<std::size_t>(comm.rank())].capture([&] {
          if (u.ring_only_table)
            detail::run_algorithm(call, ring_only);
          else
            detail::run_algorithm(call);
        });
        if (mine_out[0] != -1) o[static_cast<std::size_t>(comm.rank())].message += " (output written)";
      });
      REQUIRE_MESSAGE(error.empty(), error);
      check_every_rank(o, errc::internal,
                       {"no algorithm descriptor runs " + std::string(collective_name(u.kind)) + " with " +
                        std::string(algorithm_name(u.algo))});
      for (const outcome& x : o) CHECK(!rzt::contains(x.message, "(output written)"));
    }
  }
}

TEST_CASE("tuning_table: rules by collective, world size and size; text round trip; fingerprint; bad lines") {
  tuning_table t = tuning_table::parse(
      "# measured\n"
      "all_reduce 2 0 ring\n"
      "all_reduce 2 4194304 native   # from 4 MiB\n"
      "\n"
      "all_reduce 2 33554432 halving_doubling\n"
      "all_gather 4 1024 hd\n",
      "t.txt");
  REQUIRE(t.rules().size() == 4);
  CHECK(t.choice(collective_kind::all_reduce, 2, 0) == algorithm::ring);
  CHECK(t.choice(collective_kind::all_reduce, 2, 4194303) == algorithm::ring);
  CHECK(t.choice(collective_kind::all_reduce, 2, 4194304) == algorithm::native);
  CHECK(t.choice(collective_kind::all_reduce, 2, 33554431) == algorithm::native);
  CHECK(t.choice(collective_kind::all_reduce, 2, 1e12) == algorithm::halving_doubling);
  CHECK_FALSE(t.choice(collective_kind::all_reduce, 3, 4194304));      // another world size: the model's
  CHECK_FALSE(t.choice(collective_kind::reduce_scatter, 2, 4194304));  // another collective
  CHECK_FALSE(t.choice(collective_kind::all_gather, 4, 1023));         // below the first rule
  CHECK(t.choice(collective_kind::all_gather, 4, 1024) == algorithm::halving_doubling);
  const tuning_table back = tuning_table::parse(t.text(), "text()");
  CHECK(back.rules() == t.rules());
  CHECK(back.fingerprint() == t.fingerprint());
  CHECK(t.fingerprint() != 0);
  CHECK(tuning_table{}.fingerprint() == 0);
  tuning_table other = t;
  other.add({collective_kind::all_reduce, 2, 4194304, algorithm::ring});  // replaces the rule at 4 MiB
  CHECK(other.rules().size() == 4);
  CHECK(other.choice(collective_kind::all_reduce, 2, 5e6) == algorithm::ring);
  CHECK(other.fingerprint() != t.fingerprint());
  const auto refusal = [](const std::string& text) {
    try {
      (void)tuning_table::parse(text, "bad.txt");
    } catch (const error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  CHECK(rzt::contains(refusal("all_reduce 2 0 ring\nall_reducer 2 0 ring\n"),
                      "tuning table bad.txt, line 2: unknown collective 'all_reducer'"));
  CHECK(rzt::contains(refusal("all_reduce 2 0 fast\n"), "line 1: unknown algorithm 'fast'"));
  CHECK(rzt::contains(refusal("all_reduce 2 0 auto\n"), "line 1: a tuning rule must name an algorithm, not auto"));
  CHECK(rzt::contains(refusal("all_reduce 0 0 ring\n"), "line 1: a tuning rule's world size must be at least 1"));
  CHECK(rzt::contains(refusal("all_reduce 2 -1 ring\n"), "line 1: byte count '-1' is not a whole number"));
  CHECK(rzt::contains(refusal("all_reduce 2 18446744073709551616 ring\n"),
                      "byte count '18446744073709551616' is out of range"));
  CHECK(rzt::contains(refusal("all_reduce 16777217 0 ring\n"), "world size '16777217' is out of range"));
  CHECK(rzt::contains(refusal("all_reduce 2 0\n"),
                      "line 1: 3 field(s) (expected COLLECTIVE WORLD_SIZE MIN_BYTES ALGORITHM"));
  CHECK(rzt::contains(refusal("barrier 2 0 ring\n"), "covers a collective with a size, not barrier"));
  CHECK(rzt::contains(refusal("send 2 0 ring\n"), "not send"));
  CHECK(rzt::contains(refusal("all_to_all 2 0 ring\nall_to_all 4 0 hd\n"),
                      "line 2: a tuning rule names halving_doubling for all_to_all, which halving_doubling does "
                      "not implement"));
  CHECK(tuning_table::parse("all_to_all 4 0 native\nall_gather 4 0 halving_doubling\n", "ok").rules().size() == 2);
  CHECK(rzt::contains(refusal("all_reduce 2 0 ring\nall_reduce 2 0 native\n"),
                      "line 2: it repeats the collective, world size and size of an earlier line"));
  const std::string long_name(1000, 'x');
  const std::string quoted = refusal("all_reduce 2 0 " + long_name + "\n");
  CHECK(rzt::contains(quoted, "unknown algorithm '" + std::string(40, 'x') + "...'"));
  CHECK(quoted.size() < 400);
  // A UTF-8 byte order mark, leading zeros, CRLF line ends and tabs are read as text editors write them.
  const tuning_table bom = tuning_table::parse(
      "\xEF\xBB\xBF"
      "all_reduce\t2\t000000000000000000004096\tring\r\n",
      "bom.txt");
  REQUIRE(bom.rules().size() == 1);
  CHECK(bom.rules()[0].min_bytes == 4096);
  // Two tables with the same 32-bit fingerprint (FNV-1a collides): the MPI communicator
  // compares the rules themselves too (tests/backend/mpi).
  CHECK(tuning_table::parse("all_reduce 2 762179584 ring", "a").fingerprint() ==
        tuning_table::parse("all_reduce 2 50552840 native", "b").fingerprint());
  try {
    (void)tuning_table::read("/nonexistent/tuning.txt");
    FAIL("read a file that does not exist");
  } catch (const error& e) { CHECK(rzt::contains(e.what(), "cannot read the tuning table /nonexistent/tuning.txt")); }
  for (const char* not_a_file : {"/tmp", "/dev/zero"}) {  // refused before opening: nothing blocks or fills memory
    CAPTURE(not_a_file);
    try {
      (void)tuning_table::read(not_a_file);
      FAIL("read a path that is not a regular file");
    } catch (const error& e) {
      CHECK(rzt::contains(e.what(), std::string("the tuning table ") + not_a_file + " is not a regular file"));
    }
  }
}
