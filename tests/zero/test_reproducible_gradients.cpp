// Reproducible gradient accumulation in the ZeRO runtime (issue 21, part 3): a global batch of
// 8 fixed micro-batches trained at stages 0-3 on 1, 2 and 4 ranks ends with bitwise identical
// parameters (SGD with momentum and AdamW); plain mode, fed the same adversarial gradients, does
// not (so the test can fail); and the refusals.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zero_test_model.hpp"

using namespace ringzero;
using namespace ringzero::zero;
using namespace zero_test;

namespace {

/// Per parameter, its final values.
using parameters = std::vector<std::vector<float>>;

/// A factor 2^e, e from -20 to 2, with a sign, for micro-batch j and element k of storage s in
/// step t: the micro-batch gradients then span 22 binades with cancellation, so that float
/// sums in different orders (world sizes, stages) round differently.
float adversarial_scale(int j, std::size_t s, std::uint64_t k, int t) {
  const std::uint64_t h = key(j, 7, t, s, k, 5);
  const float f = std::ldexp(1.0f, static_cast<int>(h % 23) - 20);
  return (h >> 20) & 1 ? -f : f;
}

/// Trains 3 steps of a global batch of 8 micro-batches on `comm` (8 / world_size micro-batches
/// per rank and step; micro-batch m of rank r is the global micro-batch m * world_size + r) and
/// returns the final parameters. Reproducible mode: each micro-batch's gradient is added into
/// a view that starts at zero; plain mode: the trainer accumulates gradient / accumulation.
parameters train(communicator& comm, int stage, const optimizer_options& opt, bool reproducible) {
  const int n = comm.world_size();
  const int accumulation = 8 / n;
  plan_request q;
  q.parameters = test_parameters();
  q.stage = stage;
  q.accumulation_steps = accumulation;
  q.alignment_bytes = 16;
  q.precision.optimizer_states = opt.kind == optimizer_kind::sgd ? 1 : 2;
  sharded_model_options options;
  options.optimizer = opt;
  options.reproducible = reproducible;
  sharded_model model(comm, q, options);
  const auto& plan = model.plan();
  const auto& params = plan.parameters();
  const std::size_t frozen = model.index("frozen.w");
  for (std::size_t p = 0; p < params.size(); ++p) {
    std::vector<float> v(plan.placements()[p].numel);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = initial_value(plan.placements()[p].storage, j);
    model.set_parameter(p, v);
  }
  for (int t = 0; t < 3; ++t) {
    for (int m = 0; m < accumulation; ++m) {
      const int j = m * n + comm.rank();
      for (std::size_t u = 0; u < model.unit_count(); ++u) {
        model.pre_forward(u);
        model.post_forward(u);
      }
      for (std::size_t u = model.unit_count(); u-- > 0;) {
        model.pre_backward(u);
        const bool in_u1 = plan.units()[u].name == "u1";
        float frozen_sum = 0;
        if (in_u1)
          for (float x : model.parameter<float>(frozen)) frozen_sum += x;
        for (std::size_t p : plan.units()[u].members) {
          if (!params[p].trainable || plan.placements()[p].numel == 0) continue;
          const std::size_t s = plan.placements()[p].storage;
          auto w = model.parameter<float>(p);
          auto g = model.gradient<float>(p);
          for (std::size_t k = 0; k < g.size(); ++k) {
            float v = gradient_term(j, 0, t, s, k, use_of(params[p].name), w[k], frozen_sum, in_u1) *
                      adversarial_scale(j, s, k, t);
            if (!reproducible) v /= static_cast<float>(accumulation);  // exact: a power of two
            g[k] += v;
          }
        }
        model.post_backward(u);
      }
      model.end_backward();
    }
    model.step();
  }
  parameters out(params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    out[p].resize(plan.placements()[p].numel);
    model.read_parameter(p, out[p]);
  }
  return out;
}

/// Trains on `world` local ranks; checks that every rank ends with the same bits; returns them.
parameters run(int world, int stage, const optimizer_options& opt, bool reproducible) {
  std::vector<parameters> got(static_cast<std::size_t>(world));
  local::launch(world, [&](communicator& comm) {
    got[static_cast<std::size_t>(comm.rank())] = train(comm, stage, opt, reproducible);
  });
  for (int r = 1; r < world; ++r) CHECK(got[static_cast<std::size_t>(r)] == got[0]);
  return got[0];
}

bool same_bits(const parameters& a, const parameters& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t p = 0; p < a.size(); ++p) {
    if (a[p].size() != b[p].size()) return false;
    for (std::size_t k = 0; k < a[p].size(); ++k)
      if (std::bit_cast<std::uint32_t>(a[p][k]) != std::bit_cast<std::uint32_t>(b[p][k])) return false;
  }
  return true;
}

