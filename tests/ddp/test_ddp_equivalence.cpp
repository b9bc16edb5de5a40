// Data parallelism does not change training: N-rank DDP of the example MLP equals 1-rank
// training on the same global batches (loss and parameters after 5 steps within 1e-5 relative,
// float32), for N = 1..4, SGD and AdamW, with and without gradient accumulation, with gradients
// copied or living in bucket memory, and with a rebuild of the buckets after the first step.
// Every rank also ends with bitwise identical parameters.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "distributed_sampler.hpp"
#include "mlp.hpp"
#include "optimizer.hpp"
#include "reducer_test_util.hpp"
#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/ddp/gradient_reducer.hpp"

using namespace ringzero;
using namespace ringzero::ddp;
using namespace ringzero::test;
using ringzero::examples::mlp;

namespace {

constexpr int kSteps = 5;
constexpr int kGlobal = 24;  // divisible by N * k for N = 1..4, k = 1, 2
const std::vector<int> kWidths = {20, 16, 12, 5};

struct dataset {
  std::vector<float> x;
  std::vector<std::uint8_t> y;
};

dataset make_data() {
  dataset d;
  examples::splitmix64 rng(2024);
  const std::size_t rows = static_cast<std::size_t>(kSteps) * kGlobal;
  d.x.resize(rows * static_cast<std::size_t>(kWidths[0]));
  for (float& v : d.x) v = 2.0f * rng.uniform() - 1.0f;
  d.y.resize(rows);
  for (auto& v : d.y) v = static_cast<std::uint8_t>(rng.below(static_cast<std::uint64_t>(kWidths.back())));
  return d;
}

std::unique_ptr<examples::optimizer> make_opt(const std::string& name, std::size_t n) {
  return examples::make_optimizer(name, n, name == "sgd" ? 0.1f : 0.01f);
}

struct trajectory {
  std::vector<double> losses;
  std::vector<float> params;
};

/// 1-rank training without any reducer: the reference.
trajectory reference(const dataset& d, const std::string& opt_name) {
  mlp model(kWidths, 11);
  model.reserve(kGlobal);
  auto opt = make_opt(opt_name, model.parameter_elements());
  trajectory t;
  for (int s = 0; s < kSteps; ++s) {
    const float* x = d.x.data() + static_cast<std::size_t>(s) * kGlobal * kWidths[0];
    const std::uint8_t* y = d.y.data() + static_cast<std::size_t>(s) * kGlobal;
    t.losses.push_back(model.forward(x, y, kGlobal));
    model.backward(x, y, kGlobal, 1.0f / kGlobal, false, [](std::size_t) {});
    opt->begin_step();
    for (std::size_t i = 0; i < model.tensor_count(); ++i)
      opt->update(model.parameter(i), model.gradient(i), model.tensor(i).offset);
  }
  t.params.assign(model.parameters().begin(), model.parameters().end());
  return t;
}

enum class variant { copy, view, view_rebuild, copy_rebuild };

/// N-rank DDP: rank r's micro-step m of step s uses rows s*G + (m*N + r)*b .. + b.
std::vector<trajectory> ddp_runs(const dataset& d, int n, int k, const std::string& opt_name, variant v) {
  std::vector<trajectory> per_rank(static_cast<std::size_t>(n));
  auto out = run_ranks(n, [&](communicator& comm) {
    mlp model(kWidths, 11 + 100 * static_cast<std::uint64_t>(comm.rank()));  // rank 0's values are broadcast
    const int b = kGlobal / (n * k);
    model.reserve(b);
    const std::size_t tensors = model.tensor_count();
    // Registration order: the model's (W1, b1, W2, ...) or, to force a rebuild, biases first.
    std::vector<std::size_t> reg_of(tensors), tensor_of(tensors);
    const bool permuted = v == variant::view_rebuild || v == variant::copy_rebuild;
    for (std::size_t j = 0; j < tensors; ++j) tensor_of[j] = permuted ? (j % 2 == 0 ? j + 1 : j - 1) : j;
    for (std::size_t j = 0; j < tensors; ++j) reg_of[tensor_of[j]] = j;
    std::vector<reducer_parameter> params;
    for (std::size_t j = 0; j < tensors; ++j)
      params.push_back(reducer_parameter::of(model.parameter(tensor_of[j]), model.gradient(tensor_of[j]),
                                             model.tensor(tensor_of[j]).name));
    reducer_options opt;
    opt.gradient_as_bucket_view = v == variant::view || v == variant::view_rebuild;
    opt.bucket_byte_limits = {256, 512};
    gradient_reducer red(comm, std::move(params), opt);
    std::uint64_t bound = ~std::uint64_t{0};
    auto bind = [&] {
      if (!opt.gradient_as_bucket_view || bound == red.layout_generation()) return;
      for (std::size_t j = 0; j < tensors; ++j) model.bind_gradient(tensor_of[j], red.gradient_span<float>(j).data());
      bound = red.layout_generation();
    };
    bind();
    auto o = make_opt(opt_name, model.parameter_elements());
    trajectory t;
    for (int s = 0; s < kSteps; ++s) {
      double loss = 0;
      for (int m = 0; m < k; ++m) {
        const std::size_t row =
            static_cast<std::size_t>(s) * kGlobal + static_cast<std::size_t>((m * n + comm.rank()) * b);
        const float* x = d.x.data() + row * kWidths[0];
        const std::uint8_t* y = d.y.data() + row;
        loss += model.forward(x, y, b);
        red.set_require_gradient_sync(m + 1 == k);
        model.backward(x, y, b, 1.0f / static_cast<float>(b * k), m > 0,
                       [&](std::size_t i) { red.mark_ready(reg_of[i]); });
        red.finish();
      }
      bind();
      double global_loss = loss / k;
      all_reduce(comm, &global_loss, &global_loss, 1, dtype::float64, reduce_kind::avg);
      t.losses.push_back(global_loss);
      o->begin_step();
      for (std::size_t i = 0; i < tensors; ++i)
        o->update(model.parameter(i), model.gradient(i), model.tensor(i).offset);
    }
    CHECK(red.stats().rebuilds == (permuted ? 1u : 0u));
    CHECK(red.stats().synchronized_steps == static_cast<std::uint64_t>(kSteps));
    CHECK(red.stats().local_steps == static_cast<std::uint64_t>(kSteps * (k - 1)));
    t.params.assign(model.parameters().begin(), model.parameters().end());
    per_rank[static_cast<std::size_t>(comm.rank())] = std::move(t);
  });
  for (auto& o : out) REQUIRE_MESSAGE(!o.failed, o.what);
  return per_rank;
}

}  // namespace

