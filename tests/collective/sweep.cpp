// The collective sweep (see sweep.hpp): input patterns, expected values, and one rank function
// per collective. Compiled once into a static library shared by the sweep executables.
#include "sweep.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference.hpp"
#include "ringzero/ringzero.hpp"

namespace rzt {

namespace {

using namespace ringzero;

/// Elements per input pattern: a prime, so that no block offset of the algorithms' partitions
/// (multiples of a cache line's worth of elements) maps a pattern onto itself.
constexpr std::size_t period = 4093;
/// The sweep's large count: prime, beyond every tile, slice and streaming threshold.
constexpr std::uint64_t large_count = 1000003;
/// Fill byte of receive buffers, to see what a collective wrote and what it left alone.
constexpr std::uint8_t sentinel = 0xa5;

constexpr reduce_kind all_kinds[] = {reduce_kind::sum, reduce_kind::prod, reduce_kind::min,
                                     reduce_kind::max, reduce_kind::avg,  reduce_kind::premul_sum};

/// True for the collectives whose buffers hold world_size blocks of `count` elements.
bool whole_buffer(collective_kind kind) {
  return kind == collective_kind::reduce_scatter || kind == collective_kind::all_gather ||
         kind == collective_kind::all_to_all;
}

/// Whether a 1000003-element call of (kind, world, dtype, use) runs.
///
/// Full mode: every one for all_reduce, reduce and broadcast. reduce_scatter, all_gather and
/// all_to_all move world_size * 1000003 elements per rank (their cost grows with world^2), so
/// at worlds 1-4 they run every dtype and op, and at worlds 5-8 and 13 a rotating selection:
/// every dtype once with an op that changes with the world (reductions), a third of the dtypes
/// (data movement); at world 13 only 1- and 2-byte dtypes (13 ranks x 13 blocks x 1000003
/// elements of 8 bytes would need 2.7 GB for all_to_all).
///
/// Quick mode (sanitizer builds, where instrumented loops over millions of elements dominate):
/// the large count only on worlds 3 and 4 (2 and 3 for the whole-buffer collectives), a
/// non-power of two and a power of two, for one dtype of each element size with a different op
/// each: float32 sum, float64 premul_sum, bfloat16 avg, int8 max, and float32 and int8 for data
/// movement. Everything else at the large count is dropped; the small counts still cover every
/// world, dtype, op, placement, root and algorithm, the large ones the tiling, slicing and
/// streaming paths.
bool run_large([[maybe_unused]] collective_kind kind, [[maybe_unused]] int world, [[maybe_unused]] dtype t,
               [[maybe_unused]] use u) {
#if defined(RINGZERO_TEST_SWEEP_QUICK)
  if (whole_buffer(kind) ? world != 2 && world != 3 : world != 3 && world != 4) return false;
  switch (u) {
    case use::sum: return t == dtype::float32;
    case use::premul_sum: return t == dtype::float64;
    case use::avg: return t == dtype::bfloat16;
    case use::max: return t == dtype::int8;
    case use::copy: return t == dtype::float32 || t == dtype::int8;
    default: return false;
  }
#else
  if (!whole_buffer(kind) || world <= 4) return true;
  if (world > 8 && dtype_size(t) > 2) return false;
  const int ti = static_cast<int>(t), ui = static_cast<int>(u);
  if (u == use::copy) return (ti + world) % 3 == 0;
  return (ti + ui + world) % 6 == 0;
#endif
}

/// Whether a 1000003-element call that `run_large` keeps runs in this placement. Full mode:
/// all_reduce, reduce and broadcast run both placements on worlds 1-4 and one per (dtype, use),
/// alternating, on worlds 5-8 and 13, so that every dtype and op still runs at the large count
/// on every world and both placements are covered there too (this halves the largest part of
/// the full sweep); the whole-buffer collectives, already thinned by `run_large`, run both.
/// Quick mode: both placements of the few large calls it keeps.
bool run_large_placement([[maybe_unused]] collective_kind kind, [[maybe_unused]] int world, [[maybe_unused]] dtype t,
                         [[maybe_unused]] use u, [[maybe_unused]] bool in_place) {
#if defined(RINGZERO_TEST_SWEEP_QUICK)
  return true;
#else
  if (world <= 4 || whole_buffer(kind)) return true;
  return in_place == ((static_cast<int>(t) + static_cast<int>(u) + world) % 2 == 0);
#endif
}

/// The input patterns of every rank for one (dtype, use) on one world, and the expected
/// reduction; each pattern is stored twice over (2 * period elements, see reference.hpp).
struct pattern {
  dtype type = dtype::float32;
  use purpose = use::copy;
  std::vector<double> scalars;                    ///< premul_sum scalar of each rank
  std::vector<std::vector<std::uint8_t>> inputs;  ///< inputs[r]: rank r's pattern
  std::vector<std::uint8_t> expected;             ///< reduction over ranks (reductions only)
};

/// Every pattern of one world.
struct world_patterns {
  int world = 0;
  std::vector<pattern> items;  ///< index dtype * 7 + use

