#pragma once
// The machine's memory bandwidth as the benchmarks' bound: a STREAM-style copy (McCalpin's
// STREAM "Copy" kernel, c[i] = a[i], counting the bytes read plus the bytes written) run at the
// same time on every rank's thread, each on its own buffers, in two variants: a plain loop (as
// STREAM compiles it) and memcpy (which uses non-temporal stores for large sizes). The median of
// `reps` repetitions of each variant is reported; the bound uses the faster variant.
// Also the benchmarks' guard on host memory: how much they may allocate before they start.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include <unistd.h>

#include "ringzero/collective/all_reduce.hpp"
#include "ringzero/collective/barrier.hpp"

namespace ringzero::bench {

/// The machine's physical memory in bytes (sysconf), or 0 when it cannot be told.
inline double physical_memory_bytes() noexcept {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

/// Whether `bytes` of host memory are more than a benchmark may allocate: 90% of the physical
/// memory. The benchmarks ask before they allocate, because with overcommit every allocation
/// succeeds and the kernel kills the process later, when the pages are touched. False when the
/// physical memory cannot be told.
inline bool exceeds_host_memory(double bytes) noexcept {
  const double have = physical_memory_bytes();
  return have > 0 && bytes > 0.9 * have;
}

struct copy_bandwidth {
  double loop_gbps = 0;    ///< plain copy loop, all ranks together (GB/s, read + write bytes)
  double memcpy_gbps = 0;  ///< memcpy, all ranks together
  double best() const { return std::max(loop_gbps, memcpy_gbps); }
};

// STREAM's copy kernel; loop distribution into a memcpy call is disabled so that it stays a loop.
[[gnu::noinline, gnu::optimize("no-tree-loop-distribute-patterns")]] inline void stream_copy(double* __restrict c,
                                                                                             const double* __restrict a,
                                                                                             std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) c[i] = a[i];
}

/// Measures on every rank of `comm` at once, copying `bytes` from `src` to `dst` (both touched
/// already). Collective: every rank must call it; every rank gets the same result.
inline copy_bandwidth measure_copy_bandwidth(communicator& comm, void* dst, const void* src, std::uint64_t bytes,
                                             int reps) {
  auto run = [&](bool use_memcpy) {
    std::vector<double> rates;
    for (int rep = 0; rep < reps + 1; ++rep) {  // the first repetition warms up
      barrier(comm);
      const auto t0 = std::chrono::steady_clock::now();
      if (use_memcpy)
        std::memcpy(dst, src, bytes);
      else
        stream_copy(static_cast<double*>(dst), static_cast<const double*>(src), bytes / sizeof(double));
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      double slowest = 0;
      all_reduce(comm, &seconds, &slowest, 1, dtype::float64, reduce_kind::max);
      if (rep > 0) rates.push_back(2.0 * static_cast<double>(bytes) * comm.world_size() / slowest / 1e9);
    }
    std::sort(rates.begin(), rates.end());
    return rates[rates.size() / 2];
  };
  copy_bandwidth bw;
  bw.loop_gbps = run(false);
  bw.memcpy_gbps = run(true);
  return bw;
}

}  // namespace ringzero::bench
