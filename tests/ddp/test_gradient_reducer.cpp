// The gradient reducer: exact averages over world sizes, dtypes, bucket layouts, marking orders
// and both gradient memory modes; overlap (a bucket is reduced before finish()); accumulation
// with no_sync; unused parameters; the one rebuild; the initial broadcast; and every error path
// (raised on every rank, never a hang).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "reducer_test_util.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/collective/barrier.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"

using namespace ringzero;
using namespace ringzero::ddp;
using namespace ringzero::test;

namespace {

// Parameters of mixed sizes and dtypes; with 256-byte limits they form several buckets.
const std::vector<std::uint64_t> kCounts = {40, 7, 0, 33, 64, 5, 19, 100};
const std::vector<dtype> kTypes = {dtype::float32, dtype::float32, dtype::float32, dtype::float64,
                                   dtype::float32, dtype::float64, dtype::float32, dtype::float32};

enum class mark_order { reverse, forward, shuffled };

std::vector<std::size_t> order_for(mark_order o, std::size_t n, int rank) {
  std::vector<std::size_t> v(n);
  std::iota(v.begin(), v.end(), std::size_t{0});
  if (o == mark_order::reverse) std::reverse(v.begin(), v.end());
  if (o == mark_order::shuffled)
    std::rotate(v.begin(), v.begin() + static_cast<std::ptrdiff_t>((rank * 3 + 1) % n), v.end());
  return v;
}

/// Writes step `step`'s gradients of rank `rank` where the reducer expects them.
void fill_gradients(gradient_reducer& red, toy_model& m, int rank, int step, std::size_t i) {
  void* g = red.gradient(i);
  for (std::size_t k = 0; k < m.count(i); ++k) toy_model::write(g, m.types[i], k, grad_value(rank, i, k, step));
}

/// Checks that every gradient holds the exact average over `n` ranks of step `step`'s values.
void check_average(gradient_reducer& red, toy_model& m, int n, int step, double scale = 1.0) {
  for (std::size_t i = 0; i < m.size(); ++i) {
    const void* g = red.gradient(i);
    for (std::size_t k = 0; k < m.count(i); ++k) {
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += grad_value(r, i, k, step) * scale;
      const double expected = m.types[i] == dtype::float64 ? sum / n : static_cast<double>(static_cast<float>(sum / n));
      REQUIRE(toy_model::read(g, m.types[i], k) == expected);
    }
  }
}

}  // namespace

TEST_CASE("finish() leaves the exact average, for world sizes 1-5, both memory modes and any marking order") {
  for (int n = 1; n <= 5; ++n)
    for (bool view : {false, true})
      for (mark_order order : {mark_order::reverse, mark_order::forward, mark_order::shuffled})
        for (std::uint64_t limit : {std::uint64_t{0}, std::uint64_t{256}, std::uint64_t{1} << 20}) {
          CAPTURE(n);
          CAPTURE(view);
          CAPTURE(static_cast<int>(order));
          CAPTURE(limit);
          auto out = run_ranks(n, [&](communicator& comm) {
            toy_model m(kCounts, kTypes);
            reducer_options opt;
            opt.gradient_as_bucket_view = view;
            opt.bucket_byte_limits = {limit};
            gradient_reducer red(comm, m.parameters(), opt);
            std::uint64_t buckets = 0;
            for (int step = 0; step < 3; ++step) {
              buckets += red.bucket_count();
              for (std::size_t i : order_for(order, m.size(), comm.rank())) {
                fill_gradients(red, m, comm.rank(), step, i);
                red.mark_ready(i);
              }
              red.finish();
              check_average(red, m, n, step);
            }
            CHECK(red.stats().synchronized_steps == 3);
            CHECK(red.stats().buckets_reduced == buckets);
          });
          for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
        }
}

