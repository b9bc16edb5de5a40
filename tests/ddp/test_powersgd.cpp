// PowerSGD communication hook: low-rank averages recovered, uncompressed gradients averaged
// exactly, plain steps before start_iteration, the same bits on every rank, error feedback that
// makes the accumulated update converge, the traffic it reports, and every bad setting.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "reducer_test_util.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"
#include "ringzero/ddp/powersgd_hook.hpp"

using namespace ringzero;
using namespace ringzero::ddp;
using namespace ringzero::test;

namespace {

/// A parameter of the PowerSGD tests: its shape (empty: a vector of `count`) and dtype.
struct psgd_param {
  std::vector<std::uint64_t> shape;
  std::uint64_t count = 0;
  dtype type = dtype::float32;
};

/// Every rank's gradients after each step: [step][rank][parameter][element].
using psgd_history = std::vector<std::vector<std::vector<std::vector<double>>>>;

/// Runs `steps` synchronised steps on `n` ranks with a PowerSGD hook of `options`; rank r's
/// gradient of parameter i in step s is `value(r, i, k, s)`. Returns every rank's averaged
/// gradients, and the hook of rank 0 through `hook0` when given.
template <class Value>
psgd_history psgd_run(int n, const std::vector<psgd_param>& params, const powersgd_options& options, int steps,
                      Value&& value, std::shared_ptr<powersgd_hook>* hook0 = nullptr) {
  psgd_history out(static_cast<std::size_t>(steps),
                   std::vector<std::vector<std::vector<double>>>(static_cast<std::size_t>(n)));
  std::mutex mutex;
  auto outcome = run_ranks(n, [&](communicator& comm) {
    std::vector<std::uint64_t> counts;
    std::vector<dtype> types;
    for (const auto& p : params) {
      counts.push_back(p.count);
      types.push_back(p.type);
    }
    toy_model m(counts, types);
    std::vector<reducer_parameter> regs = m.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) regs[i].shape = params[i].shape;
    auto hook = std::make_shared<powersgd_hook>(options);
    if (comm.rank() == 0 && hook0 != nullptr) *hook0 = hook;
    reducer_options opt;
    opt.hook = hook;
    opt.bucket_byte_limits = {1024};  // several buckets, rebuilt after step 1
    gradient_reducer red(comm, regs, opt);
    for (int s = 0; s < steps; ++s) {
      for (std::size_t i = m.size(); i-- > 0;) {
        void* g = red.gradient(i);
        for (std::size_t k = 0; k < m.count(i); ++k) toy_model::write(g, m.types[i], k, value(comm.rank(), i, k, s));
        red.mark_ready(i);
      }
      red.finish();
      std::vector<std::vector<double>> mine;
      for (std::size_t i = 0; i < m.size(); ++i) {
        std::vector<double> v;
        for (std::size_t k = 0; k < m.count(i); ++k) v.push_back(toy_model::read(red.gradient(i), m.types[i], k));
        mine.push_back(std::move(v));
      }
      std::lock_guard<std::mutex> lock(mutex);
      out[static_cast<std::size_t>(s)][static_cast<std::size_t>(comm.rank())] = std::move(mine);
    }
  });
  for (auto& o : outcome) REQUIRE_MESSAGE(!o.failed, o.what);
  return out;
}

/// The errors of a run expected to fail, one per rank.
std::vector<rank_outcome> psgd_failing_run(int n, const std::vector<psgd_param>& params,
                                           const std::function<powersgd_options(int)>& options_of) {
  return run_ranks(n, [&](communicator& comm) {
    std::vector<std::uint64_t> counts;
    for (const auto& p : params) counts.push_back(p.count);
    toy_model m(counts, {});
    std::vector<reducer_parameter> regs = m.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) regs[i].shape = params[i].shape;
    reducer_options opt;
    opt.hook = make_powersgd_hook(options_of(comm.rank()));
    gradient_reducer red(comm, regs, opt);
    for (int s = 0; s < 2; ++s) {
      for (std::size_t i = m.size(); i-- > 0;) red.mark_ready(i);
      red.finish();
    }
  });
}

// Rank r's matrices are (r + 1) * u v^T plus a per-rank vector part: every average is rank 1.
double psgd_low_rank(int rank, std::size_t i, std::size_t k, int step, std::uint64_t cols) {
  const double u = 1.0 + static_cast<double>((k / cols) % 5) * 0.25;
  const double v = static_cast<double>((k % cols) % 7) - 3.0 + 0.125 * static_cast<double>(i);
  return (rank + 1) * (step + 1) * u * v / 4.0;
}

