#pragma once
// The benchmarks' size sweep and timing, as nccl-tests does them: sizes from -b to -e multiplied
// by -f (or stepped by -i when -f is 1); per row a warm-up, then timed calls back to back, each
// timed from the end of the previous one; each iteration's time is the slowest rank's; the row's
// time is the mean over iterations (what nccl-tests prints), algbw = size / time and busbw =
// algbw * the collective's bus factor (collective.hpp). The median is kept beside the mean.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "ringzero/collective/all_reduce.hpp"

namespace ringzero::bench {

/// The sizes (bytes) of a sweep from `min_bytes` to `max_bytes`: multiplied by `factor` when it is
/// above 1, else stepped by `step_bytes` (> 0). Stops before an overflowing size.
inline std::vector<std::uint64_t> sweep_sizes(std::uint64_t min_bytes, std::uint64_t max_bytes, std::uint64_t factor,
                                              std::uint64_t step_bytes) {
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t bytes = min_bytes; bytes <= max_bytes;) {
    sizes.push_back(bytes);
    const std::uint64_t next = factor > 1 ? bytes * factor : bytes + step_bytes;
    if (next <= bytes || (factor > 1 && next / factor != bytes)) break;
    bytes = next;
  }
  return sizes;
}

/// Mean and median of a row's per-iteration times (us).
struct time_summary {
  double mean_us = 0;
  double median_us = 0;
};

/// The mean and median of `samples_us` (both 0 when there are none).
inline time_summary summarize(std::vector<double> samples_us) {
  time_summary t;
  if (samples_us.empty()) return t;
  double total = 0;
  for (double x : samples_us) total += x;
  t.mean_us = total / static_cast<double>(samples_us.size());
  std::sort(samples_us.begin(), samples_us.end());
  const std::size_t m = samples_us.size();
  t.median_us = m % 2 ? samples_us[m / 2] : 0.5 * (samples_us[m / 2 - 1] + samples_us[m / 2]);
  return t;
}

/// Runs `call` `times_us.size()` times back to back and writes each call's time (us), timed from
/// the end of the previous call (the first from entry). Host work only: device work is queued.
template <class Call>
void time_each(std::vector<double>& times_us, Call&& call) {
  using clock = std::chrono::steady_clock;
  auto last = clock::now();
  for (double& t : times_us) {
    call();
    const auto now = clock::now();
    t = std::chrono::duration<double, std::micro>(now - last).count();
    last = now;
  }
}

/// Device work: runs `call` `iters` times back to back, then `wait()` (the stream's completion),
/// and returns the time per call (us): the batch's time over `iters`, as nccl-tests times it.
template <class Call, class Wait>
double time_batch(int iters, Call&& call, Wait&& wait) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  for (int i = 0; i < iters; ++i) call();
  wait();
  return std::chrono::duration<double, std::micro>(clock::now() - t0).count() / static_cast<double>(iters);
}

/// Element-wise maximum over the ranks of `comm` of `mine` (each iteration's slowest rank), into
/// `slowest` (same size). A collective: every rank calls it.
inline void slowest_over_ranks(communicator& comm, const std::vector<double>& mine, std::vector<double>& slowest) {
  slowest.resize(mine.size());
  all_reduce(comm, mine.data(), slowest.data(), mine.size(), dtype::float64, reduce_kind::max);
}

/// Algorithm bandwidth (GB/s) of `size_bytes` per rank in `time_us`; 0 when the time is not positive.
inline double algbw_gbps(double size_bytes, double time_us) { return time_us > 0 ? size_bytes / time_us / 1e3 : 0.0; }

}  // namespace ringzero::bench
