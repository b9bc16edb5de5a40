// The ZeRO runtime's device path on CUDA streams: 2 ranks of the local backend sharing one GPU,
// stages 0-3, the state in device memory (allocations equal the plan), the optimizer step
// (SGD with Nesterov momentum, Adam, AdamW; float32, and bfloat16 with float32 master weights),
// clipping and the non-finite check as CUDA kernels, against the host runtime on the same
// inputs. Tolerance: the update kernel runs the host's float32 operations unfused
// (zero/shard_update.hpp), so with the same clip coefficient the parameters are bitwise the
// host's; the float64 sum of squares adds in another order (a block reduction), so the norm
// agrees to float64 rounding (relative 1e-12 here) and a clipped step may see a float32 clip
// coefficient one ulp apart, which moves a parameter by a few float32 ulps per step: with
// clipping on, parameters agree to a relative 1e-5 (1e-2 for bfloat16, a few bfloat16 ulps).
// With CPU offload (offload::optimizer): master weights and optimizer states in pinned host
// memory, the update on the CPU ordered against the communication stream by events and host
// functions (zero/sharded_model_offload.hpp); the same tolerances, the device and pinned
// allocations equal to the plan's device_memory() and host_memory().
// float16 with dynamic loss scaling (zero/loss_scaler.hpp): the scale, read on the host at the
// step's wait, follows the host runtime's (halved at the overflow), the update the same way.
// Skipped without a device (suite 'gpu').
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ringzero/backend/local/cuda.hpp"
#include "ringzero/primitive/cuda_stream.hpp"
#include "ringzero/ringzero.hpp"
#include "ringzero/zero/cuda_execution_stream.hpp"
#include "ringzero/zero/sharded_model.hpp"

using namespace ringzero;
using namespace ringzero::zero;

