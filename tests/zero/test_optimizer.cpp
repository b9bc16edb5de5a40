// The optimizer options (zero/optimizer.hpp): values that do not survive conversion to float32,
// betas that round to 1, and factors that overflow are refused with the option and the value
// named; the limits themselves are accepted and update exactly; `set_learning_rate` applies the
// same rules and keeps the old rate when it refuses.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ringzero/zero/optimizer.hpp"
#include "ringzero/zero/shard_plan.hpp"
#include "ringzero/zero/sharded_optimizer.hpp"

using namespace ringzero;
using namespace ringzero::zero;

namespace {

constexpr double float_max = std::numeric_limits<float>::max();
constexpr double float_min = std::numeric_limits<float>::min();

/// What problem() appends to a value that is not representable as a float32.
const std::string float_range =
    " is not representable as a float32 (the optimizer computes in float32: a value must be 0 or round to a magnitude "
    "from "
    "1.1754943508222875e-38 to 3.4028234663852886e+38)";

optimizer_options sgd(double lr) {
  optimizer_options o;
  o.kind = optimizer_kind::sgd;
  o.lr = lr;
  return o;
}

optimizer_options adam(optimizer_kind kind = optimizer_kind::adam) {
  optimizer_options o;
  o.kind = kind;
  return o;
}

/// A one-parameter plan of `numel` float32 elements on one rank, with `options`' state count.
shard_plan one_parameter_plan(const optimizer_options& options, std::uint64_t numel) {
  plan_request q;
  parameter_spec p;
  p.name = "w";
  p.shape = {numel};
  q.parameters = {p};
  q.precision.optimizer_states = options.state_count();
  return shard_plan(q);
}

}  // namespace

TEST_CASE("optimizer options that do not survive conversion to float32 are refused, naming the option and value") {
  struct refusal {
    optimizer_options options;
    std::string message;
  };
  std::vector<refusal> cases;
  auto add = [&](optimizer_options o, std::string message) { cases.push_back({o, std::move(message)}); };
  add(sgd(1e39), "learning rate 1e+39" + float_range);   // inf as a float32
  add(sgd(1e-46), "learning rate 1e-46" + float_range);  // 0 as a float32
  add(sgd(1e-40), "learning rate 1e-40" + float_range);  // subnormal as a float32
  add(sgd(std::nan("")), "learning rate must be finite and >= 0, got nan");
  {
    optimizer_options o = sgd(0.1);
    o.weight_decay = 1e39;
    add(o, "weight decay 1e+39" + float_range);
    o.weight_decay = 1e-45;
    add(o, "weight decay 1e-45" + float_range);
  }
  {
    optimizer_options o = sgd(0.1);
    o.momentum = 1e39;
    add(o, "momentum 1e+39" + float_range);
    o.momentum = 0.9;
    o.dampening = -1e39;
    add(o, "dampening -1e+39" + float_range);
  }
  {
    optimizer_options o = adam();
    o.eps = 1e-46;  // a zero gradient would give 0 / 0
    add(o, "eps 1e-46" + float_range);
    o.eps = 1e-39;
    add(o, "eps 1e-39" + float_range);
    o.eps = 0;
    add(o, "eps must be finite and > 0, got 0");
  }
  {
    optimizer_options o = adam();
    o.beta1 = 0.99999999;
    add(o, "beta1 0.99999999 rounds to 1 as a float32 (the largest usable beta is 0.9999999403953552)");
    o.beta1 = 0.9;
    o.beta2 = 1.0 - 0x1p-25;  // halfway between 1 - 2^-24 and 1: rounds to 1 (to even)
    add(o, "beta2 0.9999999701976776 rounds to 1 as a float32 (the largest usable beta is 0.9999999403953552)");
    o.beta2 = 1e-40;
    add(o, "beta2 1e-40" + float_range);
  }
  {
    optimizer_options o = adam();
    o.lr = 3e38;  // finite as a float32, but the first step size lr / (1 - 0.9) is not
    add(o,
        "learning rate 3e+38 / (1 - beta1 0.9) = 3.0000000000000006e+39, the first step size, is not representable as "
        "a "
        "float32 (the optimizer computes in float32: a value must be 0 or round to a magnitude from "
        "1.1754943508222875e-38 to "
        "3.4028234663852886e+38)");
  }
  {
    optimizer_options o = adam(optimizer_kind::adamw);
    o.weight_decay = 1e39;
    add(o, "weight decay 1e+39" + float_range);
    o.lr = 0.5;
    o.weight_decay = 2.5;
    add(o,
        "learning rate 0.5 x weight decay 2.5 = 1.25 is above 1: AdamW multiplies the weights by 1 - lr x "
        "weight_decay, "
        "which must be in [0, 1]");
  }
  for (const refusal& r : cases) {
    CAPTURE(r.message);
    CHECK(r.options.problem() == r.message);
  }
}

