#pragma once
/// @file
/// `mpi::detail::watchdog`: ends the job when a blocking MPI call (a `native` collective) runs
/// past its deadline, since a blocking MPI call cannot be interrupted or timed out from inside.
/// The same idea as PyTorch's NCCL watchdog: a thread that compares the armed deadline with the
/// clock and, on expiry, reports and calls MPI_Abort.
///
/// Cost on the hot path: two relaxed-ordering stores per armed call (arm, disarm) and nothing
/// else; the thread wakes every `poll_interval` (or when disarmed for good) and starts on the
/// first `arm`.

#include "ringzero/backend/mpi/environment.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace ringzero::mpi::detail {

/// See the file comment. One per communicator; `arm` and `disarm` are called by the thread that
/// makes the blocking call.
class watchdog {
 public:
  /// How often the thread looks at the clock.
  static constexpr std::chrono::milliseconds poll_interval{100};
  /// Builds the report of an expired call from the `context` passed to `arm`.
  using describe_fn = std::function<std::string(const void* context)>;

  /// A watchdog that reports with `describe` and aborts `comm` with `exit_code`.
  watchdog(describe_fn describe, MPI_Comm comm, int exit_code)
      : describe_(std::move(describe)), comm_(comm), exit_code_(exit_code) {}
  watchdog(const watchdog&) = delete;
  watchdog& operator=(const watchdog&) = delete;
  ~watchdog() { stop(); }

  /// Arms the watchdog: if `disarm` is not called before `deadline`, writes
  /// `describe(context)` to stderr and calls MPI_Abort. `context` must stay valid until `disarm`.
  void arm(std::chrono::steady_clock::time_point deadline, const void* context) {
    if (!started_.load(std::memory_order_acquire)) start();
    context_.store(context, std::memory_order_relaxed);
    deadline_ns_.store(deadline.time_since_epoch().count(), std::memory_order_release);
  }

  /// Sets the communicator that MPI_Abort ends (before the first `arm`).
  void set_comm(MPI_Comm comm) noexcept { comm_ = comm; }

  /// Disarms it (the blocking call returned).
  void disarm() noexcept { deadline_ns_.store(disarmed, std::memory_order_release); }

  /// Stops the thread (idempotent).
  void stop() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  static constexpr std::int64_t disarmed = INT64_MAX;

  void start() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable() && !stop_) thread_ = std::thread([this] { run(); });
    started_.store(true, std::memory_order_release);
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, poll_interval);
      if (stop_) return;
      const std::int64_t d = deadline_ns_.load(std::memory_order_acquire);
      if (d == disarmed) continue;
      if (std::chrono::steady_clock::now().time_since_epoch().count() < d) continue;
      std::string message;
      try {
        message = describe_(context_.load(std::memory_order_relaxed));
      } catch (...) { message = "ringzero: a blocking MPI call timed out"; }
      std::fprintf(stderr, "%s\n", message.c_str());
      std::fflush(stderr);
      MPI_Abort(comm_, exit_code_);
      std::_Exit(exit_code_);  // MPI_Abort does not return; if it ever does, end the process anyway
    }
  }

  describe_fn describe_;
  MPI_Comm comm_;
  int exit_code_;
  std::atomic<std::int64_t> deadline_ns_{disarmed};
  std::atomic<const void*> context_{nullptr};
  std::atomic<bool> started_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::thread thread_;
  bool stop_ = false;
};

}  // namespace ringzero::mpi::detail
