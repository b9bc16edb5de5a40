// ringzero-soak: many back-to-back collectives, to show that a steady state has no memory growth
// and no slowdown.
//
//   ringzero-soak --ranks 2 --calls 10000 --bytes 4K --window 1000
//
// Runs `--calls` all_reduce calls (float32 sum) of `--bytes` per rank back to back and prints, per
// window of `--window` calls, the median call time (slowest rank) and the process's resident set
// size, plus the number of times any rank's scratch pool had to grow. A steady state shows flat
// medians, a constant RSS after the first window, and no pool growth after the first call.
// Exit status 1 when RSS grows by more than --max-growth-kib after the first window or a pool grows
// after the first call; that is a leak or an allocation on the hot path.

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ringzero/ringzero.hpp"

#include "size_arg.hpp"

namespace rz = ringzero;
using ringzero::bench::parse_size;

namespace {

long resident_kib() {
  std::ifstream f("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  f >> pages_total >> pages_resident;
  return pages_resident * (sysconf(_SC_PAGESIZE) / 1024);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringzero-soak: steady-state memory and time over many back-to-back collectives"};
  int ranks = 2, calls = 10000, window = 1000;
  long max_growth_kib = 256;
  std::string bytes_text = "4K", json_path;
  app.add_option("--ranks", ranks, "ranks (threads)")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--calls", calls, "back-to-back all_reduce calls")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000000));
  app.add_option("--window", window, "calls per reported window")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000000));
  app.add_option("--bytes", bytes_text, "bytes per rank (suffix K, M)")->capture_default_str();
  app.add_option("--max-growth-kib", max_growth_kib, "allowed RSS growth after the first window")
      ->capture_default_str();
  app.add_option("--json", json_path, "write the windows to this JSON file");
  CLI11_PARSE(app, argc, argv);
  std::uint64_t bytes = 0;
  try {
    bytes = parse_size(bytes_text, "bytes");
  } catch (const CLI::Error& e) { return app.exit(e); }
  const std::uint64_t count = std::max<std::uint64_t>(1, bytes / sizeof(float));

  std::vector<double> window_median_us;
  std::vector<long> window_rss_kib;
  std::size_t growths_after_first = 0;
  std::mutex mutex;
  rz::local::launch(ranks, [&](rz::communicator& comm) {
    std::vector<float> send(count, 1.0f), recv(count, 0.0f);
    std::vector<double> times(static_cast<std::size_t>(window)), slowest(times.size());
    rz::all_reduce(comm, send.data(), recv.data(), count, rz::dtype::float32, rz::reduce_kind::sum);
    const std::size_t growths = comm.scratch_bytes();
    for (int done = 0; done < calls; done += window) {
      const int in_window = std::min(window, calls - done);
      auto last = std::chrono::steady_clock::now();
      for (int i = 0; i < in_window; ++i) {
        rz::all_reduce(comm, send.data(), recv.data(), count, rz::dtype::float32, rz::reduce_kind::sum);
        const auto now = std::chrono::steady_clock::now();
        times[static_cast<std::size_t>(i)] = std::chrono::duration<double, std::micro>(now - last).count();
        last = now;
      }
      rz::all_reduce(comm, times.data(), slowest.data(), static_cast<std::uint64_t>(in_window), rz::dtype::float64,
                     rz::reduce_kind::max);
      if (comm.rank() == 0) {
        std::vector<double> sorted(slowest.begin(), slowest.begin() + in_window);
        std::sort(sorted.begin(), sorted.end());
        window_median_us.push_back(sorted[sorted.size() / 2]);
        window_rss_kib.push_back(resident_kib());
      }
    }
    if (recv[0] != static_cast<float>(comm.world_size()))
      throw rz::error(rz::errc::internal, "wrong all_reduce result");
    std::lock_guard<std::mutex> lock(mutex);
    if (comm.scratch_bytes() != growths) ++growths_after_first;
  });

  fmt::print("# ringzero-soak: {} ranks, {} all_reduce calls of {} B (float32 sum), windows of {}\n", ranks, calls,
             count * sizeof(float), window);
  fmt::print("# {:>8}  {:>12}  {:>10}\n", "window", "median (us)", "RSS (KiB)");
  for (std::size_t i = 0; i < window_median_us.size(); ++i)
    fmt::print("  {:>8}  {:>12.3f}  {:>10}\n", i, window_median_us[i], window_rss_kib[i]);
  const long growth = window_rss_kib.empty() ? 0 : window_rss_kib.back() - window_rss_kib.front();
  const double first = window_median_us.empty() ? 0 : window_median_us.front();
  const double last = window_median_us.empty() ? 0 : window_median_us.back();
  fmt::print("# RSS growth after the first window: {} KiB; scratch pools grown after the first call: {}\n", growth,
             growths_after_first);
  fmt::print("# median of the last window / first window: {:.3f}\n", first > 0 ? last / first : 0.0);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << nlohmann::json{{"ranks", ranks},
                        {"calls", calls},
                        {"bytes", count * sizeof(float)},
                        {"window", window},
                        {"window_median_us", window_median_us},
                        {"window_rss_kib", window_rss_kib},
                        {"rss_growth_kib", growth},
                        {"pool_growths_after_first_call", growths_after_first}}
             .dump(2)
      << "\n";
  }
  return (growth > max_growth_kib || growths_after_first > 0) ? 1 : 0;
}
