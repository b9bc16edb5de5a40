// Dynamic loss scaling (zero/loss_scaler.hpp) in zero::sharded_model: the scaler's rule
// (torch.amp.GradScaler's), refused options, and float16 training with a step that overflows:
// skipped with the parameters unchanged bit for bit, the scale halved, grown again after
// growth_interval good steps; the unscaling exact (power-of-two scales: the scaled run equals
// the unscaled one bit for bit); stages 0-3 x world sizes 1-3 on the host runtime, the device
// path on the host stream and with offload, all bitwise equal. Suite device-sim.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "zero_test_model.hpp"

using namespace ringzero;
using namespace ringzero::zero;
using namespace zero_test;

namespace {

plan_request float16_request(int stage, const optimizer_options& o, offload off = offload::none) {
  plan_request q;
  q.parameters = test_parameters();
  q.stage = stage;
  q.alignment_bytes = 16;
  q.precision = precision::mixed_adam();  // float16 parameters and gradients, float32 master weights
  q.precision.optimizer_states = o.state_count();
  q.offload = off;
  return q;
}

/// One rank's run: the final parameters, every step's result, the parameters after every step,
/// and the loss scale used by every step and the scaler's state after it.
struct scaled_run {
  std::vector<std::vector<float>> values;
  std::vector<step_result> steps;
  std::vector<std::vector<std::vector<float>>> after_step;
  std::vector<double> scale_used, scale_after;
  std::vector<std::uint64_t> good_after;
};

std::vector<std::vector<float>> read_all(sharded_model& model) {
  const auto& plan = model.plan();
  std::vector<std::vector<float>> out(plan.parameters().size());
  for (std::size_t p = 0; p < out.size(); ++p) {
    out[p].resize(plan.placements()[p].numel);
    model.read_parameter(p, out[p]);
  }
  return out;
}

/// The test model's gradient term rounded to a multiple of 2^-6 in [-4, 4]: exact in float16 at
/// every power-of-two scale used here, so that the scaled and the unscaled runs can agree bitwise.
float quantized_term(int rank, int step, std::size_t s, std::size_t j, int use, float w) {
  float t = std::nearbyint(gradient_term(rank, 0, step, s, j, use, w, 0, false) * 64.0f) / 64.0f;
  return t > 4.0f ? 4.0f : (t < -4.0f ? -4.0f : t);
}

/// Trains `model` (float16) for `steps` steps; the backward adds the quantized gradient times the
/// model's loss scale (as a trainer multiplying its loss by it would get). Step `overflow` gets a
/// gradient of 70000 x scale on the last rank, beyond float16's range (infinite). `run` executes
/// the backward arithmetic at once (host path) or enqueues it on the compute stream.
template <class Run>
scaled_run train_scaled(sharded_model& model, int rank, int world, int steps, int overflow, Run run) {
  const auto& plan = model.plan();
  const auto& params = plan.parameters();
  scaled_run out;
  set_initial_parameters(model);
  for (int step = 0; step < steps; ++step) {
    const float scale = static_cast<float>(model.loss_scale());
    out.scale_used.push_back(model.loss_scale());
    one_pass(model, [&](std::size_t p) {
      const std::span<float16> w = model.parameter<float16>(p);
      const std::span<float16> g = model.gradient<float16>(p);
      const std::size_t s = plan.placements()[p].storage;
      const int use = use_of(params[p].name);
      const bool poison = step == overflow && rank == world - 1 && params[p].name == "l1.b";
      run([=] {
        for (std::size_t j = 0; j < g.size(); ++j)
          g[j] = static_cast<float16>(static_cast<float>(g[j]) +
                                      quantized_term(rank, step, s, j, use, static_cast<float>(w[j])) * scale);
        if (poison) g[0] = static_cast<float16>(static_cast<float>(g[0]) + 70000.0f * scale);
      });
    });
    model.end_backward();
    out.steps.push_back(model.step());
    out.scale_after.push_back(model.loss_scale());
    out.good_after.push_back(model.scaler().good_steps());
    out.after_step.push_back(read_all(model));
  }
  out.values = read_all(model);
  return out;
}

sharded_model_options scaled_options(int stage, bool enabled) {
  sharded_model_options o;
  o.optimizer = test_optimizers()[static_cast<std::size_t>(stage) % 3];
  o.max_grad_norm = stage % 2 == 1 ? 0.5 : 0.0;  // clipping on the unscaled norm at odd stages
  o.loss_scaling.enabled = enabled;
  o.loss_scaling.initial_scale = 1024;
  o.loss_scaling.growth_interval = 2;
  return o;
}

bool same_runs(const scaled_run& a, const scaled_run& b) {
  if (!bitwise_equal(a.values, b.values) || a.steps.size() != b.steps.size()) return false;
  for (std::size_t t = 0; t < a.steps.size(); ++t)
    if (!same_result(a.steps[t], b.steps[t]) || !bitwise_equal(a.after_step[t], b.after_step[t])) return false;
  return true;
}

}  // namespace

