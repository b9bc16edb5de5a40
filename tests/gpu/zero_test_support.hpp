#pragma once
// Helpers of the GPU tests of the ZeRO runtime (test_zero_cuda.cpp: the local backend on CUDA
// streams; test_zero_nccl.cpp: NCCL): the model (three trainable parameters in two units and a
// frozen one), its training loop (one step's gradients not finite on one rank, so that step is
// skipped everywhere), the optimizers swept, and the comparison of a device run with the host
// runtime's on the same inputs, with the tolerances test_zero_cuda.cpp explains.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../zero/zero_test_model.hpp"  // one_pass

#include "ringzero/zero/sharded_model.hpp"

namespace gpu_test {

/// Steps of a run, and the step at which one rank's gradient holds an infinity.
inline constexpr int zero_steps = 4, zero_overflow_step = 2;

/// The test model at `stage` on `world` ranks: float32, or bfloat16 / float16 parameters with
/// float32 master weights, the states `o` needs, `off` offloaded.
inline ringzero::zero::plan_request zero_request(int stage, ringzero::dtype type,
                                                 const ringzero::zero::optimizer_options& o,
                                                 ringzero::zero::offload off, int world) {
  using namespace ringzero::zero;
  plan_request q;
  parameter_spec a, b, c, frozen;
  a.name = "a";
  a.shape = {1037};
  b.name = "b";
  b.shape = {5, 3};
  b.unit = "second";
  c.name = "c";
  c.shape = {300, 7};
  c.unit = "second";
  frozen.name = "frozen";
  frozen.shape = {9};
  frozen.trainable = false;
  q.parameters = {a, b, c, frozen};
  q.stage = stage;
  q.world_size = world;
  if (type == ringzero::dtype::bfloat16) q.precision = precision::bfloat16_adam();
  if (type == ringzero::dtype::float16) q.precision = precision::mixed_adam();
  q.precision.optimizer_states = o.state_count();
  q.offload = off;
  return q;
}

inline float zero_initial(std::size_t p, std::size_t j) {
  return 0.5f * std::sin(0.11f * static_cast<float>(j) + static_cast<float>(p));
}

inline float zero_gradient(int rank, int step, std::size_t p, std::size_t j) {
  return std::cos(0.07f * static_cast<float>(j * (p + 1)) + 0.9f * static_cast<float>(rank) +
                  1.3f * static_cast<float>(step));
}

/// What one rank's run reports: the parameters after it, every step's result, and the loss
/// scale each step started with.
struct zero_run {
  std::vector<std::vector<float>> values;
  std::vector<ringzero::zero::step_result> steps;
  std::vector<double> scales;
};

/// A training loop of `zero_steps` steps: `write(view, values)` puts a parameter's gradient into
/// its view (host memory: assigned; device memory: an enqueued copy); at `zero_overflow_step`
/// rank `poisoned_rank` has an infinite gradient element, so that step is skipped on every rank.
/// The gradients are multiplied by the model's loss scale (1 without loss scaling).
template <class T, class Write>
zero_run zero_train(ringzero::zero::sharded_model& model, int rank, int poisoned_rank, Write write) {
  const auto& plan = model.plan();
  const auto& params = plan.parameters();
  zero_run run;
  for (std::size_t p = 0; p < params.size(); ++p) {
    std::vector<float> v(plan.placements()[p].numel);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = zero_initial(p, j);
    model.set_parameter(p, v);
  }
  for (int step = 0; step < zero_steps; ++step) {
    std::vector<std::vector<T>> staged;  // outlives the step's copies
    const float scale = static_cast<float>(model.loss_scale());
    run.scales.push_back(model.loss_scale());
    zero_test::one_pass(model, [&](std::size_t p) {
      std::vector<T> g(plan.placements()[p].numel);
      for (std::size_t j = 0; j < g.size(); ++j) g[j] = static_cast<T>(zero_gradient(rank, step, p, j) * scale);
      if (step == zero_overflow_step && rank == poisoned_rank && p == 0)
        g[3] = static_cast<T>(std::numeric_limits<float>::infinity());
      staged.push_back(std::move(g));
      write(model.gradient<T>(p), staged.back());
    });
    model.end_backward();
    run.steps.push_back(model.step());
  }
  run.values.resize(params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    run.values[p].resize(plan.placements()[p].numel);
    model.read_parameter(p, run.values[p]);
  }
  return run;
}

/// SGD with Nesterov momentum, Adam, AdamW.
inline std::vector<ringzero::zero::optimizer_options> zero_optimizers() {
  using namespace ringzero::zero;
  optimizer_options sgd;
  sgd.kind = optimizer_kind::sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  sgd.weight_decay = 0.01;
  optimizer_options adam;
  adam.kind = optimizer_kind::adam;
  adam.lr = 0.01;
  adam.weight_decay = 0.02;
  optimizer_options adamw = adam;
  adamw.kind = optimizer_kind::adamw;
  adamw.weight_decay = 0.1;
  return {sgd, adam, adamw};
}

/// The runtime's options for parameters of type T: optimizer `o`, clipping at 5 or none, and
/// for float16 dynamic loss scaling from 1024, grown after every good step.
template <class T>
ringzero::zero::sharded_model_options zero_model_options(const ringzero::zero::optimizer_options& o, bool clip) {
  ringzero::zero::sharded_model_options options;
  options.optimizer = o;
  options.max_grad_norm = clip ? 5.0 : 0.0;
  options.loss_scaling.enabled = std::is_same_v<T, ringzero::float16>;
  options.loss_scaling.initial_scale = 1024;
  options.loss_scaling.growth_interval = 1;
  return options;
}

/// How far a device run's parameters may be from the host's (test_zero_cuda.cpp's comment):
/// bitwise without clipping; with clipping a relative 1e-5, 1e-2 for 16-bit parameters.
template <class T>
double zero_tolerance(bool clip) {
  const bool low = std::is_same_v<T, ringzero::bfloat16> || std::is_same_v<T, ringzero::float16>;
  return !clip ? 0.0 : low ? 1e-2 : 1e-5;
}

/// Whether a device-path model's state lies where its plan says: in device memory
/// `device_memory()`, in pinned host memory `host_memory()`, and everything on the device
/// without offload.
inline bool zero_memory_in_use_as_planned(const ringzero::zero::sharded_model& model, ringzero::zero::offload off) {
  using ringzero::primitive::memory_space;
  const ringzero::zero::shard_plan& plan = model.plan();
  return model.memory_in_use(memory_space::device) == plan.device_memory() &&
         model.memory_in_use(memory_space::pinned_host) == plan.host_memory() &&
         (off != ringzero::zero::offload::none || plan.device_memory() == plan.memory());
}

/// Checks one rank's device run against the host runtime's on the same inputs: the same loss
/// scales (with loss scaling grown after every good step and halved at the overflow), the same
/// skipped step, norms and clip coefficients to float64 rounding, parameters within `tolerance`
/// (0: bit for bit).
inline void check_zero_run(const zero_run& device, const zero_run& host, bool clip, double tolerance,
                           bool loss_scaling) {
  CHECK(device.scales == host.scales);
  if (loss_scaling)  // grown after every good step (interval 1), halved at the overflow
    CHECK(host.scales == std::vector<double>{1024, 2048, 4096, 2048});
  REQUIRE(device.steps.size() == host.steps.size());
  for (std::size_t t = 0; t < host.steps.size(); ++t) {
    CAPTURE(t);
    const ringzero::zero::step_result& d = device.steps[t];
    const ringzero::zero::step_result& h = host.steps[t];
    CHECK(d.skipped == h.skipped);
    CHECK(d.steps == h.steps);
    CHECK(d.skipped == (static_cast<int>(t) == zero_overflow_step));
    if (d.skipped) {
      CHECK(std::isinf(d.gradient_norm));
      continue;
    }
    CHECK(std::fabs(d.gradient_norm - h.gradient_norm) <= 1e-12 * h.gradient_norm);
    CHECK(std::fabs(d.clip_coefficient - h.clip_coefficient) <= 1e-12 * h.clip_coefficient);
    if (clip) CHECK(h.clip_coefficient < 1);
  }
  for (std::size_t p = 0; p < host.values.size(); ++p) {
    CAPTURE(p);
    REQUIRE(device.values[p].size() == host.values[p].size());
    std::size_t differing = 0;
    for (std::size_t j = 0; j < host.values[p].size(); ++j) {
      const float a = device.values[p][j], b = host.values[p][j];
      if (tolerance == 0 ? std::memcmp(&a, &b, sizeof(float)) != 0
                         : !(std::fabs(a - b) <= tolerance * std::max(1.0f, std::fabs(b))))
        ++differing;
    }
    CHECK(differing == 0);
  }
}

}  // namespace gpu_test
