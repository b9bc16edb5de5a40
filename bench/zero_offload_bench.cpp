// ringzero-zero-offload-bench: the extra step time of CPU offload (offload::optimizer, and at
// stage 3 also offload::parameters, row "3 params") on the
// ZeRO runtime's device path over the host stream (the simulated device of CI), against the same
// run without offload. Model: the MLP of examples/02 (784-512-512-256-256-128-10, one gather unit
// per layer), parameters bfloat16 with float32 master weights and Adam (or float32 with --fp32).
// Each iteration: forward hooks, a backward that adds a gradient on the compute stream, step().
// Reported per stage and offload: the median wall time of an iteration and of step() alone (ms)
// over --steps iterations after --warmup, and offload's extra time per iteration.
//   build-release/bench/ringzero-zero-offload-bench --ranks 2 --steps 50
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "ringzero/ringzero.hpp"

namespace {

using namespace ringzero;
using namespace ringzero::zero;
using clock_type = std::chrono::steady_clock;

struct timing {
  double iteration_ms = 0, step_ms = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<parameter_spec> mlp(const std::vector<std::uint64_t>& widths) {
  std::vector<parameter_spec> p;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    const std::string unit = "layer" + std::to_string(l);
    parameter_spec w, b;
    w.name = unit + ".weight";
    w.shape = {widths[l + 1], widths[l]};
    w.unit = unit;
    b.name = unit + ".bias";
    b.shape = {widths[l + 1]};
    b.unit = unit;
    p.push_back(w);
    p.push_back(b);
  }
  return p;
}

template <class T>
timing run(int ranks, int stage, bool fp32, offload off, int warmup, int steps) {
  std::vector<timing> per_rank(static_cast<std::size_t>(ranks));
  local::launch(ranks, [&](communicator& comm) {
    plan_request q;
    q.parameters = mlp({784, 512, 512, 256, 256, 128, 10});
    q.stage = stage;
    q.precision = fp32 ? precision::float32_adam() : precision::bfloat16_adam();
    q.offload = off;
    sharded_model_options options;
    options.optimizer.kind = optimizer_kind::adam;
    options.optimizer.lr = 1e-3;
    primitive::host_stream compute;
    host_execution_stream stream(compute);
    sharded_model model(comm, q, device_context{&stream}, options);
    for (std::size_t p = 0; p < model.parameter_count(); ++p) {
      std::vector<float> v(model.plan().placements()[p].numel);
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>((j * 7 + p) % 13) / 64.0f - 0.1f;
      model.set_parameter(p, v);
    }
    std::vector<double> iterations, step_times;
    for (int i = 0; i < warmup + steps; ++i) {
      const auto begin = clock_type::now();
      for (std::size_t u = 0; u < model.unit_count(); ++u) {
        model.pre_forward(u);
        model.post_forward(u);
      }
      for (std::size_t u = model.unit_count(); u-- > 0;) {
        model.pre_backward(u);
        for (std::size_t p : model.plan().units()[u].members) {
          const std::span<T> w = model.parameter<T>(p);
          const std::span<T> g = model.gradient<T>(p);
          compute.enqueue([w, g] {
            for (std::size_t j = 0; j < g.size(); ++j)
              g[j] = static_cast<T>(static_cast<float>(g[j]) + 0.01f * static_cast<float>(w[j]) + 0.001f);
          });
        }
        model.post_backward(u);
      }
      model.end_backward();
      const auto before_step = clock_type::now();
      (void)model.step();
      const auto end = clock_type::now();
      if (i >= warmup) {
        iterations.push_back(std::chrono::duration<double, std::milli>(end - begin).count());
        step_times.push_back(std::chrono::duration<double, std::milli>(end - before_step).count());
      }
    }
    compute.synchronize();
    per_rank[static_cast<std::size_t>(comm.rank())] = {median(iterations), median(step_times)};
  });
  timing slowest;
  for (const timing& t : per_rank) {
    slowest.iteration_ms = std::max(slowest.iteration_ms, t.iteration_ms);
    slowest.step_ms = std::max(slowest.step_ms, t.step_ms);
  }
  return slowest;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringzero-zero-offload-bench: CPU offload's extra step time on the host stream"};
  int ranks = 2, steps = 50, warmup = 5;
  bool fp32 = false;
  std::vector<int> stages{0, 1, 2, 3};
  app.add_option("--ranks", ranks, "Ranks (threads)")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--steps", steps, "Timed iterations")->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", warmup, "Untimed iterations first")->capture_default_str()->check(CLI::Range(0, 1000000));
  app.add_option("--stages", stages, "ZeRO stages")->check(CLI::Range(0, 3));
  app.add_flag("--fp32", fp32, "float32 parameters and gradients (no master weights)");
  CLI11_PARSE(app, argc, argv);
  fmt::print("# {} ranks, {} parameters, Adam, {} timed iterations (median, slowest rank)\n", ranks,
             fp32 ? "float32" : "bfloat16 (float32 master)", steps);
  fmt::print("{:>6} {:>16} {:>16} {:>16} {:>16} {:>14}\n", "stage", "iteration (ms)", "step (ms)", "offload it. (ms)",
             "offload step", "extra (ms)");
  for (int stage : stages) {
    const auto go = [&](offload off) {
      return fp32 ? run<float>(ranks, stage, true, off, warmup, steps)
                  : run<bfloat16>(ranks, stage, false, off, warmup, steps);
    };
    const timing plain = go(offload::none), off = go(offload::optimizer);
    fmt::print("{:>6} {:>16.3f} {:>16.3f} {:>16.3f} {:>16.3f} {:>+14.3f}\n", stage, plain.iteration_ms, plain.step_ms,
               off.iteration_ms, off.step_ms, off.iteration_ms - plain.iteration_ms);
    if (stage == 3) {  // the shards in host memory too: on the host stream, copies into the gather buffers
      const timing params = go(offload::parameters);
      fmt::print("{:>6} {:>16.3f} {:>16.3f} {:>16.3f} {:>16.3f} {:>+14.3f}\n", "3 params", plain.iteration_ms,
                 plain.step_ms, params.iteration_ms, params.step_ms, params.iteration_ms - plain.iteration_ms);
    }
  }
  return 0;
}