TEST_CASE("loss_scaler: GradScaler's rule (backoff on overflow, growth after the interval), restore") {
  loss_scaling_options o;
  CHECK(o.initial_scale == 65536.0);
  CHECK(o.growth_factor == 2.0);
  CHECK(o.backoff_factor == 0.5);
  CHECK(o.growth_interval == 2000);
  CHECK(loss_scaler(o).scale() == 1.0);  // not enabled
  o.enabled = true;
  o.growth_interval = 3;
  loss_scaler s(o);
  CHECK(s.scale() == 65536.0);
  CHECK(s.inverse_scale() == 1.0 / 65536.0);
  s.update(false);
  s.update(false);
  CHECK(s.good_steps() == 2);
  CHECK(s.scale() == 65536.0);
  s.update(false);
  CHECK(s.scale() == 131072.0);
  CHECK(s.good_steps() == 0);
  s.update(false);
  s.update(true);
  CHECK(s.scale() == 65536.0);
  CHECK(s.good_steps() == 0);
  s.restore(std::numeric_limits<double>::max(), 2);  // a grown scale that is not finite is not taken
  s.update(false);
  CHECK(s.scale() == std::numeric_limits<double>::max());
  CHECK(s.good_steps() == 0);
  s.restore(8, 7);  // a count past the interval: the next good step grows
  CHECK(s.good_steps() == 2);
  s.update(false);
  CHECK(s.scale() == 16);
  CHECK(loss_scaler::restore_problem(0) != "");
  CHECK(loss_scaler::restore_problem(std::nan("")) != "");
  CHECK(loss_scaler::restore_problem(2) == "");
}

