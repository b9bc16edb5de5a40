#pragma once
/// @file
/// `progress_bar`: a one-line progress display for the examples, drawn only when standard
/// output is a terminal (so logs and pipes get clean lines), redrawn at most every 100 ms.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include <fmt/core.h>

namespace ringzero::examples {

/// A progress line "label [=====>    ] 45%  suffix", drawn with carriage returns.
class progress_bar {
 public:
  /// `enabled` false (or stdout not a terminal) makes every call a no-op.
  explicit progress_bar(bool enabled = true) : enabled_(enabled && ::isatty(STDOUT_FILENO) == 1) {}

  /// True when the bar is drawn.
  bool enabled() const noexcept { return enabled_; }

  /// Shows `done` of `total` with `label` before the bar and `suffix` after it.
  void update(const std::string& label, std::size_t done, std::size_t total, const std::string& suffix = {}) {
    if (!enabled_ || total == 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    constexpr int width = 30;
    const int filled = static_cast<int>(static_cast<double>(done) / static_cast<double>(total) * width);
    std::string bar(static_cast<std::size_t>(width), ' ');
    for (int i = 0; i < filled && i < width; ++i) bar[static_cast<std::size_t>(i)] = '=';
    if (filled < width) bar[static_cast<std::size_t>(filled)] = '>';
    fmt::print("\r\033[K{} [{}] {:3d}%  {}", label, bar,
               static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total)), suffix);
    std::fflush(stdout);
    drawn_ = true;
  }

  /// Erases the line (before printing a normal line).
  void clear() {
    if (!enabled_ || !drawn_) return;
    fmt::print("\r\033[K");
    std::fflush(stdout);
    drawn_ = false;
  }

 private:
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace ringzero::examples
