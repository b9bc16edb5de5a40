#pragma once
/// @file
/// Optimizers over flat float spans: SGD with momentum and AdamW, with PyTorch's update rules
/// (torch.optim.SGD with dampening 0, torch.optim.AdamW). They hold their state (momentum,
/// moments) for `state_elements` values and update any sub-range of it, so the same object
/// serves a whole model (data parallelism) or one rank's shard of it (ZeRO stage 1 and up).
///
/// Memory: state allocated once at construction. Threads: single-threaded loops the compiler
/// vectorises. Determinism: element-wise, identical on every rank given identical inputs.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ringzero/core/error.hpp"

namespace ringzero::examples {

/// An optimizer over flat float state (see the file comment).
class optimizer {
 public:
  virtual ~optimizer() = default;
  /// "sgd" or "adamw".
  virtual std::string name() const = 0;
  /// Starts an optimizer step (AdamW counts steps for its bias correction). Call once per step,
  /// before the `update` calls of that step.
  virtual void begin_step() {}
  /// Updates `params` from `grads` (same size) using state elements
  /// [state_offset, state_offset + params.size()). Throws errc::invalid_argument when the
  /// sizes differ or the range exceeds the state.
  virtual void update(std::span<float> params, std::span<const float> grads, std::size_t state_offset) = 0;
  /// The learning rate.
  float learning_rate() const noexcept { return lr_; }
  /// Changes the learning rate (schedules, linear scaling).
  void set_learning_rate(float lr) noexcept { lr_ = lr; }
  /// Number of values the state covers (the range `update` may address).
  std::size_t state_elements() const noexcept { return n_; }

  /// One state tensor over all `state_elements()` values, under PyTorch's name.
  struct state_tensor {
    std::string name;         ///< "momentum_buffer", "exp_avg", "exp_avg_sq"
    std::span<float> values;  ///< the optimizer's own memory (a checkpoint saves and restores it)
  };
  /// The state tensors, in PyTorch's order (none for a stateless optimizer).
  virtual std::vector<state_tensor> state_tensors() { return {}; }
  /// Optimizer steps taken (AdamW's bias correction counts them; 0 for SGD, which does not).
  virtual std::uint64_t steps() const noexcept { return 0; }
  /// Restores the step count (from a checkpoint).
  virtual void set_steps(std::uint64_t) noexcept {}

 protected:
  optimizer(std::size_t n, float lr) : n_(n), lr_(lr) {}
  void check(std::span<float> p, std::span<const float> g, std::size_t offset) const {
    if (p.size() != g.size())
      throw error(errc::invalid_argument, name() + ": " + std::to_string(p.size()) + " parameters but " +
                                              std::to_string(g.size()) + " gradients");
    if (offset > n_ || p.size() > n_ - offset)
      throw error(errc::invalid_argument, name() + ": state range [" + std::to_string(offset) + ", +" +
                                              std::to_string(p.size()) + ") exceeds " + std::to_string(n_) +
                                              " elements");
  }
  std::size_t n_;
  float lr_;
};

/// SGD with momentum (torch.optim.SGD, dampening 0): g += wd * p; buf = momentum * buf + g;
/// p -= lr * (nesterov ? g + momentum * buf : buf).
class sgd final : public optimizer {
 public:
  /// State for `n` values.
  sgd(std::size_t n, float lr, float momentum = 0.9f, float weight_decay = 0.0f, bool nesterov = false)
      : optimizer(n, lr), momentum_(momentum), weight_decay_(weight_decay), nesterov_(nesterov), buf_(n, 0.0f) {}
  std::string name() const override { return "sgd"; }
  std::vector<state_tensor> state_tensors() override { return {{"momentum_buffer", buf_}}; }
  void update(std::span<float> p, std::span<const float> g, std::size_t offset) override {
    check(p, g, offset);
    float* buf = buf_.data() + offset;
    const float lr = lr_, mu = momentum_, wd = weight_decay_;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const float grad = g[i] + wd * p[i];
      buf[i] = mu * buf[i] + grad;
      p[i] -= lr * (nesterov_ ? grad + mu * buf[i] : buf[i]);
    }
  }

 private:
  float momentum_, weight_decay_;
  bool nesterov_;
  std::vector<float> buf_;
};

/// AdamW (Loshchilov & Hutter 2019; torch.optim.AdamW): p *= 1 - lr * wd;
/// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
class adamw final : public optimizer {
 public:
  /// State (two moments) for `n` values.
  adamw(std::size_t n, float lr, float weight_decay = 0.01f, float beta1 = 0.9f, float beta2 = 0.999f,
        float eps = 1e-8f)
      : optimizer(n, lr),
        weight_decay_(weight_decay),
        beta1_(beta1),
        beta2_(beta2),
        eps_(eps),
        m_(n, 0.0f),
        v_(n, 0.0f) {}
  std::string name() const override { return "adamw"; }
  std::vector<state_tensor> state_tensors() override { return {{"exp_avg", m_}, {"exp_avg_sq", v_}}; }
  void begin_step() override { ++t_; }
  void update(std::span<float> p, std::span<const float> g, std::size_t offset) override {
    check(p, g, offset);
    if (t_ == 0) throw error(errc::invalid_argument, "adamw: update before begin_step");
    float* m = m_.data() + offset;
    float* v = v_.data() + offset;
    const double t = static_cast<double>(t_);
    const float bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1_), t));
    const float bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(beta2_), t)));
    const float step = lr_ / bias1, decay = 1.0f - lr_ * weight_decay_;
    const float b1 = beta1_, b2 = beta2_, eps = eps_;
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= decay;
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      p[i] -= step * m[i] / (std::sqrt(v[i]) / bias2_sqrt + eps);
    }
  }
  /// Steps taken so far.
  std::uint64_t steps() const noexcept override { return t_; }
  void set_steps(std::uint64_t t) noexcept override { t_ = t; }

 private:
  float weight_decay_, beta1_, beta2_, eps_;
  std::uint64_t t_ = 0;
  std::vector<float> m_, v_;
};

/// Makes "sgd" (momentum 0.9) or "adamw" (weight decay 0.01) over `n` values with learning
/// rate `lr`. Throws errc::invalid_argument for another name.
inline std::unique_ptr<optimizer> make_optimizer(const std::string& name, std::size_t n, float lr) {
  if (name == "sgd") return std::make_unique<sgd>(n, lr, 0.9f);
  if (name == "adamw") return std::make_unique<adamw>(n, lr, 0.01f);
  throw error(errc::invalid_argument, "unknown optimizer '" + name + "' (sgd or adamw)");
}

}  // namespace ringzero::examples
