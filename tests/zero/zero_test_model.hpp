// A small synthetic model for the ZeRO runtime tests, and a plain data-parallel reference
// trainer written independently of the runtime (all_reduce average + an unsharded optimizer).
//
// The model: parameters of uneven sizes in four units, a frozen matrix, a zero-size parameter,
// a scalar, and a tied pair ("embed" in the first unit, "head" in the last). The "loss" of rank r
// in micro-batch m of step t has, for every use of a trainable parameter element w_j,
//   dL/dw_j = a * (w_j - target) + 0.05 * w_j^2 + 0.01 * (sum of the frozen matrix)  [unit u1 only]
// with a and target drawn from (r, m, t, parameter, j, use), so the gradients depend on the
// current parameters (a wrong update changes every later step) and differ by rank.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ringzero/ringzero.hpp"
#include "ringzero/zero/sharded_model.hpp"

namespace zero_test {

using ringzero::dtype;
using ringzero::zero::parameter_spec;

inline parameter_spec make_spec(std::string name, std::vector<std::uint64_t> shape, std::string unit,
                                bool trainable = true, std::string tie = {}) {
  parameter_spec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.unit = std::move(unit);
  s.trainable = trainable;
  s.tie_group = std::move(tie);
  return s;
}

/// The parameters of the test model (element types left to the precision setup).
inline std::vector<parameter_spec> test_parameters() {
  return {make_spec("embed", {7, 5}, "u0", true, "tied"),
          make_spec("l1.w", {5, 9}, "u1"),
          make_spec("l1.b", {9}, "u1"),
          make_spec("frozen.w", {3, 3}, "u1", false),
          make_spec("l2.w", {9, 4}, "u2"),
          make_spec("l2.b", {4}, "u2"),
          make_spec("scale", {}, "u2"),
          make_spec("empty", {0, 3}, "u2"),
          make_spec("head", {7, 5}, "u3", true, "tied"),
          make_spec("l3.w", {13}, "u3")};
}

inline std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

inline std::uint64_t key(int rank, int micro, int step, std::size_t param, std::uint64_t j, int use) {
  std::uint64_t h = mix(static_cast<std::uint64_t>(rank) + 1);
  h = mix(h ^ (static_cast<std::uint64_t>(micro) + 17));
  h = mix(h ^ (static_cast<std::uint64_t>(step) + 101));
  h = mix(h ^ (static_cast<std::uint64_t>(param) + 1009));
  h = mix(h ^ (j + 10007));
  return mix(h ^ static_cast<std::uint64_t>(use + 3));
}

/// Initial value of element j of parameter p (identical on every rank).
inline float initial_value(std::size_t p, std::uint64_t j) {
  return static_cast<float>(static_cast<int>((j * 7 + p * 3) % 17) - 8) / 8.0f + 0.03125f;
}

/// The gradient contribution of one use of element j of parameter p whose value is w.
inline float gradient_term(int rank, int micro, int step, std::size_t p, std::uint64_t j, int use, float w,
                           float frozen_sum, bool in_u1) {
  const std::uint64_t h = key(rank, micro, step, p, j, use);
  const float a = 0.5f + static_cast<float>(h % 64) / 64.0f;
  const float target = static_cast<float>(static_cast<int>((h >> 8) % 33) - 16) / 16.0f;
  float g = a * (w - target) + 0.05f * w * w;
  if (in_u1) g += 0.01f * frozen_sum;
  return g;
}

/// Which use a parameter is (0, or 1 for the tied alias "head").
inline int use_of(const std::string& name) { return name == "head" ? 1 : 0; }

/// How a test run trains.
struct run_config {
  int steps = 5;
  int accumulation = 1;
  double max_grad_norm = 0;
  ringzero::zero::optimizer_options optimizer;
  bool mark_ready = false;         ///< also call mark_ready for untied parameters
  bool implicit_last_end = false;  ///< let step() end the last micro-batch
  /// Every micro-batch but the last inside model.no_sync() (the plan may then accumulate fewer).
  bool no_sync = false;
  /// train_on_stream (device-sim): initial values in and results out through set_parameter_async
  /// and read_parameter_async, the trainer's buffers read and written on the streams.
  bool async_parameters = false;
  /// The parameters are already set (the trainer's memory, `adopt_parameters`): no initial values.
  bool keep_parameters = false;
  /// Called by train_sharded after each pre_forward, pre_backward and post_backward (empty: none).
  std::function<void()> between_hooks;
};

/// The optimizers the tests sweep: SGD with momentum (Nesterov), Adam with L2, AdamW.
inline std::vector<ringzero::zero::optimizer_options> test_optimizers() {
  using ringzero::zero::optimizer_kind;
  ringzero::zero::optimizer_options sgd;
  sgd.kind = optimizer_kind::sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  sgd.weight_decay = 0.01;
  ringzero::zero::optimizer_options adam;
  adam.kind = optimizer_kind::adam;
  adam.lr = 0.01;
  adam.weight_decay = 0.02;
  ringzero::zero::optimizer_options adamw = adam;
  adamw.kind = optimizer_kind::adamw;
  adamw.weight_decay = 0.1;
  return {sgd, adam, adamw};
}

/// Sets every parameter of `model` to the test model's initial values (`initial_value` of its storage).
inline void set_initial_parameters(ringzero::zero::sharded_model& model) {
  const auto& plan = model.plan();
  for (std::size_t p = 0; p < plan.parameters().size(); ++p) {
    std::vector<float> v(plan.placements()[p].numel);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = initial_value(plan.placements()[p].storage, j);
    model.set_parameter(p, v);
  }
}

/// The trainer's own memory for `adopt_parameters`: `layout.bytes` bytes at `layout.alignment`
/// (`base`), every byte `fill` to begin with.
struct trainer_memory {
  std::vector<unsigned char> raw;
  unsigned char* base = nullptr;
  trainer_memory(const ringzero::zero::adoption_layout& l, unsigned char fill) : raw(l.bytes + l.alignment, fill) {
    const auto at = reinterpret_cast<std::uintptr_t>(raw.data());
    base = raw.data() + (l.alignment - at % l.alignment) % l.alignment;
  }
  /// Parameter p's `n` elements of T in this memory.
  template <class T>
  std::vector<T> values(const ringzero::zero::adoption_layout& l, std::size_t p, std::size_t n) const {
    std::vector<T> v(n);
    if (n > 0) std::memcpy(v.data(), base + l.parameter_offset[p], n * sizeof(T));
    return v;
  }
  /// Every parameter of `plan` in this memory, as `values`.
  template <class T>
  std::vector<std::vector<T>> every_parameter(const ringzero::zero::adoption_layout& l,
                                              const ringzero::zero::shard_plan& plan) const {
    std::vector<std::vector<T>> all;
    for (std::size_t p = 0; p < plan.placements().size(); ++p)
      all.push_back(values<T>(l, p, static_cast<std::size_t>(plan.placements()[p].numel)));
    return all;
  }
};

/// Trains `model` (any stage) with the test loop and returns every parameter's final values
/// (a collective at stage 3).
inline std::vector<std::vector<float>> train_sharded(ringzero::zero::sharded_model& model, int rank,
                                                     const run_config& cfg,
                                                     std::vector<ringzero::zero::step_result>* results = nullptr) {
  const auto& plan = model.plan();
  const auto& params = plan.parameters();
  const std::size_t frozen = model.index("frozen.w");
  if (!cfg.keep_parameters) set_initial_parameters(model);
  const std::size_t units = model.unit_count();
  for (int step = 0; step < cfg.steps; ++step) {
    for (int micro = 0; micro < cfg.accumulation; ++micro) {
      std::optional<ringzero::no_sync_guard> no_sync;
      if (cfg.no_sync && micro + 1 < cfg.accumulation) no_sync.emplace(model);
      for (std::size_t u = 0; u < units; ++u) {
        model.pre_forward(u);
        if (cfg.between_hooks) cfg.between_hooks();
        for (std::size_t p : plan.units()[u].members) (void)model.parameter<float>(p);  // a forward reads its weights
        model.post_forward(u);
      }
      for (std::size_t u = units; u-- > 0;) {
        model.pre_backward(u);
        if (cfg.between_hooks) cfg.between_hooks();
        const bool in_u1 = plan.units()[u].name == "u1";
        float frozen_sum = 0;
        if (in_u1)
          for (float x : model.parameter<float>(frozen)) frozen_sum += x;
        for (std::size_t p : plan.units()[u].members) {
          if (!params[p].trainable || plan.placements()[p].numel == 0) continue;
          const std::size_t s = plan.placements()[p].storage;
          auto w = model.parameter<float>(p);
          auto g = model.gradient<float>(p);
          for (std::size_t j = 0; j < g.size(); ++j)
            g[j] += gradient_term(rank, micro, step, s, j, use_of(params[p].name), w[j], frozen_sum, in_u1);
        }
        if (cfg.mark_ready)
          for (std::size_t p : plan.units()[u].members)
            if (params[p].trainable && params[p].tie_group.empty()) model.mark_ready(p);
        model.post_backward(u);
        if (cfg.between_hooks) cfg.between_hooks();
      }
      if (!(cfg.implicit_last_end && micro == cfg.accumulation - 1)) model.end_backward();
    }
    const ringzero::zero::step_result r = model.step();
    if (results) results->push_back(r);
  }
  std::vector<std::vector<float>> out(params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    out[p].resize(plan.placements()[p].numel);
    model.read_parameter(p, out[p]);
  }
  return out;
}

/// Plain data parallelism, written without the runtime: every rank holds every parameter, sums
/// its micro-batch gradients, averages them with all_reduce, clips by the global norm and applies
/// an unsharded optimizer (float32, PyTorch's formulas). Returns every parameter's final values.
inline std::vector<std::vector<float>> train_reference(ringzero::communicator& comm,
                                                       const std::vector<parameter_spec>& specs,
                                                       const run_config& cfg) {
  using ringzero::zero::optimizer_kind;
  const std::size_t n = specs.size();
  std::vector<std::size_t> storage(n);
  for (std::size_t p = 0; p < n; ++p) {
    storage[p] = p;
    if (!specs[p].tie_group.empty())
      for (std::size_t q = 0; q < p; ++q)
        if (specs[q].tie_group == specs[p].tie_group) {
          storage[p] = q;
          break;
        }
  }
  auto numel = [&](std::size_t p) { return static_cast<std::size_t>(*specs[p].numel()); };
  std::vector<std::vector<float>> w(n), g(n), s0(n), s1(n);
  for (std::size_t p = 0; p < n; ++p) {
    w[p].resize(numel(p));
    for (std::size_t j = 0; j < w[p].size(); ++j) w[p][j] = initial_value(p, j);
    g[p].assign(numel(p), 0.0f);
    s0[p].assign(numel(p), 0.0f);
    s1[p].assign(numel(p), 0.0f);
  }
  // Units in order of first appearance, members in registration order (as the planner does).
  std::vector<std::string> unit_names;
  for (const auto& s : specs)
    if (std::find(unit_names.begin(), unit_names.end(), s.unit) == unit_names.end()) unit_names.push_back(s.unit);
  std::size_t frozen = 0;
  for (std::size_t p = 0; p < n; ++p)
    if (specs[p].name == "frozen.w") frozen = p;
  const auto& o = cfg.optimizer;
  for (int step = 0; step < cfg.steps; ++step) {
    for (int micro = 0; micro < cfg.accumulation; ++micro) {
      for (std::size_t u = unit_names.size(); u-- > 0;) {
        const bool in_u1 = unit_names[u] == "u1";
        float frozen_sum = 0;
        if (in_u1)
          for (float x : w[frozen]) frozen_sum += x;
        for (std::size_t p = 0; p < n; ++p) {
          if (specs[p].unit != unit_names[u] || !specs[p].trainable) continue;
          const std::size_t s = storage[p];
          for (std::size_t j = 0; j < w[s].size(); ++j)
            g[s][j] += gradient_term(comm.rank(), micro, step, s, j, use_of(specs[p].name), w[s][j], frozen_sum, in_u1);
        }
      }
    }
    double squares = 0;
    for (std::size_t p = 0; p < n; ++p) {
      if (storage[p] != p || !specs[p].trainable || g[p].empty()) continue;
      ringzero::all_reduce(comm, g[p].data(), g[p].data(), g[p].size(), dtype::float32, ringzero::reduce_kind::avg);
      for (float x : g[p]) squares += static_cast<double>(x) * x;
    }
    float coefficient = 1.0f;
    if (cfg.max_grad_norm > 0) {
      const double c = cfg.max_grad_norm / (std::sqrt(squares) + 1e-6);
      if (c < 1) coefficient = static_cast<float>(c);
    }
    const double t = step + 1;
    for (std::size_t p = 0; p < n; ++p) {
      if (storage[p] != p || !specs[p].trainable) continue;
      for (std::size_t j = 0; j < w[p].size(); ++j) {
        float d = g[p][j] * coefficient;
        float& x = w[p][j];
        if (o.kind == optimizer_kind::sgd) {
          d += static_cast<float>(o.weight_decay) * x;
          float& buf = s0[p][j];
          buf = step == 0 ? d : static_cast<float>(o.momentum) * buf + static_cast<float>(1 - o.dampening) * d;
          const float dir = o.nesterov ? d + static_cast<float>(o.momentum) * buf : buf;
          x -= static_cast<float>(o.lr) * dir;
        } else {
          if (o.kind == optimizer_kind::adamw)
            x = x * static_cast<float>(1 - o.lr * o.weight_decay);
          else
            d += static_cast<float>(o.weight_decay) * x;
          float& m = s0[p][j];
          float& v = s1[p][j];
          m = static_cast<float>(o.beta1) * m + static_cast<float>(1 - o.beta1) * d;
          v = static_cast<float>(o.beta2) * v + static_cast<float>(1 - o.beta2) * d * d;
          const double m_hat = m / (1 - std::pow(o.beta1, t));
          const double v_hat = v / (1 - std::pow(o.beta2, t));
          x = static_cast<float>(x - o.lr * m_hat / (std::sqrt(v_hat) + o.eps));
        }
      }
      std::fill(g[p].begin(), g[p].end(), 0.0f);
    }
  }
  std::vector<std::vector<float>> out(n);
  for (std::size_t p = 0; p < n; ++p) out[p] = w[storage[p]];
  return out;
}

/// max over elements of |a - b| / max(|b|, 1): relative error, absolute near zero.
inline double max_relative_error(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (std::size_t p = 0; p < a.size(); ++p)
    for (std::size_t j = 0; j < a[p].size(); ++j) {
      const double d =
          std::fabs(static_cast<double>(a[p][j]) - b[p][j]) / std::max(1.0, std::fabs(static_cast<double>(b[p][j])));
      if (!(d <= worst)) worst = d;  // NaN propagates
    }
  return worst;
}

/// The message of the exception in `e` (a std::exception).
inline std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) { return x.what(); }
}