  const pattern& get(dtype t, use u) const {
    return items[static_cast<std::size_t>(t) * 7 + static_cast<std::size_t>(u)];
  }
};

pattern make_pattern(dtype t, use u, int world) {
  pattern p;
  p.type = t;
  p.purpose = u;
  const std::size_t es = dtype_size(t);
  p.inputs.assign(static_cast<std::size_t>(world), std::vector<std::uint8_t>(2 * period * es));
  for (int r = 0; r < world; ++r) p.scalars.push_back(premul_scalar(t, r));
  std::vector<std::uint64_t> column(static_cast<std::size_t>(world));
  if (u != use::copy) p.expected.resize(2 * period * es);
  for (std::size_t k = 0; k < period; ++k) {
    for (int r = 0; r < world; ++r) {
      const std::uint64_t bits = input_bits(t, u, r, k);
      column[static_cast<std::size_t>(r)] = bits;
      std::memcpy(p.inputs[static_cast<std::size_t>(r)].data() + k * es, &bits, es);
      std::memcpy(p.inputs[static_cast<std::size_t>(r)].data() + (k + period) * es, &bits, es);
    }
    if (u != use::copy) {
      const std::uint64_t e = expected_bits(t, static_cast<reduce_kind>(u), column.data(), world, p.scalars.data());
      std::memcpy(p.expected.data() + k * es, &e, es);
      std::memcpy(p.expected.data() + (k + period) * es, &e, es);
    }
  }
  return p;
}

/// The patterns of `world`, built once and kept until another world is asked for.
const world_patterns& patterns_for(int world) {
  static std::unique_ptr<world_patterns> cached;
  if (!cached || cached->world != world) {
    cached.reset();
    auto w = std::make_unique<world_patterns>();
    w->world = world;
    for (dtype t : all_dtypes)
      for (int u = 0; u < 7; ++u) w->items.push_back(make_pattern(t, static_cast<use>(u), world));
    cached = std::move(w);
  }
  return *cached;
}

/// The sweep's counts on `world`, ascending, without repeats.
std::vector<std::uint64_t> counts_for(int world) {
  const auto w = static_cast<std::uint64_t>(world);
  std::vector<std::uint64_t> c = {0, 1, 3, 7, w - 1, w, w + 1, large_count};
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  return c;
}

/// The roots of a rooted collective: first, middle and last rank for small counts; at the large
/// count one root per call, rotating with `call` so that successive calls use every rank.
std::vector<int> roots_for(int world, std::uint64_t count, std::uint64_t call) {
  if (count == large_count) return {static_cast<int>(call % static_cast<std::uint64_t>(world))};
  std::vector<int> r = {0, world / 2, world - 1};
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

/// Describes the call being checked, for failure messages.
struct call_site {
  collective_kind kind;
  int world;
  algorithm algo;
  int rank;
  std::uint64_t count = 0;
  dtype type = dtype::float32;
  std::string op;
  bool in_place = false;
  int root = -1;

  std::string text() const {
    std::string s = std::string(collective_name(kind)) + " world " + std::to_string(world) + " " +
                    std::string(algorithm_name(algo)) + " count " + std::to_string(count) + " " +
                    std::string(dtype_name(type));
    if (!op.empty()) s += " " + op;
    s += in_place ? " in-place" : " out-of-place";
    if (root >= 0) s += " root " + std::to_string(root);
    return s + " on rank " + std::to_string(rank);
  }
};

/// The state of one rank's sweep: its communicator, buffers, log, and checking helpers.
class rank_sweep {
 public:
  rank_sweep(communicator& comm, rank_log& log, const world_patterns& patterns, collective_kind kind, algorithm algo)
      : comm_(comm), log_(log), patterns_(patterns), site_{kind, comm.world_size(), algo, comm.rank(),
                                                           0,    dtype::float32,    {},   false,
                                                           -1} {}

  /// Runs the sweep of this rank's collective.
  void run() {
    switch (site_.kind) {
      case collective_kind::all_reduce: return all_reduce_sweep();
      case collective_kind::reduce_scatter: return reduce_scatter_sweep();
      case collective_kind::reduce: return reduce_sweep();
      case collective_kind::all_gather: return all_gather_sweep();
      case collective_kind::broadcast: return broadcast_sweep();
      case collective_kind::all_to_all: return all_to_all_sweep();
      case collective_kind::barrier: return barrier_sweep();
      default: throw std::logic_error("no sweep for this collective");
    }
  }

  /// Shared by the barrier sweep: arrivals of every rank.
  std::atomic<std::uint64_t>* arrivals = nullptr;

 private:
  int rank() const { return comm_.rank(); }
  int world() const { return comm_.world_size(); }
  std::uint64_t whole(std::uint64_t count) const { return count * static_cast<std::uint64_t>(world()); }
  collective_options options() const {
    collective_options o;
    o.algo = site_.algo;
    return o;
  }

  /// Buffers of at least `send_bytes` / `recv_bytes`, grown (and touched) only when too small:
  /// counts ascend, so each buffer grows a few times per launch.
  void reserve(std::uint64_t send_bytes, std::uint64_t recv_bytes) {
    if (send_.size() < send_bytes) send_.assign(send_bytes, 0);
    if (recv_.size() < recv_bytes) recv_.assign(recv_bytes, 0);
  }
  std::uint8_t* send_buffer(std::uint64_t bytes) { return bytes ? send_.data() : nullptr; }
  std::uint8_t* recv_buffer(std::uint64_t bytes) { return bytes ? recv_.data() : nullptr; }

  /// Issues one collective; an exception gets the call's description and ends the sweep.
  template <class F>
  void issue(F&& f) {
    ++log_.calls;
    try {
      f();
    } catch (const std::exception& e) { throw std::runtime_error(site_.text() + ": unexpected error: " + e.what()); }
  }

  /// Checks `count` elements of `data` against `pattern2` from `phase`.
  void expect_pattern(const char* what, const void* data, std::uint64_t count,
                      const std::vector<std::uint8_t>& pattern2, std::uint64_t phase) {
    const std::size_t es = dtype_size(site_.type);
    const std::uint64_t i = first_mismatch_periodic(data, count, pattern2.data(), period, es, phase);
    if (i == count) return;
    log_.fail(site_.text() + ": " + what + " element " + std::to_string(i) + " is " + element_hex(data, i, es) +
              ", expected " + element_hex(pattern2.data(), (phase + i) % period, es));
  }

  /// Checks that `bytes` bytes of `data` still hold the sentinel.
  void expect_untouched(const char* what, const void* data, std::uint64_t bytes) {
    const std::uint64_t i = first_byte_not(data, bytes, sentinel);
    if (i == bytes) return;
    log_.fail(site_.text() + ": " + what + " was written at byte " + std::to_string(i) + " (must be left untouched)");
  }

  void record_digest(const void* data, std::uint64_t bytes) { log_.digests.push_back(digest(data, bytes)); }

  void begin_case(std::uint64_t count, dtype t, const char* op, bool in_place, int root = -1) {
    site_.count = count;
    site_.type = t;
    site_.op = op;
    site_.in_place = in_place;
    site_.root = root;
  }

  reduce_op op_of(const pattern& p, reduce_kind k) const {
    return k == reduce_kind::premul_sum ? reduce_op::premul_sum(p.scalars[static_cast<std::size_t>(rank())])
                                        : reduce_op(k);
  }

  static std::string op_text(reduce_kind k) { return std::string(reduce_kind_name(k)); }

  // ---------------------------------------------------------------------------------------------

  void all_reduce_sweep() {
    for (std::uint64_t count : counts_for(world()))
      for (dtype t : all_dtypes)
        for (reduce_kind k : all_kinds) {
          if (count == large_count && !run_large(site_.kind, world(), t, use_of(k))) continue;
          const pattern& p = patterns_.get(t, use_of(k));
          const auto& mine = p.inputs[static_cast<std::size_t>(rank())];
          const std::size_t es = dtype_size(t);
          const std::uint64_t bytes = count * es;
          reserve(bytes, bytes);
          for (bool in_place : {false, true}) {
            if (count == large_count && !run_large_placement(site_.kind, world(), t, use_of(k), in_place)) continue;
            begin_case(count, t, op_text(k).c_str(), in_place);
            std::uint8_t* send = send_buffer(bytes);
            std::uint8_t* recv = in_place ? send : recv_buffer(bytes);
            fill_periodic(send, count, mine.data(), period, es, 0);
            if (!in_place && bytes) std::memset(recv, sentinel, bytes);
            issue([&] { ringzero::all_reduce(comm_, send, recv, count, t, op_of(p, k), options()); });
            expect_pattern("output", recv, count, p.expected, 0);
            if (!in_place) expect_pattern("send buffer (must be unchanged)", send, count, mine, 0);
            record_digest(recv, bytes);
          }
        }
  }

  void reduce_scatter_sweep() {
    for (std::uint64_t count : counts_for(world()))
      for (dtype t : all_dtypes)
        for (reduce_kind k : all_kinds) {
          if (count == large_count && !run_large(site_.kind, world(), t, use_of(k))) continue;
          const pattern& p = patterns_.get(t, use_of(k));
          const auto& mine = p.inputs[static_cast<std::size_t>(rank())];
          const std::size_t es = dtype_size(t);
          const std::uint64_t block = count * es, all = whole(count) * es;
          const std::uint64_t own_phase = static_cast<std::uint64_t>(rank()) * count;
          reserve(all, block);
          for (bool in_place : {false, true}) {
            if (count == large_count && !run_large_placement(site_.kind, world(), t, use_of(k), in_place)) continue;
            begin_case(count, t, op_text(k).c_str(), in_place);
            std::uint8_t* send = send_buffer(all);
            std::uint8_t* recv = in_place ? (send ? send + own_phase * es : nullptr) : recv_buffer(block);
            fill_periodic(send, whole(count), mine.data(), period, es, 0);
            if (!in_place && block) std::memset(recv, sentinel, block);
            issue([&] { ringzero::reduce_scatter(comm_, send, recv, count, t, op_of(p, k), options()); });
            expect_pattern("output", recv, count, p.expected, own_phase);
            if (!in_place) expect_pattern("send buffer (must be unchanged)", send, whole(count), mine, 0);
          }
        }
  }

  void reduce_sweep() {
    std::uint64_t large_calls = 0;
    for (std::uint64_t count : counts_for(world()))
      for (dtype t : all_dtypes)
        for (reduce_kind k : all_kinds) {
          if (count == large_count && !run_large(site_.kind, world(), t, use_of(k))) continue;
          const pattern& p = patterns_.get(t, use_of(k));
          const auto& mine = p.inputs[static_cast<std::size_t>(rank())];
          const std::size_t es = dtype_size(t);
          const std::uint64_t bytes = count * es;
          reserve(bytes, bytes);
          for (bool in_place : {false, true})
            for (int root : roots_for(world(), count, large_calls++)) {
              if (count == large_count && !run_large_placement(site_.kind, world(), t, use_of(k), in_place)) continue;
              begin_case(count, t, op_text(k).c_str(), in_place, root);
              std::uint8_t* send = send_buffer(bytes);
              std::uint8_t* recv = in_place ? send : recv_buffer(bytes);
              fill_periodic(send, count, mine.data(), period, es, 0);
              if (!in_place && bytes) std::memset(recv, sentinel, bytes);
              issue([&] { ringzero::reduce(comm_, send, recv, count, t, op_of(p, k), root, options()); });
              if (rank() == root)
                expect_pattern("root output", recv, count, p.expected, 0);
              else if (in_place)
                expect_pattern("non-root buffer (in place: must be left as it was)", recv, count, mine, 0);
              else
                expect_untouched("non-root receive buffer", recv, bytes);
              if (!in_place) expect_pattern("send buffer (must be unchanged)", send, count, mine, 0);
            }
        }
  }

  void broadcast_sweep() {
    std::uint64_t calls = 0;
    for (std::uint64_t count : counts_for(world()))
      for (dtype t : all_dtypes) {
        if (count == large_count && !run_large(site_.kind, world(), t, use::copy)) continue;
        const pattern& p = patterns_.get(t, use::copy);
        const auto& mine = p.inputs[static_cast<std::size_t>(rank())];
        const std::size_t es = dtype_size(t);
        const std::uint64_t bytes = count * es;
        reserve(bytes, bytes);
        for (bool in_place : {false, true})
          for (int root : roots_for(world(), count, calls)) {
            ++calls;
            if (count == large_count && !run_large_placement(site_.kind, world(), t, use::copy, in_place)) continue;
            begin_case(count, t, "", in_place, root);
            std::uint8_t* send = send_buffer(bytes);
            std::uint8_t* recv = in_place ? send : recv_buffer(bytes);
            // send is ignored off the root: some calls pass null there
            const bool null_send = !in_place && rank() != root && calls % 2 == 1;
            if (in_place && rank() != root) {
              if (bytes) std::memset(recv, sentinel, bytes);
            } else {
              fill_periodic(send, count, mine.data(), period, es, 0);
              if (!in_place && bytes) std::memset(recv, sentinel, bytes);
            }
            issue([&] { ringzero::broadcast(comm_, null_send ? nullptr : send, recv, count, t, root, options()); });
            expect_pattern("output", recv, count, p.inputs[static_cast<std::size_t>(root)], 0);
            if (!in_place) expect_pattern("send buffer (must be unchanged)", send, count, mine, 0);
            record_digest(recv, bytes);
          }
      }
  }

  void all_gather_sweep() {
    for (std::uint64_t count : counts_for(world()))
      for (dtype t : all_dtypes) {
        if (count == large_count && !run_large(site_.kind, world(), t, use::copy)) continue;
        const pattern& p = patterns_.get(t, use::copy);
        const auto& mine = p.inputs[static_cast<std::size_t>(rank())];
        const std::size_t es = dtype_size(t);
        const std::uint64_t block = count * es, all = whole(count) * es;
        reserve(block, all);
        for (bool in_place : {false, true}) {
          if (count == large_count && !run_large_placement(site_.kind, world(), t, use::copy, in_place)) continue;
          begin_case(count, t, "", in_place);
          std::uint8_t* recv = recv_buffer(all);
          if (all) std::memset(recv, sentinel, all);
          std::uint8_t* send =
              in_place ? (recv ? recv + static_cast<std::uint64_t>(rank()) * block : nullptr) : send_buffer(block);
          fill_periodic(send, count, mine.data(), period, es, 0);
          issue([&] { ringzero::all_gather(comm_, send, recv, count, t, options()); });
          for (int q = 0; q < world(); ++q) {
            const std::string what = "output block " + std::to_string(q);
            expect_pattern(what.c_str(), recv + static_cast<std::uint64_t>(q) * block, count,
                           p.inputs[static_cast<std::size_t>(q)], 0);
          }
          if (!in_place) expect_pattern("send buffer (must be unchanged)", send, count, mine, 0);
          record_digest(recv, all);
        }
      }
  }

  void all_to_all_sweep() {
    if (site_.algo == algorithm::halving_doubling) return not_offered_sweep();
    for (std::uint64_t count : counts_for(world()))
      for (dtype t : all_dtypes) {
        if (count == large_count && !run_large(site_.kind, world(), t, use::copy)) continue;
        const pattern& p = patterns_.get(t, use::copy);
        const auto& mine = p.inputs[static_cast<std::size_t>(rank())];
        const std::size_t es = dtype_size(t);
        const std::uint64_t block = count * es, all = whole(count) * es;
        reserve(all, all);
        begin_case(count, t, "", false);
        std::uint8_t* send = send_buffer(all);
        std::uint8_t* recv = recv_buffer(all);
        fill_periodic(send, whole(count), mine.data(), period, es, 0);
        if (all) std::memset(recv, sentinel, all);
        issue([&] { ringzero::all_to_all(comm_, send, recv, count, t, options()); });
        // block q of my output is block `rank` of rank q's input
        for (int q = 0; q < world(); ++q) {
          const std::string what = "output block " + std::to_string(q);
          expect_pattern(what.c_str(), recv + static_cast<std::uint64_t>(q) * block, count,
                         p.inputs[static_cast<std::size_t>(q)], static_cast<std::uint64_t>(rank()) * count);
        }
        expect_pattern("send buffer (must be unchanged)", send, whole(count), mine, 0);
      }
  }

  /// An algorithm the collective does not offer (halving_doubling for all_to_all): every call
  /// must fail on every rank with errc::invalid_argument naming the algorithm and collective,
  /// and the communicator must stay usable.
  void not_offered_sweep() {
    reserve(whole(8) * 8, whole(8) * 8);
    for (std::uint64_t count : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{7}})
      for (dtype t : all_dtypes) {
        begin_case(count, t, "", false);
        const std::uint64_t all = whole(count) * dtype_size(t);
        ++log_.calls;
        try {
          ringzero::all_to_all(comm_, send_buffer(all), recv_buffer(all), count, t, options());
          log_.fail(site_.text() + ": an algorithm all_to_all does not offer was accepted");
        } catch (const ringzero::error& e) {
          const std::string what = e.what();
          if (e.kind() != errc::invalid_argument)
            log_.fail(site_.text() + ": expected errc::invalid_argument, got: " + what);
          if (what.find("halving_doubling") == std::string::npos || what.find("all_to_all") == std::string::npos ||
              what.find("rank " + std::to_string(rank())) == std::string::npos)
            log_.fail(site_.text() + ": the message does not name the algorithm, collective and rank: " + what);
        }
      }
    // the communicator still works
    begin_case(1, dtype::int32, "", false);
    std::int32_t x = rank() + 1, y = 0;
    issue([&] { ringzero::all_reduce(comm_, &x, &y, 1, dtype::int32, reduce_kind::sum); });
    if (y != world() * (world() + 1) / 2) log_.fail(site_.text() + ": all_reduce after the refused calls is wrong");
  }

  void barrier_sweep() {
    begin_case(0, dtype::uint8, "", false);
    for (std::uint64_t round = 0; round < 50; ++round) {
      arrivals->fetch_add(1, std::memory_order_acq_rel);
      issue([&] { ringzero::barrier(comm_, options()); });
      const std::uint64_t seen = arrivals->load(std::memory_order_acquire);
      if (seen < (round + 1) * static_cast<std::uint64_t>(world()))
        log_.fail(site_.text() + ": left barrier " + std::to_string(round) + " after only " + std::to_string(seen) +
                  " arrivals (expected at least " + std::to_string((round + 1) * static_cast<std::uint64_t>(world())) +
                  ")");
    }
  }

  communicator& comm_;
  rank_log& log_;
  const world_patterns& patterns_;
  call_site site_;
  std::vector<std::uint8_t> send_;
  std::vector<std::uint8_t> recv_;
};

}  // namespace

std::vector<int> sweep_worlds() { return {1, 2, 3, 4, 5, 6, 7, 8, 13}; }

std::vector<algorithm> sweep_algorithms() { return {algorithm::ring, algorithm::direct, algorithm::halving_doubling}; }

sweep_result sweep(collective_kind kind, int world, algorithm algo) {
  sweep_result result;
  result.title =
      std::string(collective_name(kind)) + " world " + std::to_string(world) + " " + std::string(algorithm_name(algo));
  result.ranks.resize(static_cast<std::size_t>(world));
  const world_patterns& patterns = patterns_for(world);
  std::atomic<std::uint64_t> arrivals{0};
  const auto start = std::chrono::steady_clock::now();
  try {
    local::launch(world, [&](communicator& comm) {
      rank_sweep s(comm, result.ranks[static_cast<std::size_t>(comm.rank())], patterns, kind, algo);
      s.arrivals = &arrivals;
      s.run();
    });
  } catch (const std::exception& e) { result.launch_error = e.what(); }
  if (std::getenv("RZT_SWEEP_TIMES") != nullptr)  // for sizing the sweep: seconds per launch
    std::fprintf(stderr, "%-40s %8.2f s\n", result.title.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return result;
}

}  // namespace rzt