const std::vector<psgd_param> kPsgdModel = {
    {{16, 12}, 192, dtype::float32},   // compressed at rank 1 and 2: (16 + 12) * r * 2 < 192
    {{}, 12, dtype::float32},          // a bias: all-reduced as it is
    {{6, 5, 4}, 120, dtype::float64},  // three dimensions: 6 x 20, compressed
    {{3, 4}, 12, dtype::float32},      // too small to gain: all-reduced as it is
    {{}, 7, dtype::float64},
};

}  // namespace

TEST_CASE("PowerSGD recovers low-rank averages, averages the rest exactly, and every rank gets the same bits") {
  for (int rank : {1, 2})
    for (int n : {1, 2, 3, 4}) {
      CAPTURE(rank);
      CAPTURE(n);
      powersgd_options o;
      o.matrix_approximation_rank = rank;
      o.start_iteration = 0;
      const auto value = [](int r, std::size_t i, std::size_t k, int s) {
        if (i == 0) return psgd_low_rank(r, i, k, s, 12);
        if (i == 2) return psgd_low_rank(r, i, k, s, 20);
        return grad_value(r, i, k, s);  // exact sums
      };
      const auto h = psgd_run(n, kPsgdModel, o, 3, value);
      for (int s = 0; s < 3; ++s) {
        for (int r = 1; r < n; ++r)
          for (std::size_t i = 0; i < kPsgdModel.size(); ++i)
            for (std::size_t k = 0; k < kPsgdModel[i].count; ++k)
              REQUIRE(std::memcmp(&h[s][r][i][k], &h[s][0][i][k], sizeof(double)) == 0);  // bitwise
        for (std::size_t i = 0; i < kPsgdModel.size(); ++i)
          for (std::size_t k = 0; k < kPsgdModel[i].count; ++k) {
            double mean = 0;
            for (int r = 0; r < n; ++r) mean += value(r, i, k, s);
            mean /= n;
            CAPTURE(i);
            CAPTURE(k);
            if (i == 0 || i == 2)  // low rank: recovered up to rounding (the residual stays ~0)
              CHECK(std::fabs(h[s][0][i][k] - mean) <= (i == 0 ? 2e-4 : 1e-9) * (1.0 + std::fabs(mean)));
            else  // uncompressed: the exact average
              CHECK(h[s][0][i][k] == (kPsgdModel[i].type == dtype::float32 ? static_cast<float>(mean) : mean));
          }
      }
    }
}

TEST_CASE("PowerSGD: steps before start_iteration are plain averages; a full-rank gradient is approximated") {
  powersgd_options o;
  o.matrix_approximation_rank = 1;
  o.start_iteration = 2;
  o.use_error_feedback = false;
  const auto value = [](int r, std::size_t i, std::size_t k, int s) { return grad_value(r, i, k, s); };
  std::shared_ptr<powersgd_hook> hook;
  const auto h = psgd_run(3, kPsgdModel, o, 3, value, &hook);
  for (int s = 0; s < 3; ++s)
    for (std::size_t i = 0; i < kPsgdModel.size(); ++i) {
      bool all_exact = true;
      for (std::size_t k = 0; k < kPsgdModel[i].count; ++k) {
        const double mean = (value(0, i, k, s) + value(1, i, k, s) + value(2, i, k, s)) / 3.0;
        const double want = kPsgdModel[i].type == dtype::float32 ? static_cast<float>(mean) : mean;
        all_exact = all_exact && h[s][0][i][k] == want;
      }
      CAPTURE(s);
      CAPTURE(i);
      // Plain steps and uncompressed gradients: exact; compressed full-rank matrices: not.
      CHECK(all_exact == (s < 2 || i == 1 || i == 3 || i == 4));
    }
  CHECK(hook->iterations() == 3);
  CHECK(hook->compressing());
}

