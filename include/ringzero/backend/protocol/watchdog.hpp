#pragma once
/// @file
/// `watchdog`: the thread that ends work the caller's own thread cannot end, shared by the
/// backends whose calls cannot be interrupted (PyTorch's NCCL watchdog is the model). Every
/// `interval` it calls the backend's `tick` on its own thread: NCCL's looks at the events of
/// enqueued collectives and NCCL's asynchronous error and aborts the communicator; MPI's looks
/// at the deadline armed around a blocking call (`arm`, `disarm`, `expired`) and ends the job.
/// Cost on the hot path: two stores per armed call. `start` and `stop` are idempotent and
/// thread-safe; `arm` / `disarm` are called by the thread that makes the blocking call.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace ringzero::detail {

/// See the file comment. One per communicator; stopped before the state `tick` reads is gone.
class watchdog {
 public:
  watchdog() = default;
  watchdog(const watchdog&) = delete;
  watchdog& operator=(const watchdog&) = delete;
  ~watchdog() { stop(); }

  /// Starts the thread: every `interval` it calls `tick()` until `stop`. Does nothing when the
  /// thread runs already or was stopped.
  void start(std::chrono::milliseconds interval, std::function<void()> tick) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (thread_.joinable() || stop_) return;
    interval_ = interval;
    tick_ = std::move(tick);
    thread_ = std::thread([this] { run(); });
  }

  /// Stops the thread after its current tick (idempotent; never throws).
  void stop() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Arms the deadline of one blocking call; `context` (the caller's, valid until `disarm`)
  /// is what `expired` hands the tick.
  void arm(std::chrono::steady_clock::time_point deadline, const void* context) noexcept {
    context_.store(context, std::memory_order_relaxed);
    deadline_ns_.store(deadline.time_since_epoch().count(), std::memory_order_release);
  }
  /// Disarms it (the blocking call returned).
  void disarm() noexcept { deadline_ns_.store(disarmed, std::memory_order_release); }
  /// True when an armed deadline has passed; `context` is then the one `arm` was given.
  bool expired(const void*& context) const noexcept {
    const std::int64_t d = deadline_ns_.load(std::memory_order_acquire);
    if (d == disarmed || std::chrono::steady_clock::now().time_since_epoch().count() < d) return false;
    context = context_.load(std::memory_order_relaxed);
    return true;
  }

 private:
  static constexpr std::int64_t disarmed = INT64_MAX;

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, interval_, [&] { return stop_; });
      if (stop_) break;
      lock.unlock();
      tick_();
      lock.lock();
    }
  }

  std::chrono::milliseconds interval_{100};
  std::function<void()> tick_;
  std::atomic<std::int64_t> deadline_ns_{disarmed};
  std::atomic<const void*> context_{nullptr};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::thread thread_;
  bool stop_ = false;
};

}  // namespace ringzero::detail
