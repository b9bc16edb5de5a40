#pragma once
/// @file
/// `hidden_fraction`: the part of communication time that computation hid, as the DDP reducer's
/// overlap figures (ddp/reducer_options.hpp) and the ZeRO runtime's gather timing
/// (zero/gather_timing.hpp) report it. Units: none (a fraction of seconds over seconds).

namespace ringzero {

/// 1 - exposed / total, clamped to [0, 1]; 0 when `total` <= 0 (nothing was communicated).
/// `exposed`: the seconds computation stood still waiting; `total`: the communication's seconds.
constexpr double hidden_fraction(double exposed, double total) noexcept {
  if (total <= 0.0) return 0.0;
  const double f = 1.0 - exposed / total;
  return f < 0.0 ? 0.0 : (f > 1.0 ? 1.0 : f);
}

}  // namespace ringzero
