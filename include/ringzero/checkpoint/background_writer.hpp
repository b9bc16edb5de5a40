#pragma once
/// @file
/// `checkpoint::detail::background_writer`: one thread that runs an asynchronous save's write,
/// one task at a time. The thread is started by the first `start` and kept until destruction,
/// so that later saves hand it their task with a notification instead of creating a thread on
/// the training thread's time (tens of milliseconds on a loaded machine, and a new thread at the
/// caller's priority could preempt it before lowering its own). It runs at nice 19, below the
/// training threads. Thread semantics: `start` and `wait` from one owner thread; a task must not
/// throw. Errors: `start` throws std::system_error when the thread cannot be created.

#include <sys/resource.h>
#include <unistd.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace ringzero::checkpoint::detail {

/// See the file comment.
class background_writer {
 public:
  background_writer() = default;
  background_writer(const background_writer&) = delete;
  background_writer& operator=(const background_writer&) = delete;
  /// Runs a task still queued, then ends the thread.
  ~background_writer() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Hands `task` to the thread (started here the first time). Precondition: no task running
  /// (`wait()` returned since the last `start`).
  void start(std::function<void()> task) {
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      task_ = std::move(task);
      busy_ = true;
    }
    wake_.notify_all();
  }
  /// Blocks until the task handed by the last `start` has returned (at once when none).
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return !busy_; });
  }

 private:
  void loop() {
    // Below the training threads (nice 19): the state is copied, the write takes idle time only.
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stop_ || task_ != nullptr; });
        if (task_ == nullptr) return;
        task = std::exchange(task_, nullptr);
      }
      task();
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        busy_ = false;
      }
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::function<void()> task_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace ringzero::checkpoint::detail