std::vector<optimizer_options> optimizers() {
  const auto all = test_optimizers();  // SGD (momentum, Nesterov), Adam, AdamW
  return {all[0], all[2]};
}

}  // namespace

TEST_CASE("reproducible: stages 0-3 on 1, 2 and 4 ranks end with bitwise identical parameters (SGD, AdamW)") {
  for (const auto& opt : optimizers()) {
    const parameters base = run(1, 0, opt, true);
    for (const auto& p : base)
      for (float x : p) REQUIRE(std::isfinite(x));
    for (int world : {1, 2, 4})
      for (int stage = 0; stage <= 3; ++stage) {
        INFO(optimizer_name(opt.kind) << ", " << world << " rank(s), stage " << stage);
        CHECK(same_bits(run(world, stage, opt, true), base));
      }
  }
}

TEST_CASE("plain mode, fed the same micro-batches, ends with different bits on different world sizes or stages") {
  for (const auto& opt : optimizers()) {
    const parameters base = run(1, 0, opt, false);
    int differing = 0;
    for (int world : {2, 4})
      for (int stage = 0; stage <= 3; ++stage) differing += same_bits(run(world, stage, opt, false), base) ? 0 : 1;
    INFO(optimizer_name(opt.kind));
    CHECK(differing > 0);  // so the reproducible test above can fail
  }
}

TEST_CASE("reproducible mode refuses clipping, hybrid sharding and ranks that disagree, on every rank") {
  auto refusals = [](int world, const std::function<void(communicator&)>& body) {
    std::vector<std::string> out(static_cast<std::size_t>(world), "no error");
    local::launch(world, [&](communicator& comm) {
      try {
        body(comm);
      } catch (const error& e) {
        out[static_cast<std::size_t>(comm.rank())] = e.kind() == errc::invalid_argument ? e.what() : "other error";
      }
    });
    return out;
  };
  auto request = [](int stage) {
    plan_request q;
    q.parameters = test_parameters();
    q.stage = stage;
    q.alignment_bytes = 16;
    return q;
  };
  for (const auto& what : refusals(2, [&](communicator& comm) {
         sharded_model_options o;
         o.reproducible = true;
         o.max_grad_norm = 1.0;
         sharded_model model(comm, request(2), o);
       })) {
    INFO(what);
    CHECK(what.find("reproducible mode cannot clip gradients") != std::string::npos);
  }
  for (const auto& what : refusals(2, [&](communicator& comm) {
         sharded_model_options o;
         o.reproducible = comm.rank() == 0;
         sharded_model model(comm, request(1), o);
       })) {
    INFO(what);
    CHECK(what.find("the ranks differ in reproducible: rank 0: true; rank 1: false") != std::string::npos);
  }
  // Hybrid sharding: 2 shard groups of 1 rank, one replica group of 2.
  {
    local::world replica(2), shard0(1), shard1(1);
    std::vector<std::string> out(2, "no error");
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        local::communicator shard_comm(r == 0 ? shard0 : shard1, 0);
        local::communicator replica_comm(replica, r);
        try {
          sharded_model_options o;
          o.reproducible = true;
          sharded_model model(shard_comm, request(1), o, &replica_comm);
        } catch (const error& e) { out[static_cast<std::size_t>(r)] = e.what(); }
      });
    for (auto& t : threads) t.join();
    for (const auto& what : out) {
      INFO(what);
      CHECK(what.find("reproducible mode does not support hybrid sharding") != std::string::npos);
    }
  }
}
