#pragma once
/// @file
/// `ddp::detail::interval_union`: the length of a union of time intervals that arrive in order
/// of their starts, as the gradient reducer's reductions do (launched in order, completed first
/// in first out): how long at least one bucket was being reduced, overlaps counted once
/// (`reducer_stats::reduction_seconds`). Plain value; the reducer's training thread only.

#include <chrono>

namespace ringzero::ddp::detail {

/// See the file comment.
class interval_union {
 public:
  using clock = std::chrono::steady_clock;

  /// Adds [a, b] (an end before its start counts as [a, a]). Precondition: `a` is not before the
  /// start of the interval added last. Returns the seconds of the merged run this interval closes
  /// (the previous run, when [a, b] starts after it ended), 0 otherwise.
  double add(clock::time_point a, clock::time_point b) noexcept {
    if (b < a) b = a;
    double closed = 0;
    if (!open_) {
      start_ = a;
      end_ = b;
      open_ = true;
      return closed;
    }
    if (a > end_) {
      closed = std::chrono::duration<double>(end_ - start_).count();
      start_ = a;
    }
    if (b > end_) end_ = b;
    return closed;
  }

  /// Closes the run in progress and returns its seconds (0 when none); the union starts empty.
  double take() noexcept {
    if (!open_) return 0;
    open_ = false;
    return std::chrono::duration<double>(end_ - start_).count();
  }

 private:
  bool open_ = false;
  clock::time_point start_{};
  clock::time_point end_{};
};

}  // namespace ringzero::ddp::detail