TEST_CASE("parameters are broadcast from rank 0 at construction") {
  for (int n : {2, 3, 4}) {
    auto out = run_ranks(n, [&](communicator& comm) {
      toy_model m(kCounts, kTypes);
      for (std::size_t i = 0; i < m.size(); ++i)
        for (std::size_t k = 0; k < m.count(i); ++k) {
          if (m.types[i] == dtype::float64)
            m.values64[m.slot[i]][k] = comm.rank() * 1000.0 + static_cast<double>(i * 100 + k);
          else
            m.values32[m.slot[i]][k] = static_cast<float>(comm.rank() * 1000 + static_cast<int>(i * 100 + k));
        }
      reducer_options opt;
      opt.bucket_byte_limits = {128};
      gradient_reducer red(comm, m.parameters(), opt);
      for (std::size_t i = 0; i < m.size(); ++i)
        for (std::size_t k = 0; k < m.count(i); ++k) {
          const double v = m.types[i] == dtype::float64 ? m.values64[m.slot[i]][k] : m.values32[m.slot[i]][k];
          REQUIRE(v == static_cast<double>(i * 100 + k));
        }
      // Gradients in view mode start at zero even though the buckets staged the broadcast.
    });
    for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
  }
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({10}, {});
    m.values32[0].assign(10, static_cast<float>(comm.rank() + 1));
    reducer_options opt;
    opt.gradient_as_bucket_view = true;
    gradient_reducer red(comm, m.parameters(), opt);
    CHECK(m.values32[0][9] == 1.0f);
    CHECK(red.gradient_span<float>(0)[9] == 0.0f);
    opt.broadcast_parameters = false;
    m.values32[0].assign(10, static_cast<float>(comm.rank() + 1));
    gradient_reducer quiet(comm, m.parameters(), opt);
    CHECK(m.values32[0][0] == static_cast<float>(comm.rank() + 1));
  });
  for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
}

TEST_CASE("a bucket is reduced as soon as it is complete, before finish() (overlap)") {
  // Two buckets: parameter 1 (reduced first) and parameter 0. After marking parameter 1 only,
  // its averaged gradient appears in bucket memory while the rank has not called finish().
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({64, 64}, {});
    reducer_options opt;
    opt.gradient_as_bucket_view = true;
    opt.bucket_byte_limits = {256};
    gradient_reducer red(comm, m.parameters(), opt);
    REQUIRE(red.bucket_count() == 2);
    CHECK(red.buckets()[0].parameters == std::vector<std::size_t>{1});
    auto g1 = red.gradient_span<float>(1);
    std::fill(g1.begin(), g1.end(), static_cast<float>(comm.rank() + 1));  // average 1.5
    CHECK_FALSE(red.bucket_communicated(0));
    red.mark_ready(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!red.bucket_communicated(0) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(red.bucket_communicated(0));  // reduced while "backward" still runs
    CHECK(g1[63] == 1.5f);
    CHECK_FALSE(red.bucket_communicated(1));
    auto g0 = red.gradient_span<float>(0);
    std::fill(g0.begin(), g0.end(), 2.0f);
    red.mark_ready(0);
    red.finish();
    CHECK(g0[0] == 2.0f);
    CHECK(g1[0] == 1.5f);
    CHECK_FALSE(red.bucket_communicated(0));  // outside a step
    CHECK(red.stats().reduction_seconds > 0.0);
    CHECK(red.stats().hidden_fraction() >= 0.0);
    CHECK(red.stats().hidden_fraction() <= 1.0);
  });
  for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
}

TEST_CASE("buckets are launched in order even when a later bucket completes first") {
  // Rank 0 marks forward (completing the last bucket first), rank 1 marks in reverse: every rank
  // still issues bucket 0's reduction first, and the results are exact.
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m(kCounts, kTypes);
    reducer_options opt;
    opt.bucket_byte_limits = {128};
    gradient_reducer red(comm, m.parameters(), opt);
    const std::uint64_t before = comm.issued();
    const auto order = order_for(comm.rank() == 0 ? mark_order::forward : mark_order::reverse, m.size(), comm.rank());
    for (std::size_t k = 0; k < order.size(); ++k) {
      fill_gradients(red, m, comm.rank(), 0, order[k]);
      red.mark_ready(order[k]);
      if (comm.rank() == 0 && k + 1 < order.size())
        CHECK(comm.issued() == before);  // bucket 0 holds the last parameter: nothing launched yet
    }
    red.finish();
    check_average(red, m, 2, 0);
  });
  for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
}

