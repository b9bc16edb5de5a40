#pragma once
/// @file
/// The optimizers a ZeRO runtime applies to its shard — SGD (with momentum, dampening, Nesterov),
/// Adam and AdamW — as options and an element-wise update over one contiguous range.
///
/// The updates follow PyTorch's documented algorithms (torch.optim.SGD, Adam, AdamW, single-tensor
/// "foreach=False" form), computed in float32 with the scalar factors computed in double:
/// - SGD: g += weight_decay * w; momentum buffer b = g on the first step, else
///   b = momentum * b + (1 - dampening) * g; the step direction is g + momentum * b (Nesterov) or
///   b; w -= lr * direction. Without momentum there is no state.
/// - Adam: g += weight_decay * w (L2 penalty); m = beta1 m + (1 - beta1) g;
///   v = beta2 v + (1 - beta2) g^2; w -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
/// - AdamW: w *= 1 - lr * weight_decay (decoupled decay), then Adam's update without the L2 term.
/// Gradients are multiplied by `grad_scale` (the clipping coefficient) first, as
/// torch.nn.utils.clip_grad_norm_ multiplies them in place. Element-wise updates make a sharded
/// optimizer exact: updating each shard gives the same numbers as updating the whole tensor.

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ringzero/core/error.hpp"

namespace ringzero::zero {

/// Which optimizer.
enum class optimizer_kind : std::uint8_t { sgd = 0, adam = 1, adamw = 2 };

/// "sgd", "adam" or "adamw".
constexpr std::string_view optimizer_name(optimizer_kind k) noexcept {
  switch (k) {
    case optimizer_kind::sgd: return "sgd";
    case optimizer_kind::adam: return "adam";
    case optimizer_kind::adamw: return "adamw";
  }
  return "invalid";
}

/// Parses `optimizer_name` output; std::nullopt when unknown.
constexpr std::optional<optimizer_kind> parse_optimizer(std::string_view s) noexcept {
  for (optimizer_kind k : {optimizer_kind::sgd, optimizer_kind::adam, optimizer_kind::adamw})
    if (s == optimizer_name(k)) return k;
  return std::nullopt;
}

/// Hyper-parameters (PyTorch's names and defaults, except that `lr` must be given).
struct optimizer_options {
  optimizer_kind kind = optimizer_kind::adam;
  double lr = 1e-3;            ///< learning rate (>= 0)
  double weight_decay = 0;     ///< L2 penalty (SGD, Adam) or decoupled decay (AdamW); AdamW's PyTorch default is 1e-2
  double momentum = 0;         ///< SGD momentum (>= 0); 0: no momentum buffer
  double dampening = 0;        ///< SGD dampening
  bool nesterov = false;       ///< SGD Nesterov momentum (needs momentum > 0 and dampening 0)
  double beta1 = 0.9;          ///< Adam/AdamW first-moment decay, in [0, 1)
  double beta2 = 0.999;        ///< Adam/AdamW second-moment decay, in [0, 1)
  double eps = 1e-8;           ///< Adam/AdamW denominator term (> 0)

  /// State tensors per parameter element: 2 for Adam/AdamW, 1 for SGD with momentum, 0 for SGD.
  constexpr int state_count() const noexcept {
    if (kind == optimizer_kind::sgd) return momentum != 0 ? 1 : 0;
    return 2;
  }

  /// The first problem with these options ("" when valid).
  std::string problem() const {
    auto bad = [](double x) { return !std::isfinite(x); };
    if (kind != optimizer_kind::sgd && kind != optimizer_kind::adam && kind != optimizer_kind::adamw)
      return "unknown optimizer kind " + std::to_string(static_cast<unsigned>(kind));
    if (bad(lr) || lr < 0) return "learning rate must be finite and >= 0, got " + std::to_string(lr);
    if (bad(weight_decay) || weight_decay < 0) return "weight decay must be finite and >= 0, got " + std::to_string(weight_decay);
    if (kind == optimizer_kind::sgd) {
      if (bad(momentum) || momentum < 0) return "momentum must be finite and >= 0, got " + std::to_string(momentum);
      if (bad(dampening)) return "dampening must be finite";
      if (nesterov && (momentum <= 0 || dampening != 0)) return "Nesterov momentum needs momentum > 0 and dampening 0";
    } else {
      if (bad(beta1) || beta1 < 0 || beta1 >= 1) return "beta1 must be in [0, 1), got " + std::to_string(beta1);
      if (bad(beta2) || beta2 < 0 || beta2 >= 1) return "beta2 must be in [0, 1), got " + std::to_string(beta2);
      if (bad(eps) || eps <= 0) return "eps must be finite and > 0, got " + std::to_string(eps);
    }
    return {};
  }
};

namespace detail {

/// Applies one step (number `step`, counting from 1) of `o` to `count` elements: weights `w`
/// (float32, updated in place), gradients `g` (any type convertible to float, multiplied by
/// `grad_scale`), and state arrays `s0`, `s1` (momentum buffer; or Adam's exp_avg and exp_avg_sq).
template <class G>
void apply_update(const optimizer_options& o, std::uint64_t step, float* w, const G* g, float grad_scale, float* s0,
                  float* s1, std::uint64_t count) noexcept {
  const float lr = static_cast<float>(o.lr);
  const float wd = static_cast<float>(o.weight_decay);
  switch (o.kind) {
    case optimizer_kind::sgd: {
      const float momentum = static_cast<float>(o.momentum);
      const float keep = static_cast<float>(1.0 - o.dampening);
      for (std::uint64_t j = 0; j < count; ++j) {
        float d = static_cast<float>(g[j]) * grad_scale;
        if (wd != 0) d += wd * w[j];
        if (o.momentum != 0) {
          float& b = s0[j];
          b = step == 1 ? d : momentum * b + keep * d;
          d = o.nesterov ? d + momentum * b : b;
        }
        w[j] -= lr * d;
      }
      return;
    }
    case optimizer_kind::adam:
    case optimizer_kind::adamw: {
      const bool decoupled = o.kind == optimizer_kind::adamw;
      const double t = static_cast<double>(step);
      const double correction1 = 1.0 - std::pow(o.beta1, t);
      const double correction2 = 1.0 - std::pow(o.beta2, t);
      const float step_size = static_cast<float>(o.lr / correction1);
      const float correction2_sqrt = static_cast<float>(std::sqrt(correction2));
      const float beta1 = static_cast<float>(o.beta1), beta2 = static_cast<float>(o.beta2);
      const float one_minus_beta1 = static_cast<float>(1.0 - o.beta1), one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
      const float eps = static_cast<float>(o.eps);
      const float decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
      for (std::uint64_t j = 0; j < count; ++j) {
        float d = static_cast<float>(g[j]) * grad_scale;
        if (decoupled) w[j] *= decay;
        else if (wd != 0) d += wd * w[j];
        float& m = s0[j];
        float& v = s1[j];
        m = beta1 * m + one_minus_beta1 * d;
        v = beta2 * v + one_minus_beta2 * d * d;
        const float denom = std::sqrt(v) / correction2_sqrt + eps;
        w[j] -= step_size * (m / denom);
      }
      return;
    }
  }
}

}  // namespace detail
}  // namespace ringzero::zero
