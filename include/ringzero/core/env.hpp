#pragma once
/// @file
/// Reading ringzero's environment variables, each with a clear error for a malformed value.
///
/// | variable          | meaning                                               | default |
/// |-------------------|-------------------------------------------------------|---------|
/// | RINGZERO_TIMEOUT  | collective / transfer timeout in seconds (> 0; at     | 300     |
/// |                   | most 1e9, larger counts as 1e9: for ever)             |         |
/// | RINGZERO_ALGO     | algorithm for every collective: auto, ring, direct,   | auto    |
/// |                   | halving_doubling, native (like NCCL_ALGO)             |         |
/// | RINGZERO_PIN      | 1: pin local-backend rank threads to cores            | 0       |
/// | RINGZERO_CHECK    | 1/0: cross-rank contract check on backends where it   | backend |
/// |                   | costs communication (MPI); always on for local        |         |
/// | RINGZERO_REPRODUCIBLE | 1: floating sum/avg/premul_sum reductions in      | 0       |
/// |                   | reproducible mode (docs/numerics.md)                  |         |

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "ringzero/core/algorithm.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero {

/// Default timeout of every communicator when neither RINGZERO_TIMEOUT nor a per-communicator
/// value is set (seconds).
inline constexpr double default_timeout_seconds = 300.0;

/// The longest timeout kept as given: 1e9 s (about 31 years). A longer one (or infinity) is
/// stored as this, i.e. waiting for ever: deadlines are clock readings in 64-bit nanoseconds,
/// which a timeout above about 9.2e9 s would overflow into the past (an instant timeout).
inline constexpr double max_timeout_seconds = 1e9;

/// `t` capped at `max_timeout_seconds` (what every deadline is computed from).
inline std::chrono::duration<double> bounded_timeout(std::chrono::duration<double> t) noexcept {
  return std::chrono::duration<double>(std::min(t.count(), max_timeout_seconds));
}

namespace detail {

/// The value of environment variable `name`, or std::nullopt when unset or empty.
inline std::optional<std::string> env_string(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

/// Parses a strictly positive, finite number of seconds; throws errc::invalid_argument naming
/// `what` and the text otherwise.
inline double parse_seconds(const std::string& text, const char* what) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v <= 0.0)
    throw error(errc::invalid_argument, std::string(what) + "=\"" + text + "\" is not a positive number of seconds");
  return v;
}

/// Parses "0"/"1"/"true"/"false"/"on"/"off"/"yes"/"no"; throws errc::invalid_argument otherwise.
inline bool parse_flag(const std::string& text, const char* what) {
  if (text == "1" || text == "true" || text == "on" || text == "yes") return true;
  if (text == "0" || text == "false" || text == "off" || text == "no") return false;
  throw error(errc::invalid_argument, std::string(what) + "=\"" + text + "\" is not one of 0, 1, true, false, on, off");
}

}  // namespace detail

/// The timeout from RINGZERO_TIMEOUT, or `default_timeout_seconds`.
/// Throws errc::invalid_argument when the variable is set but not a positive number.
inline std::chrono::duration<double> env_timeout() {
  if (auto v = detail::env_string("RINGZERO_TIMEOUT"))
    return bounded_timeout(std::chrono::duration<double>(detail::parse_seconds(*v, "RINGZERO_TIMEOUT")));
  return std::chrono::duration<double>(default_timeout_seconds);
}

/// The algorithm forced by RINGZERO_ALGO, or `algorithm::automatic` when unset.
/// Throws errc::invalid_argument when the variable names no algorithm.
inline algorithm env_algorithm() {
  auto v = detail::env_string("RINGZERO_ALGO");
  if (!v) return algorithm::automatic;
  if (auto a = parse_algorithm(*v)) return *a;
  throw error(errc::invalid_argument,
              "RINGZERO_ALGO=\"" + *v + "\" is not one of auto, ring, direct, halving_doubling, native");
}

/// RINGZERO_PIN as a flag (false when unset). Throws errc::invalid_argument on a bad value.
inline bool env_pin_threads() {
  auto v = detail::env_string("RINGZERO_PIN");
  return v ? detail::parse_flag(*v, "RINGZERO_PIN") : false;
}

/// RINGZERO_CHECK as a flag, or `fallback` when unset. Throws errc::invalid_argument on a bad value.
inline bool env_check(bool fallback) {
  auto v = detail::env_string("RINGZERO_CHECK");
  return v ? detail::parse_flag(*v, "RINGZERO_CHECK") : fallback;
}

/// RINGZERO_REPRODUCIBLE as a flag (false when unset). Throws errc::invalid_argument on a bad value.
inline bool env_reproducible() {
  auto v = detail::env_string("RINGZERO_REPRODUCIBLE");
  return v ? detail::parse_flag(*v, "RINGZERO_REPRODUCIBLE") : false;
}

}  // namespace ringzero
