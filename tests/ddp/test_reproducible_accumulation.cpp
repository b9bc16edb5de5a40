// Reproducible gradient accumulation (issue 21, part 3): in reproducible mode the gradient
// reducer averages every micro-batch's gradient as one contribution, so a global batch of 8
// fixed micro-batches gives the same bits on 1, 2, 4 and 8 ranks, whichever rank computes
// which micro-batch, with copies or bucket views, with ranks that joined and with unused
// parameters. Plain mode, given the same adversarial values, does not (so these tests can fail).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "reducer_test_util.hpp"
#include "ringzero/ddp/compression_hook.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"

using namespace ringzero;
using namespace ringzero::ddp;
using namespace ringzero::test;

namespace {

/// Per parameter, the reduced gradient's values (float values widened to double: exact).
using gradients = std::vector<std::vector<double>>;

std::uint64_t scramble(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// The gradient of micro-batch `j` (global index, 0..7) for element k of parameter i in step s.
/// Adversarial: magnitudes from 2^-60 to 2^60 and, on every third element, a term of 2^50
/// that micro-batches 0-3 add and 4-7 subtract (it cancels exactly, and float sums lose the
/// small parts differently in every order). With `exact`, small multiples of 1/8 instead,
/// whose sums are exact in any order.
double micro_gradient(int j, std::size_t i, std::size_t k, int s, bool exact) {
  const std::uint64_t h =
      scramble(scramble(scramble(static_cast<std::uint64_t>(j) * 131 + i) ^ k) + static_cast<std::uint64_t>(s));
  if (exact) return static_cast<double>(static_cast<int>(h % 41) - 20) / 8.0;
  const int e = static_cast<int>((h >> 8) % 121) - 60;
  const double mantissa = 1.0 + static_cast<double>((h >> 16) % (1u << 20)) / static_cast<double>(1u << 20);
  double v = std::ldexp(mantissa, e) * (((h >> 40) & 1) ? -1.0 : 1.0);
  if (k % 3 == 0) {
    const std::uint64_t g = scramble(i * 7919 + k + static_cast<std::uint64_t>(s) * 104729);
    const double big = std::ldexp(1.0 + static_cast<double>(g % 1024) / 1024.0, 50);
    v += j < 4 ? big : -big;
  }
  return v;
}

struct config {
  bool reproducible = true;
  bool view = false;
  bool exact = false;
  bool join = false;
  bool find_unused = false;
  /// How an unused parameter (parameter 1 in micro-batches with even j) is reported:
  /// 0: it is used like the others; 1: mark_unused; 2: not marked (find_unused_parameters);
  /// 3: the trainer writes zeros and marks it ready.
  int unused_mode = 0;
  /// reducer_options::reproducible_stage_bytes of rank r: stage_bytes + r * stage_bytes_step.
  std::uint64_t stage_bytes = reducer_options{}.reproducible_stage_bytes;
  std::uint64_t stage_bytes_step = 0;
};

const std::vector<std::uint64_t> counts = {37, 300, 5, 64};
const std::vector<dtype> types = {dtype::float32, dtype::float32, dtype::float32, dtype::float64};

/// Runs the steps of `plan` (plan[s][r]: the global micro-batch indices rank r computes in step
/// s; a rank with none has run out of data and joins) and returns, per step, the reduced
/// gradients of the first rank that took part, after checking that every such rank holds the
/// same bits.
std::vector<gradients> run(const std::vector<std::vector<std::vector<int>>>& plan, const config& c) {
  const int n = static_cast<int>(plan.front().size());
  const std::size_t steps = plan.size();
  std::vector<std::vector<gradients>> seen(static_cast<std::size_t>(n), std::vector<gradients>(steps));
  auto out = run_ranks(n, [&](communicator& comm) {
    const int r = comm.rank();
    toy_model m(counts, types);
    reducer_options opt;
    opt.reproducible = c.reproducible;
    opt.gradient_as_bucket_view = c.view;
    opt.bucket_byte_limits = {256};  // several buckets
    opt.join = c.join;
    opt.find_unused_parameters = c.find_unused;
    opt.reproducible_stage_bytes = c.stage_bytes + static_cast<std::uint64_t>(r) * c.stage_bytes_step;
    gradient_reducer red(comm, m.parameters(), opt);
    for (std::size_t s = 0; s < steps; ++s) {
      const std::vector<int>& mine = plan[s][static_cast<std::size_t>(r)];
      if (mine.empty()) break;
      const std::size_t accum = mine.size();
      for (std::size_t micro = 0; micro < accum; ++micro) {
        const int j = mine[micro];
        red.set_require_gradient_sync(micro + 1 == accum);
        for (std::size_t i = m.size(); i-- > 0;) {
          const bool unused = c.unused_mode != 0 && i == 1 && j % 2 == 0;
          if (unused && c.unused_mode == 1) {
            red.mark_unused(i);
            continue;
          }
          if (unused && c.unused_mode == 2) continue;
          void* g = red.gradient(i);
          for (std::size_t k = 0; k < m.count(i); ++k) {
            double v = unused ? 0.0 : micro_gradient(j, i, k, static_cast<int>(s), c.exact);
            if (!c.reproducible) {  // plain mode: accumulate v / accum (exact: accum is a power of two)
              v /= static_cast<double>(accum);
              if (micro > 0) v += toy_model::read(g, m.types[i], k);
            }
            toy_model::write(g, m.types[i], k, v);
          }
          red.mark_ready(i);
        }
        red.finish();
      }
      gradients got(m.size());
      for (std::size_t i = 0; i < m.size(); ++i)
        for (std::size_t k = 0; k < m.count(i); ++k) got[i].push_back(toy_model::read(red.gradient(i), m.types[i], k));
      seen[static_cast<std::size_t>(r)][s] = std::move(got);
    }
    if (c.join) red.join();
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << out[static_cast<std::size_t>(r)].what);
    REQUIRE_FALSE(out[static_cast<std::size_t>(r)].failed);
  }
  std::vector<gradients> result(steps);
  for (std::size_t s = 0; s < steps; ++s) {
    int first = -1;
    for (int r = 0; r < n; ++r) {
      if (plan[s][static_cast<std::size_t>(r)].empty()) continue;
      if (first < 0) {
        first = r;
        result[s] = seen[static_cast<std::size_t>(r)][s];
        continue;
      }
      INFO("step " << s << ", rank " << r << " against rank " << first);
      CHECK(seen[static_cast<std::size_t>(r)][s] == result[s]);
    }
  }
  return result;
}

/// Two steps of the global batch 0..7 on n ranks: micro-batch j on rank j mod n.
std::vector<std::vector<std::vector<int>>> round_robin(int n, int steps = 2) {
  std::vector<std::vector<int>> step(static_cast<std::size_t>(n));
  for (int j = 0; j < 8; ++j) step[static_cast<std::size_t>(j % n)].push_back(j);
  return std::vector<std::vector<std::vector<int>>>(static_cast<std::size_t>(steps), step);
}

/// True when a and b hold the same bits (NaN payloads aside; no NaN occurs here).
bool same_bits(const std::vector<gradients>& a, const std::vector<gradients>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t s = 0; s < a.size(); ++s) {
    if (a[s].size() != b[s].size()) return false;
    for (std::size_t i = 0; i < a[s].size(); ++i) {
      if (a[s][i].size() != b[s][i].size()) return false;
      for (std::size_t k = 0; k < a[s][i].size(); ++k)
        if (std::bit_cast<std::uint64_t>(a[s][i][k]) != std::bit_cast<std::uint64_t>(b[s][i][k])) return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("reproducible: a global batch of 8 micro-batches gives the same bits on 1, 2, 4 and 8 ranks") {
  // On 8 ranks every rank holds one micro-batch: the buckets are reduced without accumulators,
  // and must give the accumulators' bits.
  for (bool view : {false, true}) {
    config c;
    c.view = view;
    const auto one = run(round_robin(1), c);
    for (int n : {2, 4, 8}) {
      INFO("view " << view << ", " << n << " ranks");
      CHECK(same_bits(run(round_robin(n), c), one));
    }
    // Contiguous blocks instead of round robin: the same multiset, the same bits.
    std::vector<std::vector<int>> blocks = {{0, 1, 2, 3}, {4, 5, 6, 7}};
    CHECK(same_bits(run({blocks, blocks}, c), one));
    // The cancelling 2^50 terms are gone and the small parts survive (finite, not all zero).
    bool nonzero = false;
    for (const auto& g : one[0])
      for (double x : g) {
        CHECK(std::isfinite(x));
        nonzero = nonzero || x != 0;
      }
    CHECK(nonzero);
  }
  config copy, view;
  view.view = true;
  CHECK(same_bits(run(round_robin(4), copy), run(round_robin(4), view)));
}

TEST_CASE("reproducible: micro-batches staged as copies or deposited give the same bits, whatever each rank stages") {
  // The buckets hold about 2 KiB in all: 0 deposits every micro-batch, 5000 bytes stage two per
  // step, the default stages up to 16; ranks may differ (the option is local).
  config deposit;
  deposit.stage_bytes = 0;
  const auto one = run(round_robin(1), deposit);
  for (std::uint64_t bytes : {std::uint64_t{0}, std::uint64_t{5000}, reducer_options{}.reproducible_stage_bytes})
    for (std::uint64_t step : {std::uint64_t{0}, std::uint64_t{2500}})
      for (bool view : {false, true})
        for (int n : {1, 2, 4}) {
          INFO("stage bytes " << bytes << " + rank * " << step << ", view " << view << ", " << n << " ranks");
          config c;
          c.view = view;
          c.stage_bytes = bytes;
          c.stage_bytes_step = step;
          CHECK(same_bits(run(round_robin(n, 3), c), run(round_robin(1, 3), deposit)));
          if (n == 1) CHECK(same_bits(run(round_robin(n), c), one));
        }
}

TEST_CASE("plain mode gives different bits on different world sizes for the same adversarial micro-batches") {
  config c;
  c.reproducible = false;
  const auto one = run(round_robin(1), c);
  int differing = 0;
  for (int n : {2, 4, 8}) differing += same_bits(run(round_robin(n), c), one) ? 0 : 1;
  CHECK(differing > 0);  // the reproducible test above would fail without reproducible mode
}

TEST_CASE("reproducible: inputs whose sums are exact give the exact average, rounded once") {
  config c;
  c.exact = true;
  const auto one = run(round_robin(1), c);
  for (int n : {2, 8}) CHECK(same_bits(run(round_robin(n), c), one));
  for (std::size_t s = 0; s < one.size(); ++s)
    for (std::size_t i = 0; i < counts.size(); ++i)
      for (std::size_t k = 0; k < counts[i]; ++k) {
        double sum = 0;
        for (int j = 0; j < 8; ++j) sum += micro_gradient(j, i, k, static_cast<int>(s), true);
        const double expect = types[i] == dtype::float64 ? sum / 8 : static_cast<double>(static_cast<float>(sum / 8));
        REQUIRE(one[s][i][k] == expect);
      }
}

TEST_CASE("reproducible with join: a rank that ran out of data contributes nothing; the average is over what exists") {
  for (bool view : {false, true}) {
    config c;
    c.join = true;
    c.view = view;
    // Step 0: every rank of 4 computes 2 micro-batches; step 1: rank 3 has joined.
    std::vector<std::vector<std::vector<int>>> four = {{{0, 4}, {1, 5}, {2, 6}, {3, 7}}, {{0, 4}, {1, 5}, {2, 6}, {}}};
    std::vector<std::vector<std::vector<int>>> alone = {{{0, 1, 2, 3, 4, 5, 6, 7}}, {{0, 1, 2, 4, 5, 6}}};
    std::vector<std::vector<std::vector<int>>> three = {{{0, 1, 2}, {3, 4, 5}, {6, 7}}, {{0, 4}, {1, 5}, {2, 6}}};
    const auto a = run(four, c);
    CHECK(same_bits(a, run(alone, c)));
    CHECK(same_bits(a, run(three, c)));
    // One micro-batch per rank (the reducer then reduces the buckets themselves, without the
    // accumulators) and, in the second step, a rank that joined (the accumulators again).
    std::vector<std::vector<std::vector<int>>> one_each = {{{0}, {1}, {2}, {3}}, {{0}, {1}, {2}, {}}};
    std::vector<std::vector<std::vector<int>>> one_alone = {{{0, 1, 2, 3}}, {{0, 1, 2}}};
    CHECK(same_bits(run(one_each, c), run(one_alone, c)));
  }
}

TEST_CASE("reproducible with unused parameters: an unused parameter contributes zeros for its micro-batch") {
  for (bool view : {false, true}) {
    config written;  // the trainer writes zeros and marks the parameter ready
    written.view = view;
    written.unused_mode = 3;
    const auto expect = run(round_robin(1), written);
    config marked = written;  // mark_unused
    marked.unused_mode = 1;
    config skipped = written;  // not marked at all: find_unused_parameters
    skipped.unused_mode = 2;
    skipped.find_unused = true;
    for (int n : {1, 2, 4}) {
      INFO("view " << view << ", " << n << " ranks");
      CHECK(same_bits(run(round_robin(n), written), expect));
      CHECK(same_bits(run(round_robin(n), marked), expect));
      CHECK(same_bits(run(round_robin(n), skipped), expect));
    }
    config used;  // and the unused zeros do count: the result differs from using it everywhere
    used.view = view;
    CHECK_FALSE(same_bits(run(round_robin(2), used), expect));
  }
}

TEST_CASE("reproducible mode refuses what it cannot make reproducible, on every rank") {
  auto refused = [](const std::function<reducer_options(int)>& options,
                    std::vector<reducer_parameter> (*params)(toy_model&), errc kind,
                    const std::vector<std::string>& words) {
    auto out = run_ranks(2, [&](communicator& comm) {
      toy_model m({8, 3}, {});
      gradient_reducer red(comm, params(m), options(comm.rank()));
    });
    for (const auto& o : out) {
      INFO(o.what);
      CHECK(o.failed);
      CHECK(o.kind == kind);
      for (const auto& w : words) CHECK(contains(o.what, w));
    }
  };
  auto plain = [](toy_model& m) { return m.parameters(); };
  refused(
      [](int) {
        reducer_options o;
        o.reproducible = true;
        o.hook = fp16_compress_hook();
        return o;
      },
      plain, errc::invalid_argument, {"reproducible", "fp16_compress"});
  refused(
      [](int) {
        reducer_options o;
        o.reproducible = true;
        o.hook = bf16_compress_hook();
        return o;
      },
      plain, errc::invalid_argument, {"reproducible", "bf16_compress"});
  refused(
      [](int) {
        reducer_options o;
        o.reproducible = true;
        o.join = true;
        o.divide_by_initial_world_size = true;
        return o;
      },
      plain, errc::invalid_argument, {"reproducible", "divide_by_initial_world_size"});
  refused(
      [](int rank) {
        reducer_options o;
        o.reproducible = rank == 0;
        return o;
      },
      plain, errc::contract_mismatch, {"reproducible"});
  static std::vector<std::int32_t> ints(4), int_grads(4);
  refused(
      [](int) {
        reducer_options o;
        o.reproducible = true;
        return o;
      },
      [](toy_model& m) {
        auto p = m.parameters();
        p.push_back(
            reducer_parameter::of(std::span<std::int32_t>(ints), std::span<std::int32_t>(int_grads), "counter"));
        return p;
      },
      errc::invalid_argument, {"reproducible", "'counter'", "int32"});
}

TEST_CASE("reproducible mode: an accumulation micro-step must mark every gradient, once, before sync turns on") {
  auto misuse = [](int what) {
    return run_ranks(2, [what](communicator& comm) {
      toy_model m({8, 3}, {});
      reducer_options o;
      o.reproducible = true;
      gradient_reducer red(comm, m.parameters(), o);
      red.set_require_gradient_sync(false);
      red.mark_ready(1);
      if (what == 0) red.finish();                         // parameter 0 never marked
      if (what == 1) red.set_require_gradient_sync(true);  // in the middle of the micro-step
      if (what == 2) red.mark_ready(1);                    // twice
    });
  };
  const char* expected[] = {"never marked ready in this micro-batch", "middle of an accumulation micro-step",
                            "called twice in an accumulation micro-step"};
  for (int what = 0; what < 3; ++what)
    for (const auto& o : misuse(what)) {
      INFO(o.what);
      CHECK(o.failed);
      CHECK(o.kind == errc::invalid_argument);
      CHECK(contains(o.what, expected[what]));
    }
}

TEST_CASE(
    "reproducible mode with micro-batches: a bucket's reduction fails on the progress thread, finish() reports it") {
  // Rank 0 leaves after 5 steps of 2 micro-batches; it takes part in step 6's agreement (an
  // all_gather of one int32, as the reducer's) and then issues an unrelated all_reduce, which
  // meets rank 1's asynchronous reduction of bucket 0. The reduction is issued in mark_ready()
  // and runs on the progress thread: its error must come out of rank 1's finish().
  std::vector<int> failed_in_finish(2, 0);
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({12, 30}, {});
    reducer_options o;
    o.reproducible = true;
    gradient_reducer red(comm, m.parameters(), o);
    const int steps = comm.rank() == 0 ? 5 : 6;
    for (int s = 0; s < steps; ++s)
      for (int micro = 0; micro < 2; ++micro) {
        red.set_require_gradient_sync(micro == 1);
        for (std::size_t i = m.size(); i-- > 0;) red.mark_ready(i);
        failed_in_finish[static_cast<std::size_t>(comm.rank())] = 1;
        red.finish();
        failed_in_finish[static_cast<std::size_t>(comm.rank())] = 0;
      }
    std::int32_t flag = 3, flags[2] = {};
    all_gather(comm, &flag, flags, 1, dtype::int32);
    float metric[2] = {1.0f, 2.0f};
    all_reduce(comm, metric, metric, 2, dtype::float32, reduce_kind::sum);
  });
  REQUIRE(out[0].failed);
  REQUIRE(out[1].failed);
  CHECK(failed_in_finish[1] == 1);
  CHECK_MESSAGE(contains(out[1].what, "step 6: reducing bucket 0"), out[1].what);
  CHECK_MESSAGE(contains(out[1].what, "mismatch"), out[1].what);
  CHECK_MESSAGE(contains(out[0].what, "mismatch"), out[0].what);
}