namespace {

constexpr int world = 2, steps = 4, overflow_step = 2;

plan_request request(int stage, dtype type, const optimizer_options& o, offload off) {
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
  if (type == dtype::bfloat16) q.precision = precision::bfloat16_adam();
  if (type == dtype::float16) q.precision = precision::mixed_adam();
  q.precision.optimizer_states = o.state_count();
  q.offload = off;
  return q;
}

float initial(std::size_t p, std::size_t j) {
  return 0.5f * std::sin(0.11f * static_cast<float>(j) + static_cast<float>(p));
}

float gradient(int rank, int step, std::size_t p, std::size_t j) {
  return std::cos(0.07f * static_cast<float>(j * (p + 1)) + 0.9f * static_cast<float>(rank) +
                  1.3f * static_cast<float>(step));
}

/// A training loop of `steps` steps: `write(view, values)` puts a parameter's gradient into its
/// view (host memory: assigned; device memory: an enqueued copy); at `overflow_step` rank 1 has
/// an infinite gradient element, so that step is skipped on every rank. The gradients are
/// multiplied by the model's loss scale (1 without loss scaling), which `scales` records per step.
template <class T, class Write>
std::vector<std::vector<float>> train(sharded_model& model, int rank, Write write, std::vector<step_result>& results,
                                      std::vector<double>& scales) {
  const auto& plan = model.plan();
  const auto& params = plan.parameters();
  for (std::size_t p = 0; p < params.size(); ++p) {
    std::vector<float> v(plan.placements()[p].numel);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = initial(p, j);
    model.set_parameter(p, v);
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<T>> staged;  // outlives the step's copies
    const float scale = static_cast<float>(model.loss_scale());
    scales.push_back(model.loss_scale());
    for (std::size_t u = 0; u < model.unit_count(); ++u) {
      model.pre_forward(u);
      model.post_forward(u);
    }
    for (std::size_t u = model.unit_count(); u-- > 0;) {
      model.pre_backward(u);
      for (std::size_t p : plan.units()[u].members) {
        if (!params[p].trainable || plan.placements()[p].numel == 0) continue;
        std::vector<T> g(plan.placements()[p].numel);
        for (std::size_t j = 0; j < g.size(); ++j) g[j] = static_cast<T>(gradient(rank, step, p, j) * scale);
        if (step == overflow_step && rank == 1 && p == 0) g[3] = static_cast<T>(std::numeric_limits<float>::infinity());
        staged.push_back(std::move(g));
        write(model.gradient<T>(p), staged.back());
      }
      model.post_backward(u);
    }
    model.end_backward();
    results.push_back(model.step());
  }
  std::vector<std::vector<float>> out(params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    out[p].resize(plan.placements()[p].numel);
    model.read_parameter(p, out[p]);
  }
  return out;
}

std::vector<optimizer_options> optimizers() {
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

template <class T>
void compare_with_host(int stage, bool clip, const optimizer_options& o, offload off = offload::none) {
  const bool bf16 = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;
  sharded_model_options options;
  options.optimizer = o;
  options.max_grad_norm = clip ? 5.0 : 0.0;
  options.loss_scaling.enabled = std::is_same_v<T, float16>;
  options.loss_scaling.initial_scale = 1024;
  options.loss_scaling.growth_interval = 1;
  plan_request q = request(stage, dtype_of<T>, o, off);
  q.offload = offload::none;  // the host runtime keeps everything in host memory already
  plan_request qd = q;
  qd.offload = off;
  std::vector<std::vector<std::vector<float>>> host(world), device(world);
  std::vector<std::vector<step_result>> host_steps(world), device_steps(world);
  std::vector<std::vector<double>> host_scales(world), device_scales(world);
  std::vector<int> memory_matches(world, 0);
  local::launch(world, [&](communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    sharded_model model(comm, q, options);
    host[r] = train<T>(
        model, comm.rank(),
        [](std::span<T> to, const std::vector<T>& from) {
          for (std::size_t j = 0; j < to.size(); ++j) to[j] = from[j];
        },
        host_steps[r], host_scales[r]);
  });
  local::cuda_launch_options launch;
  launch.devices = {0};
  local::launch_cuda(
      world,
      [&](local::cuda_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        primitive::cuda_stream compute(comm.cuda_device());
        cuda_execution_stream stream(compute);
        sharded_model model(comm, qd, device_context{&stream}, options);
        const shard_plan& plan = model.plan();
        memory_matches[r] = model.memory_in_use(primitive::memory_space::device) == plan.device_memory() &&
                                    model.memory_in_use(primitive::memory_space::pinned_host) == plan.host_memory() &&
                                    (off != offload::none || plan.device_memory() == plan.memory())
                                ? 1
                                : 0;
        device[r] = train<T>(
            model, comm.rank(),
            [&](std::span<T> to, const std::vector<T>& from) {  // `from` outlives the step
              primitive::enqueue_copy(compute, to.data(), from.data(), to.size_bytes());
            },
            device_steps[r], device_scales[r]);
        compute.synchronize();
      },
      launch);
  const double tolerance = !clip ? 0.0 : bf16 ? 1e-2 : 1e-5;
  for (std::size_t r = 0; r < static_cast<std::size_t>(world); ++r) {
    CAPTURE(r);
    CHECK(memory_matches[r] == 1);
    CHECK(device_scales[r] == host_scales[r]);
    if (options.loss_scaling.enabled)  // grown after every good step (interval 1), halved at the overflow
      CHECK(host_scales[r] == std::vector<double>{1024, 2048, 4096, 2048});
    REQUIRE(device_steps[r].size() == host_steps[r].size());
    for (std::size_t t = 0; t < host_steps[r].size(); ++t) {
      CAPTURE(t);
      const step_result& d = device_steps[r][t];
      const step_result& h = host_steps[r][t];
      CHECK(d.skipped == h.skipped);
      CHECK(d.steps == h.steps);
      CHECK(d.skipped == (static_cast<int>(t) == overflow_step));
      if (d.skipped) {
        CHECK(std::isinf(d.gradient_norm));
        continue;
      }
      CHECK(std::fabs(d.gradient_norm - h.gradient_norm) <= 1e-12 * h.gradient_norm);
      CHECK(std::fabs(d.clip_coefficient - h.clip_coefficient) <= 1e-12 * h.clip_coefficient);
      if (clip) CHECK(h.clip_coefficient < 1);
    }
    for (std::size_t p = 0; p < host[r].size(); ++p) {
      CAPTURE(p);
      REQUIRE(device[r][p].size() == host[r][p].size());
      std::size_t differing = 0;
      for (std::size_t j = 0; j < host[r][p].size(); ++j) {
        const float a = device[r][p][j], b = host[r][p][j];
        if (tolerance == 0 ? std::memcmp(&a, &b, sizeof(float)) != 0
                           : !(std::fabs(a - b) <= tolerance * std::max(1.0f, std::fabs(b))))
          ++differing;
      }
      CHECK(differing == 0);
    }
  }
}

}  // namespace

TEST_CASE("device path on CUDA: stages 0-3, the optimizer step as kernels, against the host runtime") {
  const auto all = optimizers();
  for (int stage = 0; stage <= 3; ++stage)
    for (std::size_t k = 0; k < all.size(); ++k) {
      CAPTURE(stage);
      CAPTURE(optimizer_name(all[k].kind));
      const bool clip = (stage + static_cast<int>(k)) % 2 == 1;
      CAPTURE(clip);
      compare_with_host<float>(stage, clip, all[k]);
      compare_with_host<bfloat16>(stage, !clip, all[k]);
      compare_with_host<float16>(stage, clip, all[k]);
    }
}

TEST_CASE("device path on CUDA with CPU offload: stages 0-3, the update on the CPU, against the host runtime") {
  const auto all = optimizers();
  for (int stage = 0; stage <= 3; ++stage)
    for (std::size_t k = 0; k < all.size(); ++k) {
      CAPTURE(stage);
      CAPTURE(optimizer_name(all[k].kind));
      const bool clip = (stage + static_cast<int>(k)) % 2 == 0;
      CAPTURE(clip);
      compare_with_host<float>(stage, clip, all[k], offload::optimizer);
      compare_with_host<bfloat16>(stage, !clip, all[k], offload::optimizer);
      compare_with_host<float16>(stage, clip, all[k], offload::optimizer);
    }
}
