#pragma once
/// @file
/// `ringzero::bench::background_load`: N busy threads at nice 10 while a benchmark runs
/// (`ringzero-bench --background-load N`), a reproducible stand-in for what shares a trainer's
/// cores in practice (its data loader, a logging thread, a neighbour's job). The threads are left
/// to the scheduler (not pinned) and touch only their own registers, so they compete for CPU
/// time, not for memory bandwidth or cache lines.
///
/// Errors: std::system_error when a thread cannot be started or cannot lower its own priority
/// (setpriority on its thread id, Linux's per-thread nice). Thread safety: construct and
/// destroy on one thread.

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace ringzero::bench {

class background_load {
 public:
  /// The nice value of every busy thread (the `nice -n 10` of a shell's background job).
  static constexpr int nice_value = 10;

  /// Starts `threads` busy threads (0: none) and returns once each runs at nice 10.
  explicit background_load(int threads) {
    workers_.reserve(static_cast<std::size_t>(threads));
    try {
      for (int t = 0; t < threads; ++t) workers_.emplace_back([this] { run(); });
    } catch (...) {  // a thread that cannot start: stop and join those that did, then report
      stop();
      throw;
    }
    while (started_.load(std::memory_order_acquire) < static_cast<int>(workers_.size())) std::this_thread::yield();
    if (const int e = failure_.load(); e != 0) {
      stop();
      throw std::system_error(
          e, std::generic_category(),
          "--background-load: cannot set a busy thread's nice value to " + std::to_string(nice_value));
    }
  }
  background_load(const background_load&) = delete;
  background_load& operator=(const background_load&) = delete;
  ~background_load() { stop(); }

  /// Number of busy threads running.
  int threads() const noexcept { return static_cast<int>(workers_.size()); }

 private:
  void run() noexcept {
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice_value) != 0) {
      int expected = 0;
      failure_.compare_exchange_strong(expected, errno);
    }
    started_.fetch_add(1, std::memory_order_release);
    unsigned x = 1;  // a linear congruential step: register work the compiler cannot drop
    while (!stop_.load(std::memory_order_relaxed))
      for (int i = 0; i < 4096; ++i) x = x * 1664525u + 1013904223u;
    sink_.fetch_add(x, std::memory_order_relaxed);
  }

  void stop() noexcept {
    stop_.store(true, std::memory_order_relaxed);
    for (auto& w : workers_)
      if (w.joinable()) w.join();
  }

  std::vector<std::thread> workers_;
  std::atomic<int> started_{0};
  std::atomic<int> failure_{0};
  std::atomic<bool> stop_{false};
  std::atomic<unsigned> sink_{0};
};

}  // namespace ringzero::bench
