#pragma once
/// @file
/// `zero::gather_timing`: how long stage 3's parameter gathers took on the communication stream
/// and how long the compute stream waited for them, measured with timing events on the streams
/// themselves (host events: the steady clock when a point is reached; CUDA: cudaEventElapsedTime),
/// so the figure is the same code on the host path, the simulated device and a GPU. The share of
/// gather time hidden behind compute is what FSDP's prefetching is for (Zhao et al. 2023, "PyTorch
/// FSDP: Experiences on Scaling Fully Sharded Data Parallel": the next unit's all_gather issued
/// before the current unit's compute).
/// `detail::gather_timer` records the events and sums the finished intervals.
/// Thread semantics: used by the model's thread; the events are read only once reached.
/// The manual: docs/zero.md, "Gather timing".

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ringzero/core/hidden_fraction.hpp"
#include "ringzero/zero/execution_stream.hpp"

namespace ringzero::zero {

/// Sums over the intervals measured since the model started timing (or since the last reset).
/// Units: seconds.
struct gather_timing {
  std::uint64_t gathers = 0;  ///< unit gathers timed (all_gathers of one unit, with dequantization)
  double gather_seconds = 0;  ///< their time on the communication stream, each from start to arrival
  std::uint64_t waits = 0;    ///< waits of the compute stream for a unit's gather (pre_forward / pre_backward)
  /// The time the compute stream stood still in those waits. A wait also covers what the
  /// communication stream ran before the gather (a gradient reduction) and the peers' arrival at
  /// the collective, so this can exceed `gather_seconds`.
  double exposed_seconds = 0;
  /// The fraction of the gather time the compute stream did not wait for: 1 - exposed /
  /// gather, clamped to [0, 1]; 0 when nothing was gathered (core/hidden_fraction.hpp, as the
  /// DDP reducer's `hidden_fraction`).
  double hidden_fraction() const noexcept { return ringzero::hidden_fraction(exposed_seconds, gather_seconds); }
};

namespace detail {

/// Records timing events around work enqueued on a stream and sums the intervals once their
/// points are reached. Events are pooled per stream (two streams: communication, compute).
class gather_timer {
 public:
  enum class kind : std::uint8_t { gather, wait };

  /// Records a timing event on `s`, runs `enqueue` (which enqueues work on `s`), records another.
  /// `which` selects the pool (0: communication stream, 1: compute stream).
  template <class F>
  void time(execution_stream& s, int which, kind k, F&& enqueue) {
    std::unique_ptr<execution_stream::event> begin = take(s, which), end = take(s, which);
    s.record(*begin);
    enqueue();
    s.record(*end);
    pending_.push_back({&s, which, k, std::move(begin), std::move(end)});
  }

  /// Adds the intervals whose points are reached to the sums, oldest first; with `wait`, waits
  /// for each (the caller knows the streams are drained or may block), else stops at the first
  /// one not reached.
  void collect(bool wait) {
    std::size_t done = 0;
    for (; done < pending_.size(); ++done) {
      interval& i = pending_[done];
      if (wait) i.stream->wait_host(*i.end);
      if (!i.stream->query(*i.begin) || !i.stream->query(*i.end)) break;
      const double seconds = i.stream->elapsed_seconds(*i.begin, *i.end);
      if (i.what == kind::gather) {
        ++totals_.gathers;
        totals_.gather_seconds += seconds;
      } else {
        ++totals_.waits;
        totals_.exposed_seconds += seconds;
      }
      pool_[i.which].push_back(std::move(i.begin));
      pool_[i.which].push_back(std::move(i.end));
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
  }

  /// The sums so far (the intervals `collect` has added).
  const gather_timing& totals() const noexcept { return totals_; }
  /// Starts the sums again (intervals still pending count in the new ones).
  void reset() noexcept { totals_ = {}; }
  /// Intervals recorded and not yet added.
  std::size_t pending() const noexcept { return pending_.size(); }

 private:
  struct interval {
    execution_stream* stream;
    int which;
    kind what;
    std::unique_ptr<execution_stream::event> begin, end;
  };
  std::unique_ptr<execution_stream::event> take(execution_stream& s, int which) {
    std::vector<std::unique_ptr<execution_stream::event>>& pool = pool_[which];
    if (pool.empty()) return s.make_timing_event();
    std::unique_ptr<execution_stream::event> e = std::move(pool.back());
    pool.pop_back();
    return e;
  }

  std::vector<interval> pending_;
  std::vector<std::unique_ptr<execution_stream::event>> pool_[2];
  gather_timing totals_;
};

}  // namespace detail
}  // namespace ringzero::zero