TEST_CASE("PowerSGD error feedback: the accumulated update converges to the accumulated gradient") {
  // A constant full-rank gradient G: with error feedback the sum of T updates is T G minus a
  // bounded residual, so the mean update approaches G; without it, every update misses G by the
  // same rank-1 error.
  const std::vector<psgd_param> model = {{{8, 6}, 48, dtype::float64}};
  const auto g = [](int r, std::size_t, std::size_t k, int) {
    return std::sin(1.0 + static_cast<double>(k) * 0.7) + 0.5 * static_cast<double>(r);
  };
  auto mean_update_error = [&](bool feedback) {
    powersgd_options o;
    o.start_iteration = 0;
    o.use_error_feedback = feedback;
    const int steps = 200;
    const auto h = psgd_run(2, model, o, steps, g);
    double worst = 0;
    for (std::size_t k = 0; k < 48; ++k) {
      double sum = 0;
      for (int s = 0; s < steps; ++s) sum += h[s][0][0][k];
      const double want = (g(0, 0, k, 0) + g(1, 0, k, 0)) / 2.0;
      worst = std::max(worst, std::fabs(sum / steps - want));
    }
    return worst;
  };
  const double with = mean_update_error(true), without = mean_update_error(false);
  CAPTURE(with);
  CAPTURE(without);
  CHECK(without > 0.1);
  CHECK(with < without / 10);
}

TEST_CASE("PowerSGD reports what each parameter sends; warm start off draws a new Q each step, still same bits") {
  powersgd_options o;
  o.matrix_approximation_rank = 2;
  o.start_iteration = 0;
  o.warm_start = false;
  std::shared_ptr<powersgd_hook> hook;
  const std::vector<psgd_param> model = {
      {{256, 784}, 256 * 784, dtype::float32}, {{}, 256, dtype::float32}, {{10, 128}, 1280, dtype::float32}};
  const auto h = psgd_run(
      2, model, o, 2, [](int r, std::size_t i, std::size_t k, int s) { return grad_value(r, i, k, s); }, &hook);
  CHECK(hook->traffic(0).compressed);
  CHECK(hook->traffic(0).sent == (256 + 784) * 2);
  CHECK(hook->traffic(0).uncompressed == 256 * 784);
  CHECK(!hook->traffic(1).compressed);
  CHECK(hook->traffic(1).sent == 256);
  CHECK(hook->traffic(2).compressed);  // (10 + 128) * 2 * 2 = 552 < 1280
  CHECK(hook->traffic(2).sent == 276);
  CHECK(hook->step_traffic().first == 2080 + 256 + 276);
  CHECK(hook->step_traffic().second == 256 * 784 + 256 + 1280);
  for (std::size_t i = 0; i < model.size(); ++i)
    CHECK(std::memcmp(h[1][0][i].data(), h[1][1][i].data(), h[1][0][i].size() * sizeof(double)) == 0);
}

TEST_CASE("PowerSGD bad settings and models: clear errors, on every rank") {
  for (int bad_rank : {0, -3})
    CHECK_THROWS_WITH_AS(powersgd_hook(powersgd_options{bad_rank}),
                         doctest::Contains("matrix_approximation_rank must be at least 1"), error);
  powersgd_options low;
  low.min_compression_rate = 0.5;
  CHECK_THROWS_WITH_AS(powersgd_hook{low},
                       doctest::Contains("min_compression_rate must be a finite value of at least 1"), error);
  powersgd_options eps;
  eps.orthogonalization_epsilon = -1e-8;
  CHECK_THROWS_WITH_AS(powersgd_hook{eps}, doctest::Contains("orthogonalization_epsilon"), error);

  // No shapes registered: refused at the first step on every rank, saying how to fix it.
  auto out = psgd_failing_run(2, {{{}, 64}, {{}, 8}}, [](int) { return powersgd_options{}; });
  for (auto& o : out) {
    CHECK(o.kind == errc::invalid_argument);
    CHECK_MESSAGE(contains(o.what, "reducer_parameter::shape"), o.what);
  }
  // A rank above every matrix's smaller side: the best candidate named.
  out = psgd_failing_run(3, {{{4, 40}, 160}, {{3, 3}, 9}}, [](int) { return powersgd_options{5}; });
  for (auto& o : out) {
    CHECK(o.kind == errc::invalid_argument);
    CHECK_MESSAGE(contains(o.what, "'p0' [4 x 40] would send (4 + 40) * 4 = 176 elements instead of 160"), o.what);
  }
  // Different settings on one rank: refused at construction, each rank naming its own.
  out = psgd_failing_run(2, {{{16, 16}, 256}}, [](int r) { return powersgd_options{r == 1 ? 2 : 1}; });
  for (std::size_t r = 0; r < out.size(); ++r) {
    CHECK(out[r].kind == errc::contract_mismatch);
    CHECK_MESSAGE(contains(out[r].what, r == 1 ? "'powersgd(rank=2," : "'powersgd(rank=1,"), out[r].what);
  }
  // A dimension of 0 makes the product 0 whatever the other dimensions (no overflow).
  out = run_ranks(2, [&](communicator& comm) {
    toy_model m({0, 12}, {});
    auto regs = m.parameters();
    regs[0].shape = {std::uint64_t{1} << 40, std::uint64_t{1} << 40, 0};
    regs[1].shape = {3, 4};
    gradient_reducer red(comm, regs);
  });
  for (auto& o : out) CHECK_MESSAGE(!o.failed, o.what);
  // A shape whose product is not the count; a shape that differs between ranks.
  out = run_ranks(2, [&](communicator& comm) {
    toy_model m({12}, {});
    auto regs = m.parameters();
    regs[0].shape = comm.rank() == 1 ? std::vector<std::uint64_t>{5, 3} : std::vector<std::uint64_t>{3, 4};
    gradient_reducer red(comm, regs);
  });
  for (auto& o : out) {
    CHECK(o.kind == errc::invalid_argument);
    CHECK_MESSAGE(contains(o.what, "invalid arguments on rank 1"), o.what);
  }
  CHECK_MESSAGE(contains(out[1].what, "parameter 0 'p0' has shape [5, 3] (15 elements) but count 12"), out[1].what);
  out = run_ranks(2, [&](communicator& comm) {
    toy_model m({12}, {});
    auto regs = m.parameters();
    regs[0].shape = comm.rank() == 1 ? std::vector<std::uint64_t>{2, 6} : std::vector<std::uint64_t>{3, 4};
    gradient_reducer red(comm, regs);
  });
  for (std::size_t r = 0; r < out.size(); ++r) {
    CHECK(out[r].kind == errc::contract_mismatch);
    CHECK_MESSAGE(contains(out[r].what, "parameter 0 'p0'"), out[r].what);
    CHECK_MESSAGE(contains(out[r].what, r == 1 ? "this rank: shape [2, 6]" : "this rank: shape [3, 4]"), out[r].what);
  }
}

