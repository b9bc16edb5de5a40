// Uneven inputs (case C13): with join semantics the extra steps' reductions are matched by zero
// contributions and averaged over the ranks that contributed; the final model is made equal on
// every rank; without join a clear error on every rank, never a hang.
#include <doctest/doctest.h>

#include <stdexcept>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "reducer_test_util.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/ddp/compression_hook.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"

using namespace ringzero;
using namespace ringzero::ddp;
using namespace ringzero::test;

namespace {

/// Trains `batches[rank]` steps on each rank (gradient of element k in step s on rank r:
/// grad_value(r, i, k, s); after each step the parameters are set to 100*s + 10*r + i), then
/// joins. Checks every step's average over the ranks that still had data.
void run_uneven(const std::vector<int>& batches, bool divide_by_initial, bool view, bool compress,
                std::vector<std::uint64_t> counts = {12, 30, 7}) {
  const int n = static_cast<int>(batches.size());
  auto out = run_ranks(n, [&](communicator& comm) {
    toy_model m(counts, {});
    reducer_options opt;
    opt.join = true;
    opt.divide_by_initial_world_size = divide_by_initial;
    opt.gradient_as_bucket_view = view;
    opt.bucket_byte_limits = {64};
    if (compress) opt.hook = fp16_compress_hook();
    gradient_reducer red(comm, m.parameters(), opt);
    const int mine = batches[static_cast<std::size_t>(comm.rank())];
    for (int s = 0; s < mine; ++s) {
      for (std::size_t i = m.size(); i-- > 0;) {
        void* g = red.gradient(i);
        for (std::size_t k = 0; k < m.count(i); ++k)
          toy_model::write(g, dtype::float32, k, grad_value(comm.rank(), i, k, s));
        red.mark_ready(i);
      }
      red.finish();
      std::vector<int> active;
      for (int r = 0; r < n; ++r)
        if (batches[static_cast<std::size_t>(r)] > s) active.push_back(r);
      const int contributors = static_cast<int>(active.size());
      CHECK(red.last_contributors() == contributors);
      const int divisor = divide_by_initial ? n : contributors;
      for (std::size_t i = 0; i < m.size(); ++i)
        for (std::size_t k = 0; k < m.count(i); ++k) {
          double sum = 0;
          for (int r : active) sum += grad_value(r, i, k, s);
          const double got = toy_model::read(red.gradient(i), dtype::float32, k);
          REQUIRE(got == static_cast<double>(static_cast<float>(sum / divisor)));
        }
      for (std::size_t i = 0; i < m.size(); ++i)
        std::fill(m.values32[i].begin(), m.values32[i].end(),
                  static_cast<float>(100 * s + 10 * comm.rank() + static_cast<int>(i)));
    }
    red.join();
    // The model of the lowest rank that trained in the last step now lives on every rank.
    int longest = 0;
    for (int b : batches) longest = std::max(longest, b);
    int source = 0;
    while (batches[static_cast<std::size_t>(source)] != longest) ++source;
    if (longest > 0)
      for (std::size_t i = 0; i < m.size(); ++i)
        CHECK(m.values32[i][0] == static_cast<float>(100 * (longest - 1) + 10 * source + static_cast<int>(i)));
    // The reducer goes on working after every rank joined (a new epoch).
    for (std::size_t i = m.size(); i-- > 0;) {
      void* g = red.gradient(i);
      for (std::size_t k = 0; k < m.count(i); ++k) toy_model::write(g, dtype::float32, k, 2.0 * (comm.rank() + 1));
      red.mark_ready(i);
    }
    red.finish();
    CHECK(red.last_contributors() == n);
    CHECK(toy_model::read(red.gradient(0), dtype::float32, 0) == static_cast<double>(n + 1));
  });
  for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
}

}  // namespace

TEST_CASE("C13: world 2, rank 0 has 5 batches and rank 1 has 6: the 6th step averages over rank 1 alone") {
  run_uneven({5, 6}, false, false, false);
  run_uneven({5, 6}, false, true, false);
}

TEST_CASE("C13 with divide_by_initial_world_size (PyTorch's default): the 6th step divides by 2") {
  run_uneven({5, 6}, true, false, false);
}

TEST_CASE("join across three ranks, in any order of running out, with compression and a rank with no data") {
  run_uneven({2, 5, 3}, false, false, false);
  run_uneven({4, 1, 4}, false, true, false);
  run_uneven({3, 3, 3}, false, false, false);
  run_uneven({0, 2, 1}, false, false, false);                // rank 0 joins at once, before the rebuild
  run_uneven({2, 4, 2, 4}, false, false, true, {8, 8, 16});  // fp16: 4 or 2 contributors keep values exact
}