TEST_CASE("no_sync accumulation: k micro-steps without communication, then one reduction") {
  for (int n : {1, 2, 3})
    for (bool view : {false, true}) {
      CAPTURE(n);
      CAPTURE(view);
      auto out = run_ranks(n, [&](communicator& comm) {
        toy_model m(kCounts, kTypes);
        reducer_options opt;
        opt.gradient_as_bucket_view = view;
        opt.bucket_byte_limits = {200};
        gradient_reducer red(comm, m.parameters(), opt);
        const int k = 3;
        for (int step = 0; step < 2; ++step) {
          const std::uint64_t issued_before = comm.issued();
          for (int micro = 0; micro < k; ++micro) {
            auto accumulate = [&] {
              for (std::size_t i = m.size(); i-- > 0;) {
                void* g = red.gradient(i);
                for (std::size_t e = 0; e < m.count(i); ++e) {
                  const double prev = micro == 0 ? 0.0 : toy_model::read(g, m.types[i], e);
                  toy_model::write(g, m.types[i], e, prev + grad_value(comm.rank(), i, e, step));
                }
                red.mark_ready(i);
              }
              red.finish();
            };
            if (micro + 1 < k) {
              auto guard = red.no_sync();
              CHECK_FALSE(red.require_gradient_sync());
              accumulate();
              CHECK(comm.issued() == issued_before);  // no collective during micro-steps
            } else {
              CHECK(red.require_gradient_sync());
              accumulate();
            }
          }
          check_average(red, m, n, step, 3.0);  // the sum of 3 equal micro-gradients, averaged
        }
        CHECK(red.stats().local_steps == 4);
        CHECK(red.stats().synchronized_steps == 2);
      });
      for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
    }
}

TEST_CASE("unused parameters: find_unused_parameters and mark_unused reduce zeros") {
  auto out = run_ranks(3, [&](communicator& comm) {
    toy_model m({16, 16, 16, 16}, {});
    reducer_options opt;
    opt.find_unused_parameters = true;
    opt.bucket_byte_limits = {64};
    gradient_reducer red(comm, m.parameters(), opt);
    CHECK(red.bucket_count() == 4);
    // Rank r leaves parameter r unmarked (its stale buffer must not leak into the average);
    // parameter 3 is marked unused explicitly by rank 0 only.
    for (std::size_t i = 0; i < 4; ++i) std::fill(m.grads32[i].begin(), m.grads32[i].end(), 99.0f);
    for (std::size_t i = 4; i-- > 0;) {
      if (static_cast<int>(i) == comm.rank()) continue;
      if (i == 3 && comm.rank() == 0) {
        red.mark_unused(3);
        continue;
      }
      std::fill(m.grads32[i].begin(), m.grads32[i].end(), 3.0f);
      red.mark_ready(i);
    }
    red.finish();
    CHECK(m.grads32[0][0] == 2.0f);  // ranks 1 and 2 gave 3, rank 0 zero: 6 / 3
    CHECK(m.grads32[1][5] == 2.0f);
    CHECK(m.grads32[2][15] == 2.0f);
    CHECK(m.grads32[3][0] == 2.0f);  // rank 0 unused
    CHECK(red.stats().rebuilds == 0);
  });
  for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
}

