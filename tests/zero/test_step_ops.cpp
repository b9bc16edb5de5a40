// The optimizer step's stream operations on the host stream (zero/execution_stream.hpp): the
// float64 sum of squares accumulates exactly the host loop's per-buffer sum, the decision
// follows the non-finite check and clip formula, and the shard update is bitwise the host
// optimizer's (apply_update, sharded_optimizer::update) for every optimizer and dtype pairing,
// nothing when the decision says skipped. Values small enough to check by hand are exact.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ringzero/core/half.hpp"
#include "ringzero/primitive/host_stream.hpp"
#include "ringzero/zero/execution_stream.hpp"
#include "ringzero/zero/shard_update.hpp"
#include "ringzero/zero/sharded_optimizer.hpp"

using namespace ringzero;
using namespace ringzero::zero;

namespace {

optimizer_options options_of(optimizer_kind kind) {
  optimizer_options o;
  o.kind = kind;
  o.lr = kind == optimizer_kind::sgd ? 0.05 : 0.01;
  o.weight_decay = kind == optimizer_kind::adamw ? 0.1 : 0.02;
  if (kind == optimizer_kind::sgd) {
    o.momentum = 0.9;
    o.nesterov = true;
  }
  return o;
}

template <class T>
std::vector<T> sample(std::size_t n, float scale, float shift) {
  std::vector<T> v(n);
  for (std::size_t j = 0; j < n; ++j) v[j] = static_cast<T>(scale * std::sin(0.37f * static_cast<float>(j) + shift));
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("step operations on the host stream: the sum of squares adds the buffer's sum") {
  host_execution_stream s(primitive::host_stream_options{});
  double sum = 0.5;
  const std::vector<float> a{1, 2, 3, -4};
  const std::vector<bfloat16> b{bfloat16(0.5f), bfloat16(1.5f)};
  const std::vector<float16> c{float16(3.0f)};
  s.add_sum_of_squares(&sum, a.data(), a.size(), dtype::float32);
  s.add_sum_of_squares(&sum, b.data(), b.size(), dtype::bfloat16);
  s.add_sum_of_squares(&sum, c.data(), c.size(), dtype::float16);
  s.add_sum_of_squares(&sum, nullptr, 0, dtype::float32);
  s.synchronize();
  CHECK(sum == 0.5 + 30 + 2.5 + 9);

  // Not exactly representable: the per-buffer sum first, then added (the host runtime's order).
  const std::vector<float> x = sample<float>(1001, 1.7f, 0.3f), y = sample<float>(77, 0.01f, 1.0f);
  double total = 0;
  s.add_sum_of_squares(&total, x.data(), x.size(), dtype::float32);
  s.add_sum_of_squares(&total, y.data(), y.size(), dtype::float32);
  s.synchronize();
  double ex = 0, ey = 0;
  for (float v : x) ex += static_cast<double>(v) * static_cast<double>(v);
  for (float v : y) ey += static_cast<double>(v) * static_cast<double>(v);
  const double expected = 0 + ex + ey;
  CHECK(std::memcmp(&total, &expected, sizeof(double)) == 0);
}

TEST_CASE("step operations on the host stream: the decision (non-finite check, clip coefficient)") {
  host_execution_stream s(primitive::host_stream_options{});
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const auto decide = [&](double squares, double max_grad_norm, bool skip) {
    step_scalars v;
    v.squares = squares;
    v.clip_coefficient = 7;  // overwritten
    v.skipped = 5;           // overwritten
    s.decide_step(&v, max_grad_norm, skip);
    s.synchronize();
    return v;
  };
  step_scalars v = decide(16, 2, true);
  CHECK(v.gradient_norm == 4);
  CHECK(v.clip_coefficient == 2 / (4 + 1e-6));
  CHECK(v.skipped == 0);
  v = decide(16, 10, true);
  CHECK(v.clip_coefficient == 1);
  v = decide(16, 0, true);
  CHECK(v.clip_coefficient == 1);
  v = decide(inf, 1, true);
  CHECK(std::isinf(v.gradient_norm));
  CHECK(v.skipped == 1);
  CHECK(v.clip_coefficient == 1);
  v = decide(inf, 1, false);  // applied anyway: max / inf = 0
  CHECK(v.skipped == 0);
  CHECK(v.clip_coefficient == 0);
  v = decide(nan, 1, false);  // NaN < 1 is false: not clipped
  CHECK(std::isnan(v.gradient_norm));
  CHECK(v.skipped == 0);
  CHECK(v.clip_coefficient == 1);
  v = decide(nan, 1, true);
  CHECK(v.skipped == 1);
}

TEST_CASE("step operations on the host stream: the decision unscales (loss scale 2^10) exactly") {
  host_execution_stream s(primitive::host_stream_options{});
  const auto decide = [&](double squares, double inverse_scale, double max_grad_norm) {
    step_scalars v;
    v.squares = squares;
    v.inverse_scale = inverse_scale;
    v.gradient_multiplier = 7;  // overwritten
    s.decide_step(&v, max_grad_norm, true);
    s.synchronize();
    return v;
  };
  // Gradients scaled by 2^10 whose unscaled norm is 4: squares 16 * 2^20.
  step_scalars v = decide(16.0 * 1048576.0, 1.0 / 1024, 0);
  CHECK(v.gradient_norm == 4);
  CHECK(v.clip_coefficient == 1);
  CHECK(v.gradient_multiplier == 1.0 / 1024);
  v = decide(16.0 * 1048576.0, 1.0 / 1024, 2);  // clipped on the unscaled norm
  CHECK(v.gradient_norm == 4);
  CHECK(v.clip_coefficient == 2 / (4 + 1e-6));
  CHECK(v.gradient_multiplier == (2 / (4 + 1e-6)) * (1.0 / 1024));
  v = decide(std::numeric_limits<double>::infinity(), 1.0 / 1024, 2);
  CHECK(v.skipped == 1);
  CHECK(v.gradient_multiplier == 1.0 / 1024);
  v = decide(16, 1, 0);  // without loss scaling the multiplier is the clip coefficient
  CHECK(v.gradient_multiplier == 1);
}

TEST_CASE("step operations on the host stream: SGD with momentum by hand; a skipped decision updates nothing") {
  host_execution_stream s(primitive::host_stream_options{});
  optimizer_options o;
  o.kind = optimizer_kind::sgd;
  o.lr = 0.5;
  o.momentum = 0.5;
  std::vector<float> w{1, 2}, g{1, -2}, b{0, 0};
  step_scalars scalars;  // not skipped, clip 1
  for (std::uint64_t step = 1; step <= 2; ++step) {
    shard_update u;
    u.rule = zero::detail::make_update_rule(o, step);
    u.params = w.data();
    u.grads = g.data();
    u.s0 = b.data();
    u.count = w.size();
    s.update_shard(u, &scalars);
  }
  s.synchronize();
  // Step 1: b = g, w -= 0.5 g; step 2: b = 0.5 b + g = 1.5 g, w -= 0.75 g.
  CHECK(w == std::vector<float>{-0.25f, 4.5f});
  CHECK(b == std::vector<float>{1.5f, -3.0f});

  // Multiplier 0.5 from the decision (clip x unscale); then a skipped decision leaves everything as it was.
  scalars.gradient_multiplier = 0.5;
  shard_update u;
  u.rule = zero::detail::make_update_rule(o, 3);
  u.params = w.data();
  u.grads = g.data();
  u.s0 = b.data();
  u.count = w.size();
  s.update_shard(u, &scalars);  // b = 0.75 + 0.5 = 1.25 (x g), w -= 0.625 g
  s.synchronize();
  CHECK(w == std::vector<float>{-0.875f, 5.75f});
  CHECK(b == std::vector<float>{1.25f, -2.5f});
  scalars.skipped = 1;
  s.update_shard(u, &scalars);
  s.synchronize();
  CHECK(w == std::vector<float>{-0.875f, 5.75f});
  CHECK(b == std::vector<float>{1.25f, -2.5f});
}

TEST_CASE_TEMPLATE("step operations on the host stream: the update is bitwise apply_update, every optimizer", G, float,
                   bfloat16, float16) {
  for (optimizer_kind kind : {optimizer_kind::sgd, optimizer_kind::adam, optimizer_kind::adamw}) {
    CAPTURE(optimizer_name(kind));
    const optimizer_options o = options_of(kind);
    const std::size_t n = 333;
    const std::vector<G> g = sample<G>(n, 2.5f, 0.1f);
    std::vector<float> w = sample<float>(n, 1.0f, 2.0f), s0(n), s1(n);
    std::vector<float> rw = w, r0(n), r1(n);
    std::vector<bfloat16> p(n);  // the 16-bit parameters written back from the master copy
    host_execution_stream s(primitive::host_stream_options{});
    step_scalars scalars;
    scalars.gradient_multiplier = 0.3;
    for (std::uint64_t step = 1; step <= 3; ++step) {
      shard_update u;
      u.rule = zero::detail::make_update_rule(o, step);
      u.params = p.data();
      u.param_type = dtype::bfloat16;
      u.grads = g.data();
      u.gradient_type = dtype_of<G>;
      u.master = w.data();
      u.s0 = s0.data();
      u.s1 = s1.data();
      u.count = n;
      s.update_shard(u, &scalars);
      zero::detail::apply_update(o, step, rw.data(), g.data(), static_cast<float>(0.3), r0.data(), r1.data(), n);
    }
    s.synchronize();
    CHECK(same_bits(w, rw));
    CHECK(same_bits(s0, r0));
    if (kind != optimizer_kind::sgd) CHECK(same_bits(s1, r1));
    bool written_back = true;
    for (std::size_t j = 0; j < n; ++j) written_back = written_back && p[j].bits == static_cast<bfloat16>(rw[j]).bits;
    CHECK(written_back);
  }
}

TEST_CASE("step operations: sharded_optimizer::describe on the host stream is bitwise sharded_optimizer::update") {
  for (optimizer_kind kind : {optimizer_kind::sgd, optimizer_kind::adam, optimizer_kind::adamw}) {
    CAPTURE(optimizer_name(kind));
    const optimizer_options o = options_of(kind);
    plan_request q;
    parameter_spec a;
    a.name = "a";
    a.shape = {101};
    q.parameters = {a};
    q.world_size = 2;
    q.stage = 1;
    q.precision.optimizer_states = o.state_count();
    const shard_plan plan(q);
    sharded_optimizer direct(plan, 1, o), streamed(plan, 1, o);
    const std::uint64_t count = direct.owned_range(0).size();
    REQUIRE(count > 0);
    std::vector<float> pd = sample<float>(count, 1.0f, 0.5f), ps = pd;
    host_execution_stream s(primitive::host_stream_options{});
    step_scalars scalars;
    scalars.gradient_multiplier = 0.75;
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> g = sample<float>(count, 1.5f, static_cast<float>(step));
      direct.begin_step();
      direct.update(0, pd.data(), g.data(), 0.75f);
      s.update_shard(streamed.describe(0, ps.data(), g.data(), streamed.steps() + 1), &scalars);
      s.synchronize();
      streamed.begin_step();
    }
    CHECK(same_bits(pd, ps));
    for (int k = 0; k < o.state_count(); ++k)
      CHECK(std::memcmp(direct.state(0, k), streamed.state(0, k), count * sizeof(float)) == 0);
  }
}