TEST_CASE("join shadows the one rebuild when a rank joins before it") {
  auto out = run_ranks(3, [&](communicator& comm) {
    toy_model m({16, 16, 16, 16}, {});
    reducer_options opt;
    opt.join = true;
    opt.bucket_byte_limits = {128};
    gradient_reducer red(comm, m.parameters(), opt);
    if (comm.rank() == 0) {
      red.join();  // no data at all; rank 1's order is used for the rebuild
    } else {
      const std::vector<std::size_t> order =
          comm.rank() == 1 ? std::vector<std::size_t>{0, 2, 1, 3} : std::vector<std::size_t>{3, 2, 1, 0};
      for (int s = 0; s < 2; ++s) {
        for (std::size_t i : order) {
          std::fill(m.grads32[i].begin(), m.grads32[i].end(), static_cast<float>(comm.rank()));
          red.mark_ready(i);
        }
        red.finish();
        CHECK(m.grads32[0][0] == 1.5f);  // (1 + 2) / 2 contributors
      }
      red.join();
    }
    CHECK(red.layout_generation() == 1);
    CHECK(bucket_indices_of(red) == std::vector<std::vector<std::size_t>>{{0, 2}, {1, 3}});
  });
  for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
}

TEST_CASE("C13 without join: a clear error, not a hang") {
  // Rank 0 stops after 5 steps and moves on to another collective; rank 1 runs a 6th step.
  const auto start = std::chrono::steady_clock::now();
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({12, 30}, {});
    gradient_reducer red(comm, m.parameters());
    const int batches = comm.rank() == 0 ? 5 : 6;
    for (int s = 0; s < batches; ++s) {
      for (std::size_t i = m.size(); i-- > 0;) red.mark_ready(i);
      red.finish();
    }
    float metric[2] = {1.0f, 2.0f};
    all_reduce(comm, metric, metric, 2, dtype::float32, reduce_kind::sum);
  });
  CHECK(out[0].failed);
  CHECK(out[1].failed);
  CHECK_MESSAGE(contains(out[1].what, "step 6: reducing bucket 0"), out[1].what);
  CHECK_MESSAGE(contains(out[1].what, "enable reducer_options::join"), out[1].what);
  CHECK_MESSAGE(contains(out[1].what, "count mismatch"), out[1].what);
  CHECK_MESSAGE(contains(out[0].what, "count mismatch"), out[0].what);
  // Rank 0 returns instead: rank 1 learns that its peer left.
  out = run_ranks(2, [&](communicator& comm) {
    toy_model m({12, 30}, {});
    gradient_reducer red(comm, m.parameters());
    const int batches = comm.rank() == 0 ? 5 : 6;
    for (int s = 0; s < batches; ++s) {
      for (std::size_t i = m.size(); i-- > 0;) red.mark_ready(i);
      red.finish();
    }
  });
  CHECK_FALSE(out[0].failed);
  CHECK(out[1].failed);
  CHECK_MESSAGE(contains(out[1].what, "enable reducer_options::join"), out[1].what);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));
}

TEST_CASE("a rank that fails for its own reason: its peer's error names it and does not suggest join") {
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({12, 30}, {});
    gradient_reducer red(comm, m.parameters());
    for (int s = 0; s < 3; ++s) {
      if (comm.rank() == 0 && s == 2) throw std::runtime_error("rank 0's data loader failed");
      for (std::size_t i = m.size(); i-- > 0;) red.mark_ready(i);
      red.finish();
    }
  });
  CHECK(out[0].failed);
  CHECK(out[1].failed);
  CHECK_MESSAGE(contains(out[1].what, "data loader failed"), out[1].what);
  CHECK_MESSAGE(!contains(out[1].what, "enable reducer_options::join"), out[1].what);
}

TEST_CASE("join() without the join option, or in the middle of a step: an error on every rank") {
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({12, 30}, {});
    gradient_reducer red(comm, m.parameters());
    if (comm.rank() == 0) red.join();
    for (std::size_t i = m.size(); i-- > 0;) red.mark_ready(i);
    red.finish();
  });
  CHECK(out[0].kind == errc::invalid_argument);
  for (auto& o : out) CHECK_MESSAGE(contains(o.what, "join() needs reducer_options::join = true"), o.what);
  out = run_ranks(2, [&](communicator& comm) {
    toy_model m({12, 30}, {});
    reducer_options opt;
    opt.join = true;
    gradient_reducer red(comm, m.parameters(), opt);
    red.mark_ready(1);
    red.join();
  });
  for (auto& o : out) CHECK_MESSAGE(contains(o.what, "join() called in the middle of a step"), o.what);
}