TEST_CASE("the buckets are rebuilt once from rank 0's ready order, identically on every rank") {
  for (bool view : {false, true}) {
    CAPTURE(view);
    auto out = run_ranks(3, [&](communicator& comm) {
      toy_model m({16, 16, 16, 16, 16, 16}, {});
      reducer_options opt;
      opt.gradient_as_bucket_view = view;
      opt.bucket_byte_limits = {128};  // two parameters per bucket
      gradient_reducer red(comm, m.parameters(), opt);
      CHECK(bucket_indices_of(red) == std::vector<std::vector<std::size_t>>{{5, 4}, {3, 2}, {1, 0}});
      CHECK(red.layout_generation() == 0);
      // Measured where allocated: 3 buckets of 128 bytes, each rounded up to 64 bytes plus 64.
      const std::uint64_t held = 3 * (128 + 64);
      CHECK(red.memory_allocated(primitive::memory_space::host).current == held);
      CHECK(red.memory_allocated(primitive::memory_space::host).peak == held);
      CHECK(red.memory_allocated(primitive::memory_space::device).peak == 0);
      // Rank 0 marks 0, 2, 4, 1, 3, 5; other ranks mark forward. Rank 0's order wins.
      const std::vector<std::size_t> rank0 = {0, 2, 4, 1, 3, 5};
      const auto order = comm.rank() == 0 ? rank0 : order_for(mark_order::forward, 6, comm.rank());
      for (std::size_t i : order) {
        fill_gradients(red, m, comm.rank(), 0, i);
        red.mark_ready(i);
      }
      red.finish();
      CHECK(red.layout_generation() == 1);
      CHECK(red.stats().rebuilds == 1);
      CHECK(bucket_indices_of(red) == std::vector<std::vector<std::size_t>>{{0, 2}, {4, 1}, {3, 5}});
      check_average(red, m, 3, 0);  // the averaged gradients survive the move (view mode)
      for (int step = 1; step < 4; ++step) {
        for (std::size_t i : order_for(mark_order::shuffled, 6, comm.rank())) {
          fill_gradients(red, m, comm.rank(), step, i);
          red.mark_ready(i);
        }
        red.finish();
        check_average(red, m, 3, step);
      }
      CHECK(red.layout_generation() == 1);  // only once
      // The rebuilt buckets hold as much; at most the old and new sets were held at once.
      CHECK(red.memory_allocated(primitive::memory_space::host).current == held);
      CHECK(red.memory_allocated(primitive::memory_space::host).peak <= 2 * held);
      CHECK(red.memory_allocated(primitive::memory_space::host).allocations == 6);
    });
    for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
  }
  // rebuild_buckets = false keeps the first layout.
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({16, 16, 16, 16}, {});
    reducer_options opt;
    opt.bucket_byte_limits = {128};
    opt.rebuild_buckets = false;
    gradient_reducer red(comm, m.parameters(), opt);
    for (std::size_t i : {0, 2, 1, 3}) red.mark_ready(i);
    red.finish();
    CHECK(red.layout_generation() == 0);
  });
  for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
}

TEST_CASE("gradients may live in the reducer's buckets (gradient_as_bucket_view)") {
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({10, 3, 17}, {dtype::float32, dtype::float64, dtype::float32});
    reducer_options opt;
    opt.gradient_as_bucket_view = true;
    opt.alignment_bytes = 64;
    gradient_reducer red(comm, m.parameters(), opt);
    for (std::size_t i = 0; i < 3; ++i) CHECK(reinterpret_cast<std::uintptr_t>(red.gradient(i)) % 64 == 0);
    CHECK(red.gradient_span<double>(1).size() == 3);
    CHECK_THROWS_AS(red.gradient_span<float>(1), error);
    CHECK_THROWS_AS(red.gradient(3), error);
    // Registered buffers are untouched in view mode.
    m.grads32[0].assign(10, -5.0f);
    for (std::size_t i = 3; i-- > 0;) {
      fill_gradients(red, m, comm.rank(), 0, i);
      red.mark_ready(i);
    }
    red.finish();
    check_average(red, m, 2, 0);
    CHECK(m.grads32[0][0] == -5.0f);
  });
  for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
}

// ---------------------------------------------------------------- errors: every rank, no hang

