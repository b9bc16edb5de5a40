#pragma once
/// @file
/// `mpi::detail::link_pacer`: holds back one rank's sends so that they leave no faster than a
/// link of a chosen throughput would carry them (communicator_options::link_gbps), so that the
/// benefit of sending fewer bytes shows on one machine, where processes exchange data through
/// shared memory at tens of Gb/s. The manual: docs/mpi.md, "A slower link on one machine".

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "ringzero/core/env.hpp"
#include "ringzero/core/error.hpp"

namespace ringzero::mpi::detail {

/// A send-side link of `gbps` gigabits (1e9 bits) per second, shared by every send of the rank
/// in the order they start: a send of b bytes starts when the link is free (when the previous
/// send would have left it), occupies it for 8 b / (gbps 1e9) seconds, and the call returns to
/// the transfer once that time has passed, so the peer receives nothing earlier. The link is
/// full duplex (receives are not held back: the peer's link paces them). The link's time comes
/// on top of the machine's own transfer, and a sleep ends up to the scheduler's wake-up latency
/// (tens of microseconds) late; neither is credited to later sends, so the rate achieved is
/// somewhat below `gbps`, most for small sends. `carry` is called by one thread at a time (the
/// communicator's); `busy_seconds` may be read by any thread.
class link_pacer {
 public:
  using clock = std::chrono::steady_clock;

  /// No pacing (until `set_gbps`).
  link_pacer() = default;
  /// The slowest link it paces: 1 Mb/s (a send's time must fit the clock's 64-bit ticks).
  static constexpr double min_gbps = 1e-3;
  /// The fastest: 1 Pb/s.
  static constexpr double max_gbps = 1e6;

  /// Paces sends as a link of `gbps` Gb/s from now on; throws errc::invalid_argument unless
  /// `valid(gbps)`. Called before the first send.
  void set_gbps(double gbps) {
    if (!valid(gbps))
      throw error(
          errc::invalid_argument,
          "link_gbps must be a number of gigabits per second from 0.001 to 1000000, got " + std::to_string(gbps));
    gbps_ = gbps;
  }

  /// True when `gbps` is a rate the pacer accepts.
  static bool valid(double gbps) noexcept { return std::isfinite(gbps) && gbps >= min_gbps && gbps <= max_gbps; }

  /// True when sends are paced.
  bool active() const noexcept { return gbps_ > 0.0; }
  /// The link's throughput in Gb/s (0: not paced).
  double gbps() const noexcept { return gbps_; }
  /// Seconds the link needs for `bytes` bytes.
  double seconds_for(std::uint64_t bytes) const noexcept {
    return active() ? static_cast<double>(bytes) * 8.0 / (gbps_ * 1e9) : 0.0;
  }

  /// Blocks until a send of `bytes` bytes, started now or when the link frees, would have left.
  void carry(std::uint64_t bytes) {
    if (!active() || bytes == 0) return;
    const clock::time_point start = std::max(clock::now(), free_at_);
    free_at_ = start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds_for(bytes)));
    busy_seconds_.store(busy_seconds() + seconds_for(bytes), std::memory_order_relaxed);  // one writer
    std::this_thread::sleep_until(free_at_);
  }

  /// Seconds of link time charged so far (the sum of `seconds_for` over every send).
  double busy_seconds() const noexcept { return busy_seconds_.load(std::memory_order_relaxed); }

 private:
  double gbps_ = 0.0;
  clock::time_point free_at_{};
  std::atomic<double> busy_seconds_{0.0};
};

/// RINGZERO_LINK_GBPS as a number of Gb/s, or std::nullopt when unset; throws
/// errc::invalid_argument naming the variable when it is not a number the pacer accepts.
inline std::optional<double> env_link_gbps() {
  const std::optional<std::string> text = ringzero::detail::env_string("RINGZERO_LINK_GBPS");
  if (!text) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text->c_str(), &end);
  if (end == text->c_str() || *end != '\0' || errno == ERANGE || !link_pacer::valid(v))
    throw error(errc::invalid_argument,
                "RINGZERO_LINK_GBPS=\"" + *text + "\" is not a number of gigabits per second from 0.001 to 1000000");
  return v;
}

}  // namespace ringzero::mpi::detail