TEST_CASE("loss scaling: bad options are refused with invalid_argument on every rank, naming the option") {
  struct bad {
    const char* option;
    loss_scaling_options o;
  };
  std::vector<bad> cases;
  const auto with = [](auto change) {
    loss_scaling_options o;
    o.enabled = true;
    change(o);
    return o;
  };
  cases.push_back({"loss_scaling.initial_scale", with([](auto& o) { o.initial_scale = 0; })});
  cases.push_back({"loss_scaling.initial_scale", with([](auto& o) { o.initial_scale = -2; })});
  cases.push_back(
      {"loss_scaling.initial_scale", with([](auto& o) { o.initial_scale = std::numeric_limits<double>::infinity(); })});
  cases.push_back({"loss_scaling.growth_factor", with([](auto& o) { o.growth_factor = 1; })});
  cases.push_back({"loss_scaling.backoff_factor", with([](auto& o) { o.backoff_factor = 1; })});
  cases.push_back({"loss_scaling.backoff_factor", with([](auto& o) { o.backoff_factor = 0; })});
  cases.push_back({"loss_scaling.growth_interval", with([](auto& o) { o.growth_interval = 0; })});
  for (const bad& c : cases) {
    CAPTURE(c.option);
    std::vector<std::exception_ptr> errors(2);
    local::launch(2, [&](communicator& comm) {
      sharded_model_options options;
      options.loss_scaling = c.o;
      try {
        sharded_model model(comm, float16_request(1, options.optimizer), options);
      } catch (...) { errors[static_cast<std::size_t>(comm.rank())] = std::current_exception(); }
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      REQUIRE(errors[static_cast<std::size_t>(r)]);
      CHECK(kind_of(errors[static_cast<std::size_t>(r)]) == errc::invalid_argument);
      const std::string m = message_of(errors[static_cast<std::size_t>(r)]);
      CHECK(m.find(c.option) != std::string::npos);
      CHECK(m.find("rank " + std::to_string(r)) != std::string::npos);
    }
  }
  // Ranks that differ in an option: every rank names it.
  std::vector<std::exception_ptr> errors(2);
  local::launch(2, [&](communicator& comm) {
    sharded_model_options options;
    options.loss_scaling.enabled = true;
    options.loss_scaling.growth_interval = comm.rank() == 0 ? 100 : 200;
    try {
      sharded_model model(comm, float16_request(2, options.optimizer), options);
    } catch (...) { errors[static_cast<std::size_t>(comm.rank())] = std::current_exception(); }
  });
  for (int r = 0; r < 2; ++r) {
    REQUIRE(errors[static_cast<std::size_t>(r)]);
    CHECK(kind_of(errors[static_cast<std::size_t>(r)]) == errc::invalid_argument);
    CHECK(message_of(errors[static_cast<std::size_t>(r)]).find("loss_scaling.growth_interval") != std::string::npos);
  }
}

TEST_CASE(
    "loss scaling, float16: stages 0-3 x world sizes 1-3, host = device path = offload bitwise, exact unscaling") {
  // Scale 2^10, growth_interval 2, an overflow in step 1: the scales used are 1024, 1024 (overflow:
  // skipped, halved), 512, 512 (grown after 2 good steps), 1024, 1024; 2048 after the last step.
  const int steps = 6, overflow = 1;
  const std::vector<double> used{1024, 1024, 512, 512, 1024, 1024}, after{1024, 512, 512, 1024, 1024, 2048};
  const std::vector<std::uint64_t> good{1, 0, 1, 0, 1, 0};
  int runs = 0;
  for (int world = 1; world <= 3; ++world)
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(world);
      CAPTURE(stage);
      const auto n = static_cast<std::size_t>(world);
      std::vector<scaled_run> host(n), unscaled(n), device(n), offloaded(n);
      local::launch(world, [&](communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        const sharded_model_options options = scaled_options(stage, true);
        const auto at_once = [](const auto& w) { w(); };
        {
          sharded_model model(comm, float16_request(stage, options.optimizer), options);
          host[r] = train_scaled(model, comm.rank(), world, steps, overflow, at_once);
        }
        {
          const sharded_model_options plain = scaled_options(stage, false);
          sharded_model model(comm, float16_request(stage, plain.optimizer), plain);
          unscaled[r] = train_scaled(model, comm.rank(), world, steps, overflow, at_once);
        }
        for (offload off : {offload::none, offload::optimizer}) {
          primitive::host_stream compute;
          host_execution_stream stream(compute);
          sharded_model model(comm, float16_request(stage, options.optimizer, off), device_context{&stream}, options);
          (off == offload::none ? device : offloaded)[r] =
              train_scaled(model, comm.rank(), world, steps, overflow, [&](const auto& w) { compute.enqueue(w); });
          compute.synchronize();
        }
      });
      for (std::size_t r = 0; r < n; ++r) {
        CAPTURE(r);
        CHECK(host[r].scale_used == used);
        CHECK(host[r].scale_after == after);
        CHECK(host[r].good_after == good);
        CHECK(unscaled[r].scale_used == std::vector<double>(steps, 1.0));
        for (int t = 0; t < steps; ++t) {
          CAPTURE(t);
          CHECK(host[r].steps[static_cast<std::size_t>(t)].skipped == (t == overflow));
          CHECK(host[r].steps[static_cast<std::size_t>(t)].steps ==
                static_cast<std::uint64_t>(t < overflow ? t + 1 : t));
        }
        // The skipped step left every parameter as it was, bit for bit.
        CHECK(bitwise_equal(host[r].after_step[overflow], host[r].after_step[overflow - 1]));
        // Unscaling is exact: the scaled run is the unscaled run (norms, clipping, parameters).
        CHECK(same_runs(host[r], unscaled[r]));
        CHECK(same_runs(device[r], host[r]));
        CHECK(same_runs(offloaded[r], host[r]));
        CHECK(device[r].scale_after == after);
        CHECK(offloaded[r].scale_after == after);
        CHECK(offloaded[r].good_after == good);
        CHECK(bitwise_equal(host[r].values, host[0].values));
      }
      // The model trained: the last parameters differ from the first step's.
      CHECK(!bitwise_equal(host[0].values, host[0].after_step[0]));
      ++runs;
    }
  CHECK(runs == 12);
}