TEST_CASE("PowerSGD with join: a rank that joined sends zeros and keeps its residual out of the average") {
  // Rank r's gradient is (r + 1) B, B of rank 1, every step. Step 0 (both ranks): 1.5 B; rank 0's
  // residual is then B - 1.5 B = -0.5 B. Rank 1 joins: step 1 averages rank 0 alone, B - 0.5 B =
  // 0.5 B, and from step 2 on B. (Adding the joined rank's residual to its zeros made the
  // average swing between B and 0.)
  std::vector<std::vector<double>> got;
  auto out = run_ranks(2, [&](communicator& comm) {
    toy_model m({48}, {dtype::float64});
    auto regs = m.parameters();
    regs[0].shape = {8, 6};
    powersgd_options o;
    o.start_iteration = 0;
    reducer_options opt;
    opt.hook = make_powersgd_hook(o);
    opt.join = true;
    gradient_reducer red(comm, regs, opt);
    for (int s = 0; s < (comm.rank() == 0 ? 8 : 1); ++s) {
      for (std::size_t k = 0; k < 48; ++k)
        toy_model::write(red.gradient(0), dtype::float64, k, psgd_low_rank(comm.rank(), 0, k, 0, 6));
      red.mark_ready(0);
      red.finish();
      if (comm.rank() == 0) {
        std::vector<double> v;
        for (std::size_t k = 0; k < 48; ++k) v.push_back(toy_model::read(red.gradient(0), dtype::float64, k));
        got.push_back(v);
      }
    }
    red.join();
  });
  for (auto& o : out) REQUIRE_MESSAGE(!o.failed, o.what);
  REQUIRE(got.size() == 8);
  for (std::size_t s = 0; s < 8; ++s)
    for (std::size_t k = 0; k < 48; ++k) {
      const double b = psgd_low_rank(0, 0, k, 0, 6), want = s == 0 ? 1.5 * b : s == 1 ? 0.5 * b : b;
      CAPTURE(s);
      CAPTURE(k);
      CHECK(std::fabs(got[s][k] - want) <= 1e-9 * (1.0 + std::fabs(want)));
    }
}

TEST_CASE("PowerSGD settings that differ in any bit have different names") {
  powersgd_options a, b;
  b.min_compression_rate = 1.9999999;
  CHECK(powersgd_hook(a).name() != powersgd_hook(b).name());
  b = a;
  b.orthogonalization_epsilon = 1e-300;
  CHECK(powersgd_hook(a).name() != powersgd_hook(b).name());
  CHECK(powersgd_hook(a).name() ==
        "powersgd(rank=1,start=1000,min_rate=2,error_feedback=1,warm_start=1,epsilon=0,seed=0)");
}