TEST_CASE("ranks that register different parameter sets get an error on every rank") {
  struct variant {
    const char* what;
    std::vector<std::uint64_t> counts1;
    std::vector<dtype> types1;
    const char* message;
  };
  const std::vector<variant> cases = {
      {"one parameter fewer", {40, 7}, {}, "parameter count rank 0: 3; rank 1: 2"},
      {"a different size", {40, 7, 9}, {}, "parameter 2 'p2': rank 0: 8 x float32; rank 1: 9 x float32"},
      {"a different dtype",
       {40, 7, 8},
       {dtype::float32, dtype::float64, dtype::float32},
       "parameter 1 'p1': rank 0: 7 x float32; rank 1: 7 x float64"},
  };
  for (const auto& v : cases) {
    CAPTURE(v.what);
    auto out = run_ranks(2, [&](communicator& comm) {
      toy_model m(comm.rank() == 0 ? std::vector<std::uint64_t>{40, 7, 8} : v.counts1,
                  comm.rank() == 0 ? std::vector<dtype>{} : v.types1);
      gradient_reducer red(comm, m.parameters());
    });
    for (int r = 0; r < 2; ++r) {
      CHECK(out[r].failed);
      CHECK(out[r].kind == errc::contract_mismatch);
      CHECK_MESSAGE(contains(out[r].what, "different parameter sets"), out[r].what);
      CHECK_MESSAGE(contains(out[r].what, v.message), out[r].what);
    }
  }
}

TEST_CASE("different options or hooks are refused on every rank") {
  auto out = run_ranks(3, [&](communicator& comm) {
    toy_model m({8, 8}, {});
    reducer_options opt;
    if (comm.rank() == 2) opt.bucket_byte_limits = {4096};
    gradient_reducer red(comm, m.parameters(), opt);
  });
  for (auto& o : out) {
    CHECK(o.kind == errc::contract_mismatch);
    CHECK_MESSAGE(contains(o.what, "bucket_byte_limits"), o.what);
  }
  out = run_ranks(2, [&](communicator& comm) {
    toy_model m({8, 8}, {});
    reducer_options opt;
    opt.join = comm.rank() == 1;
    gradient_reducer red(comm, m.parameters(), opt);
  });
  for (auto& o : out) {
    CHECK(o.kind == errc::contract_mismatch);
    CHECK_MESSAGE(contains(o.what, "different options"), o.what);
  }
}

TEST_CASE("invalid arguments on one rank are reported on every rank") {
  auto out = run_ranks(3, [&](communicator& comm) {
    toy_model m({8, 8}, {});
    auto params = m.parameters();
    if (comm.rank() == 1) params[1].grad = nullptr;
    gradient_reducer red(comm, params);
  });
  for (auto& o : out) {
    CHECK(o.kind == errc::invalid_argument);
    CHECK_MESSAGE(contains(o.what, "invalid arguments on rank 1"), o.what);
  }
  CHECK_MESSAGE(contains(out[1].what, "parameter 1 'p1' has a null gradient pointer"), out[1].what);
  out = run_ranks(2, [&](communicator& comm) {
    toy_model m({8}, {});
    reducer_options opt;
    opt.bucket_byte_limits = {};
    gradient_reducer red(comm, m.parameters(), opt);
  });
  for (auto& o : out) CHECK(o.kind == errc::invalid_argument);
  CHECK_MESSAGE(contains(out[0].what, "bucket_byte_limits is empty"), out[0].what);
  out = run_ranks(2, [&](communicator& comm) {
    toy_model m({8}, {});
    reducer_options opt;
    opt.alignment_bytes = 48;
    gradient_reducer red(comm, m.parameters(), opt);
  });
  for (auto& o : out) CHECK(o.kind == errc::invalid_argument);
  CHECK_MESSAGE(contains(out[1].what, "not a power of two"), out[1].what);
}