TEST_CASE("N-rank DDP equals 1-rank training on the same global batch (N = 1..4)") {
  const dataset d = make_data();
  mlp shape(kWidths, 0);
  for (const std::string opt_name : {"sgd", "adamw"}) {
    const trajectory ref = reference(d, opt_name);
    for (int n = 1; n <= 4; ++n)
      for (int k : {1, 2})
        for (variant v : {variant::copy, variant::view, variant::view_rebuild, variant::copy_rebuild}) {
          CAPTURE(opt_name);
          CAPTURE(n);
          CAPTURE(k);
          CAPTURE(static_cast<int>(v));
          const auto runs = ddp_runs(d, n, k, opt_name, v);
          for (int s = 0; s < kSteps; ++s)
            CHECK(std::fabs(runs[0].losses[static_cast<std::size_t>(s)] - ref.losses[static_cast<std::size_t>(s)]) <=
                  1e-5 * std::fabs(ref.losses[static_cast<std::size_t>(s)]));
          for (std::size_t i = 0; i < shape.tensor_count(); ++i) {
            const auto& t = shape.tensor(i);
            float scale = 0, diff = 0;
            for (std::size_t e = t.offset; e < t.offset + t.count; ++e) {
              scale = std::max(scale, std::fabs(ref.params[e]));
              diff = std::max(diff, std::fabs(runs[0].params[e] - ref.params[e]));
            }
            CAPTURE(t.name);
            CHECK(diff <= 1e-5f * scale);
          }
          for (int r = 1; r < n; ++r) CHECK(runs[static_cast<std::size_t>(r)].params == runs[0].params);  // bitwise
        }
  }
}

TEST_CASE("the reference itself moves: training changes the parameters and lowers the loss") {
  const dataset d = make_data();
  const trajectory ref = reference(d, "sgd");
  mlp fresh(kWidths, 11);
  CHECK(std::vector<float>(fresh.parameters().begin(), fresh.parameters().end()) != ref.params);
  CHECK(ref.losses.back() < ref.losses.front());
}

TEST_CASE("distributed sampler: same permutation on every rank, disjoint shards, union = global batches") {
  for (int n : {1, 2, 3, 4}) {
    std::vector<examples::distributed_sampler> s;
    for (int r = 0; r < n; ++r) s.emplace_back(1003, n, r, 7);
    for (std::uint64_t epoch : {0u, 1u, 5u}) {
      for (auto& x : s) x.set_epoch(epoch);
      for (int r = 1; r < n; ++r)
        CHECK(std::equal(s[0].permutation().begin(), s[0].permutation().end(),
                         s[static_cast<std::size_t>(r)].permutation().begin()));
      std::vector<int> seen(1003, 0);
      for (auto& x : s) {
        CHECK(x.shard_size() == 1003 / static_cast<std::size_t>(n));
        for (std::uint32_t i : x.indices()) ++seen[i];
      }
      CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<std::ptrdiff_t>(1003 / n * n));
      CHECK(std::count(seen.begin(), seen.end(), 0) == static_cast<std::ptrdiff_t>(1003 % n));
      // Micro-batches of b from every shard cover consecutive blocks of n*b of the permutation.
      const std::size_t b = 5;
      for (std::size_t step = 0; step < 1003 / (static_cast<std::size_t>(n) * b); ++step) {
        std::vector<std::uint32_t> got,
            want(s[0].permutation().begin() + static_cast<std::ptrdiff_t>(step * n * b),
                 s[0].permutation().begin() + static_cast<std::ptrdiff_t>((step + 1) * n * b));
        for (auto& x : s)
          got.insert(got.end(), x.indices().begin() + static_cast<std::ptrdiff_t>(step * b),
                     x.indices().begin() + static_cast<std::ptrdiff_t>((step + 1) * b));
        std::sort(got.begin(), got.end());
        std::sort(want.begin(), want.end());
        CHECK(got == want);
      }
    }
    s[0].set_epoch(0);
    std::vector<std::uint32_t> e0(s[0].permutation().begin(), s[0].permutation().end());
    s[0].set_epoch(1);
    CHECK(!std::equal(e0.begin(), e0.end(), s[0].permutation().begin()));  // a new permutation per epoch
  }
  CHECK_THROWS_AS(examples::distributed_sampler(3, 4, 0, 1), error);
  CHECK_THROWS_AS(examples::distributed_sampler(10, 2, 2, 1), error);
}