TEST_CASE("optimizer options at float32's limits are accepted") {
  // Values that round to FLT_MIN / FLT_MAX count as those (the decimals <float.h> prints).
  for (double lr : {0.0, float_min, float_max, 1.17549435e-38, 3.4028235e38, std::nextafter(0x1.ffffffp127, 0.0)}) {
    CAPTURE(lr);
    CHECK(sgd(lr).problem() == "");
    optimizer_options o = sgd(0.1);
    o.weight_decay = lr;
    o.momentum = lr;
    o.dampening = -lr;
    CHECK(o.problem() == "");
  }
  optimizer_options o = adam();
  o.eps = float_min;
  o.beta1 = 1.0 - 0x1p-24;  // the largest float32 below 1
  o.beta2 = 1.0 - 0x1p-24;
  CHECK(o.problem() == "");
  o.beta1 = 0;
  o.lr = float_max;  // lr / (1 - 0) = FLT_MAX
  CHECK(o.problem() == "");
  o = adam(optimizer_kind::adamw);
  o.lr = 0.5;
  o.weight_decay = 2;  // the decay factor 1 - lr x weight_decay is 0
  CHECK(o.problem() == "");
}

TEST_CASE("updates at the accepted limits are exact: no NaN from a zero gradient, AdamW's factor 0 zeroes") {
  const std::vector<float> zero_gradient(3, 0.0f);
  std::vector<float> m(3, 0.0f), v(3, 0.0f);
  SUBCASE("Adam with eps 2^-126 and zero gradients leaves the weights as they are") {
    optimizer_options o = adam();
    o.eps = float_min;
    REQUIRE(o.problem() == "");
    std::vector<float> w = {1.0f, -2.0f, 0.5f};
    for (std::uint64_t step = 1; step <= 3; ++step)
      zero::detail::apply_update(o, step, w.data(), zero_gradient.data(), 1.0f, m.data(), v.data(), w.size());
    CHECK(w == std::vector<float>{1.0f, -2.0f, 0.5f});
  }
  SUBCASE("AdamW with lr x weight decay = 1 and zero gradients sets the weights to 0") {
    optimizer_options o = adam(optimizer_kind::adamw);
    o.lr = 0.5;
    o.weight_decay = 2;
    REQUIRE(o.problem() == "");
    std::vector<float> w = {1.0f, -2.0f, 0.5f};
    zero::detail::apply_update(o, 1, w.data(), zero_gradient.data(), 1.0f, m.data(), v.data(), w.size());
    CHECK(w == std::vector<float>{0.0f, 0.0f, 0.0f});
  }
  SUBCASE("SGD with lr FLT_MAX") {
    std::vector<float> w = {std::numeric_limits<float>::max(), 0.0f, 1.0f};
    const std::vector<float> g = {1.0f, 0.0f, 0x1p-126f};  // FLT_MAX x 2^-126 = 4 - 2^-22
    zero::detail::apply_update(sgd(float_max), 1, w.data(), g.data(), 1.0f, nullptr, nullptr, w.size());
    CHECK(w == std::vector<float>{0.0f, 0.0f, -3.0f + 0x1p-22f});
  }
}

TEST_CASE("set_learning_rate refuses a rate the options cannot apply and keeps the previous one") {
  auto expect_refused = [](sharded_optimizer& opt, double lr, const std::string& message) {
    CAPTURE(lr);
    const double before = opt.options().lr;
    try {
      opt.set_learning_rate(lr);
      FAIL("set_learning_rate accepted " << lr);
    } catch (const error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      CHECK(e.message() == "zero::sharded_optimizer: " + message);
    }
    CHECK(opt.options().lr == before);
  };
  const optimizer_options plain = sgd(0.1);
  const shard_plan plan = one_parameter_plan(plain, 4);
  sharded_optimizer opt(plan, 0, plain);
  expect_refused(opt, 1e39, "learning rate 1e+39" + float_range);
  expect_refused(opt, 1e-46, "learning rate 1e-46" + float_range);
  expect_refused(opt, -1, "learning rate must be finite and >= 0, got -1");
  opt.set_learning_rate(float_max);
  CHECK(opt.options().lr == float_max);

  optimizer_options adamw = adam(optimizer_kind::adamw);
  adamw.weight_decay = 0.01;
  const shard_plan adam_plan = one_parameter_plan(adamw, 4);
  sharded_optimizer adamw_opt(adam_plan, 0, adamw);
  expect_refused(adamw_opt, 200,
                 "learning rate 200 x weight decay 0.01 = 2 is above 1: AdamW multiplies the weights by "
                 "1 - lr x weight_decay, which must be in [0, 1]");
  adamw_opt.set_learning_rate(100);
  CHECK(adamw_opt.options().lr == 100);
}