TEST_CASE("a gradient never marked ready: an error on every rank naming it, not a hang") {
  const auto start = std::chrono::steady_clock::now();
  auto out = run_ranks(3, [&](communicator& comm) {
    toy_model m({16, 16, 16}, {});
    reducer_options opt;
    opt.bucket_byte_limits = {64};
    gradient_reducer red(comm, m.parameters(), opt);
    for (std::size_t i = 3; i-- > 0;)
      if (!(comm.rank() == 1 && i == 1)) red.mark_ready(i);
    red.finish();
  });
  for (auto& o : out) CHECK(o.failed);
  CHECK(out[1].kind == errc::invalid_argument);
  CHECK_MESSAGE(contains(out[1].what, "parameter(s) 1 'p1' were never marked ready"), out[1].what);
  CHECK_MESSAGE(contains(out[1].what, "bucket 1 can never be reduced"), out[1].what);
  for (int r : {0, 2}) CHECK_MESSAGE(contains(out[r].what, "never marked ready"), out[r].what);  // the first failure
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));  // well before the timeout
}

TEST_CASE("marking twice, an index out of range, or switching sync mid-step: errors on every rank") {
  for (int variant = 0; variant < 3; ++variant) {
    CAPTURE(variant);
    auto out = run_ranks(2, [&](communicator& comm) {
      toy_model m({16, 16}, {});
      reducer_options opt;
      opt.bucket_byte_limits = {64};
      gradient_reducer red(comm, m.parameters(), opt);
      red.mark_ready(1);
      if (comm.rank() == 1) {
        if (variant == 0) red.mark_ready(1);
        if (variant == 1) red.mark_ready(7);
        if (variant == 2) red.set_require_gradient_sync(false);
      }
      red.mark_ready(0);
      red.finish();
      red.mark_ready(0);  // never reached on rank 1; fails on rank 0 once aborted
    });
    for (auto& o : out) CHECK(o.failed);
    CHECK(out[1].kind == errc::invalid_argument);
    const char* expected[] = {"mark_ready(1 'p1') called twice in step 1", "mark_ready(7): index out of range",
                              "set_require_gradient_sync called in the middle of a step"};
    CHECK_MESSAGE(contains(out[1].what, expected[variant]), out[1].what);
    CHECK_MESSAGE(contains(out[0].what, expected[variant]), out[0].what);
  }
}

TEST_CASE("finish() after the no_sync scope ended is explained") {
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({16, 16}, {});
    gradient_reducer red(comm, m.parameters());
    {
      auto guard = red.no_sync();
      red.mark_ready(1);
      red.mark_ready(0);
    }
    red.finish();
  });
  for (auto& o : out) CHECK_MESSAGE(contains(o.what, "call finish() inside the no_sync scope"), o.what);
}

TEST_CASE("a reducer that failed stays failed") {
  auto out = run_ranks(1, [&](communicator& comm) {
    toy_model m({4}, {});
    gradient_reducer red(comm, m.parameters());
    CHECK_THROWS_AS(red.mark_ready(5), error);
    try {
      red.mark_ready(0);
      FAIL("no error");
    } catch (const error& e) {
      CHECK(e.kind() == errc::aborted);
      CHECK(contains(e.what(), "unusable after an earlier failure"));
    }
  });
  CHECK_MESSAGE(!out[0].failed, out[0].what);
}

TEST_CASE("world of one: the average is the gradient bit for bit, zero parameters are fine") {
  auto out = run_ranks(1, [&](communicator& comm) {
    toy_model m({5}, {});
    m.grads32[0] = {0.1f, 1e-30f, -3.25f, 7.0e20f, 0.3f};
    const auto copy = m.grads32[0];
    gradient_reducer red(comm, m.parameters());
    red.mark_ready(0);
    red.finish();
    CHECK(std::memcmp(copy.data(), m.grads32[0].data(), 5 * sizeof(float)) == 0);
    gradient_reducer none(comm, {});
    CHECK(none.bucket_count() == 0);
    none.finish();
  });
  CHECK_MESSAGE(!out[0].failed, out[0].what);
}