/// The errc of the ringzero::error in `e`; errc::internal for any other exception.
inline ringzero::errc kind_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const ringzero::error& x) { return x.kind(); } catch (...) {
    return ringzero::errc::internal;
  }
}

/// Two step results with the same bits (norm and clip coefficient compared as bytes).
inline bool same_result(const ringzero::zero::step_result& a, const ringzero::zero::step_result& b) {
  return std::memcmp(&a.gradient_norm, &b.gradient_norm, sizeof(double)) == 0 &&
         std::memcmp(&a.clip_coefficient, &b.clip_coefficient, sizeof(double)) == 0 && a.skipped == b.skipped &&
         a.steps == b.steps;
}

/// Bitwise comparison of two parameter lists (float == is not bitwise for NaN or signed zero).
inline bool bitwise_equal(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t p = 0; p < a.size(); ++p)
    if (a[p].size() != b[p].size() ||
        (!a[p].empty() && std::memcmp(a[p].data(), b[p].data(), a[p].size() * sizeof(float)) != 0))
      return false;
  return true;
}

/// One micro-batch through every unit of `model`: pre_forward / post_forward in order, then in
/// reverse pre_backward, `add(p)` for each trainable parameter of the unit with elements, and
/// post_backward (no end_backward).
template <class F>
void one_pass(ringzero::zero::sharded_model& model, F&& add) {
  const auto& plan = model.plan();
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    model.pre_forward(u);
    model.post_forward(u);
  }
  for (std::size_t u = model.unit_count(); u-- > 0;) {
    model.pre_backward(u);
    for (std::size_t p : plan.units()[u].members)
      if (plan.parameters()[p].trainable && plan.placements()[p].numel != 0) add(p);
    model.post_backward(u);
  }
}

/// Runs `body` on `world` local ranks; returns each rank's error (kind and what()), or no kind
/// and "no error".
inline std::vector<std::pair<std::optional<ringzero::errc>, std::string>> outcomes(
    int world, const std::function<void(ringzero::communicator&)>& body) {
  std::vector<std::pair<std::optional<ringzero::errc>, std::string>> out(static_cast<std::size_t>(world),
                                                                         {std::nullopt, "no error"});
  ringzero::local::launch(world, [&](ringzero::communicator& comm) {
    try {
      body(comm);
    } catch (const ringzero::error& e) { out[static_cast<std::size_t>(comm.rank())] = {e.kind(), e.what()}; }
  });
  return out;
}

}  // namespace zero_test
