#pragma once
/// @file
/// The optimizers a ZeRO runtime applies to its shard — SGD (with momentum, dampening, Nesterov),
/// Adam and AdamW — as options and an element-wise update over one contiguous range.
/// The manual: docs/zero.md, "Header notes", `ringzero/zero/optimizer.hpp`.

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "ringzero/core/enum_names.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::zero {

namespace detail {

/// The largest finite float32 (FLT_MAX), as a double.
inline constexpr double float_max = std::numeric_limits<float>::max();
/// The smallest normal float32 (2^-126, FLT_MIN), as a double.
inline constexpr double float_min_normal = std::numeric_limits<float>::min();

/// Whether `x` survives conversion to float32 as meant: 0, or a value that rounds (to nearest) to
/// a float32 of magnitude float_min_normal to float_max, such as the decimal 3.4028235e38 printed
/// for FLT_MAX (false for nan, inf, values that round to inf, and values that would become 0 or
/// subnormal).
inline bool fits_float(double x) noexcept {
  if (x == 0) return true;
  // At and above the midpoint between FLT_MAX and 2^128 a double rounds to infinity (and the
  // conversion of such a value is not defined): refused before converting.
  if (!(std::fabs(x) < 0x1.ffffffp127)) return false;
  return std::isnormal(static_cast<float>(x));
}

/// `x` written in the fewest digits that read back as the same double ("1e+39", "0.001", "nan").
inline std::string number_text(double x) {
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, x);
  return ec == std::errc() ? std::string(text, end) : std::to_string(x);
}

/// The explanation appended to a value refused by `fits_float`.
inline std::string float_range_text() {
  return " (the optimizer computes in float32: a value must be 0 or round to a magnitude from " +
         number_text(float_min_normal) + " to " + number_text(float_max) + ")";
}

}  // namespace detail

/// Which optimizer.
enum class optimizer_kind : std::uint8_t { sgd = 0, adam = 1, adamw = 2 };

/// "sgd", "adam" or "adamw".
inline constexpr enum_names<optimizer_kind, 3> optimizer_names{"sgd", "adam", "adamw"};
/// The name of `k` (`optimizer_names`).
constexpr std::string_view optimizer_name(optimizer_kind k) noexcept { return optimizer_names(k); }

/// Parses `optimizer_name` output; std::nullopt when unknown.
constexpr std::optional<optimizer_kind> parse_optimizer(std::string_view s) noexcept {
  return optimizer_names.parse(s);
}

/// Hyper-parameters (PyTorch's names and defaults, except that `lr` must be given). Every value
/// is applied as a float32 and must be 0 or in float32's normal range (see the file comment).
struct optimizer_options {
  optimizer_kind kind = optimizer_kind::adam;
  double lr = 1e-3;  ///< learning rate (>= 0); Adam/AdamW: lr / (1 - beta1) <= FLT_MAX; AdamW: lr * weight_decay <= 1
  double weight_decay = 0;  ///< L2 penalty (SGD, Adam) or decoupled decay (AdamW, lr * weight_decay <= 1); AdamW's
                            ///< PyTorch default is 1e-2
  double momentum = 0;      ///< SGD momentum (>= 0); 0: no momentum buffer
  double dampening = 0;     ///< SGD dampening
  bool nesterov = false;    ///< SGD Nesterov momentum (needs momentum > 0 and dampening 0)
  double beta1 = 0.9;       ///< Adam/AdamW first-moment decay, in [0, 1) and below 1 as a float32 (<= 1 - 2^-24)
  double beta2 = 0.999;     ///< Adam/AdamW second-moment decay, in [0, 1) and below 1 as a float32 (<= 1 - 2^-24)
  double eps = 1e-8;        ///< Adam/AdamW denominator term (> 0, at least 2^-126 so that it stays a normal float32)

  /// State tensors per parameter element: 2 for Adam/AdamW, 1 for SGD with momentum, 0 for SGD.
  constexpr int state_count() const noexcept {
    if (kind == optimizer_kind::sgd) return momentum != 0 ? 1 : 0;
    return 2;
  }

  /// The first problem with these options ("" when valid): a value out of its range, a value that
  /// does not survive conversion to float32 (`detail::fits_float`), a beta that rounds to 1 as a
  /// float32, or a factor computed from them that would overflow float32 or be meaningless (Adam's
  /// first step size lr / (1 - beta1) above FLT_MAX; AdamW's lr * weight_decay above 1). The message
  /// names the option and its value.
  std::string problem() const {
    using detail::fits_float;
    using detail::number_text;
    auto bad = [](double x) { return !std::isfinite(x); };
    auto not_float = [](const char* name, double x) {
      return std::string(name) + " " + number_text(x) + " is not representable as a float32" +
             detail::float_range_text();
    };
    if (kind != optimizer_kind::sgd && kind != optimizer_kind::adam && kind != optimizer_kind::adamw)
      return "unknown optimizer kind " + std::to_string(static_cast<unsigned>(kind));
    if (bad(lr) || lr < 0) return "learning rate must be finite and >= 0, got " + number_text(lr);
    if (!fits_float(lr)) return not_float("learning rate", lr);
    if (bad(weight_decay) || weight_decay < 0)
      return "weight decay must be finite and >= 0, got " + number_text(weight_decay);
    if (!fits_float(weight_decay)) return not_float("weight decay", weight_decay);
    if (kind == optimizer_kind::sgd) {
      if (bad(momentum) || momentum < 0) return "momentum must be finite and >= 0, got " + number_text(momentum);
      if (!fits_float(momentum)) return not_float("momentum", momentum);
      if (bad(dampening)) return "dampening must be finite, got " + number_text(dampening);
      // |dampening| <= FLT_MAX keeps the applied factor 1 - dampening within float32 as well.
      if (!fits_float(dampening)) return not_float("dampening", dampening);
      if (nesterov && (momentum <= 0 || dampening != 0)) return "Nesterov momentum needs momentum > 0 and dampening 0";
    } else {
      const std::pair<const char*, double> betas[] = {{"beta1", beta1}, {"beta2", beta2}};
      for (const auto& [name, beta] : betas) {
        if (bad(beta) || beta < 0 || beta >= 1)
          return std::string(name) + " must be in [0, 1), got " + number_text(beta);
        if (!fits_float(beta)) return not_float(name, beta);
        // The moments decay by the float32 beta: one that rounds to 1 would never decay.
        if (static_cast<float>(beta) >= 1.0f)
          return std::string(name) + " " + number_text(beta) +
                 " rounds to 1 as a float32 (the largest usable beta is " + number_text(1.0 - 0x1p-24) + ")";
      }
      if (bad(eps) || eps <= 0) return "eps must be finite and > 0, got " + number_text(eps);
      if (!fits_float(eps)) return not_float("eps", eps);
      // The step size lr / (1 - beta1^t) is largest at the first step.
      if (lr / (1.0 - beta1) > detail::float_max)
        return "learning rate " + number_text(lr) + " / (1 - beta1 " + number_text(beta1) +
               ") = " + number_text(lr / (1.0 - beta1)) + ", the first step size, is not representable as a float32" +
               detail::float_range_text();
      if (kind == optimizer_kind::adamw && lr * weight_decay > 1)
        return "learning rate " + number_text(lr) + " x weight decay " + number_text(weight_decay) + " = " +
               number_text(lr * weight_decay) +
               " is above 1: AdamW multiplies the weights by 1 - lr x weight_decay, which must be in [0, 1]";
    }
    return {};
  }
};

}  // namespace ringzero::zero

// The element-wise update (detail::apply_update), shared with the CUDA kernels.
#include "ringzero/zero/shard_update.hpp"
